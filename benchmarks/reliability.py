"""Reliability figures: what was tried against rlfactory and what held, from the project's own probes.

    .venv/bin/python benchmarks/reliability.py [--fuzz 10000] [--kills 2] [--seed 0]

Runs, at a small size, and prints one table row each:
- the tool-call parsing fuzzer of benchmarks/parse_fuzz.py (`--fuzz` inputs per family: mutated
  turns and adversarial shapes); held = parsed without an exception;
- the hostile-input, hostile-server, shutdown and sandbox test files named in ROWS, in one pytest
  run (files that do not exist in this checkout are listed as missing); tried = pytest cases,
  held = cases passed;
- `rlfactory train` (tiny:1m, the python env, 2 steps, a checkpoint each step) killed with SIGKILL
  at `--kills` moments drawn uniformly over an uninterrupted run's wall time after its set-up (from
  when it has written its config.yaml to its end), then run again with
  `--resume --restart`; held = its metrics.jsonl equals the uninterrupted run's (wall-clock fields
  aside) and every step's trajectories are there.
Exit status 0 when everything held. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

# (what was tried, test files (globs, relative to the repository))
ROWS = [
    ("hostile text into tokens, tools and rewards (lone surrogates, NUL, invalid UTF-8, deep nesting, "
     "recursive $ref, calls per turn)", ["tests/*/test_*hostile_text*.py"]),
    ("MCP servers that misbehave (hang, crash, garbage, floods, slow or failed start, a broken pool copy, "
     "oversized, deep or non-UTF-8 answers, frozen) and protocol edge cases",
     ["tests/tools/test_tools_faults.py", "tests/tools/test_tools_stdio_session.py",
      "tests/tools/test_tools_unresponsive.py"]),
    ("shutdown leaves no process (normal exit, an exception, SIGINT, setsid grandchildren)",
     ["tests/tools/test_tools_shutdown.py"]),
    ("the strict sandbox: escape attempts (kill or read the trainer, host files and writes, setsid daemons, "
     "network, fork bomb, disk) and its other limits", ["tests/envs/test_envs_sandbox.py"]),
    ("sandbox limits in aggregate (6 x 400 MB forks) and the weak mode (read-only files, leftovers)",
     ["tests/envs/test_envs_sandbox_limits.py"]),
]
TIMING = ("time/", "perf/", "system/", "wall_time")  # what the clock and the machine decide
TRAIN_CONFIG = """model: {{path: "tiny:1m"}}
env: {{name: python}}
reward: {{terms: {{numeric: 1.0}}}}
rollout: {{max_turns: 2, max_new_tokens: 12, max_total_tokens: 640, mode: lockstep}}
algo: {{group_size: 2}}
trainer: {{steps: {steps}, prompts_per_step: 2, lr: 0.001, run_dir: {run_dir}, save_every: 1, progress: false, seed: 0}}
"""


@dataclass
class Row:
    what: str
    tried: str
    held: str
    ok: bool
    seconds: float
    notes: list[str]
    source: str = ""  # where the row's figures come from


def fuzz_row(n: int, seed: int) -> Row:
    import parse_fuzz

    t0 = time.monotonic()
    managers = parse_fuzz.make_managers()
    inputs = exceptions = 0
    slowest, notes = 0.0, []
    for family, manager in managers.items():
        r = parse_fuzz.fuzz_family(family, manager, n, seed)
        inputs, exceptions = inputs + r.inputs, exceptions + r.exceptions
        slowest = max(slowest, r.slowest_no_gc_ms)
        notes += r.first_exceptions
    return Row(f"tool-call parsing fuzz ({', '.join(managers)})", f"{inputs:,} inputs",
               f"{inputs - exceptions:,} parsed, {exceptions} exceptions; slowest {slowest:.1f} ms CPU (GC aside)",
               exceptions == 0, time.monotonic() - t0, notes, f"benchmarks/parse_fuzz.py, {n:,} inputs per family")


def pytest_rows(tmp: Path) -> tuple[list[Row], float]:
    """Every ROWS file in one pytest run; each row counts its own files' cases."""
    files = {what: sorted({f for pattern in patterns for f in glob.glob(str(ROOT / pattern))})
             for what, patterns in ROWS}
    every = sorted({f for fs in files.values() for f in fs})
    report = tmp / "junit.xml"
    t0 = time.monotonic()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *every],
                   cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.monotonic() - t0
    cases: dict[str, list[tuple[str, str, float]]] = {}  # module file -> [(case, outcome, seconds)]
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        path = str(ROOT / (case.get("classname", "").replace(".", "/") + ".py"))
        cases.setdefault(path, []).append((case.get("name", ""), outcome, float(case.get("time", 0))))
    rows = []
    for what, patterns in ROWS:
        found = [c for f in files[what] for c in cases.get(f, [])]
        passed = sum(o == "passed" for _, o, _ in found)
        skipped = [n for n, o, _ in found if o == "skipped"]
        failed = [n for n, o, _ in found if o in ("failure", "error")]
        names = ", ".join(os.path.relpath(f, ROOT) for f in files[what]) or f"missing: {', '.join(patterns)}"
        held = f"{passed} passed" + (f", {len(failed)} FAILED" if failed else "") + (
            f", {len(skipped)} skipped" if skipped else "")
        rows.append(Row(what, f"{len(found)} cases", held, bool(found) and not failed, sum(t for _, _, t in found),
                        [f"failed: {n}" for n in failed] + [f"skipped: {n}" for n in skipped], names))
    return rows, seconds


def _train(cfg: Path, *extra: str) -> subprocess.Popen:
    """`rlfactory train CFG ...`, its stderr into CFG.log (a pipe nobody reads while polling could fill)."""
    with open(cfg.with_suffix(".log"), "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "train", str(cfg), *extra], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=log)


def _log_tail(cfg: Path) -> str:
    return cfg.with_suffix(".log").read_text(errors="replace")[-300:]


def _outcome(run_dir: Path) -> tuple[list[dict], list[str]]:
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    trajs = sorted(p.name for p in (run_dir / "trajectories").glob("*.jsonl"))  # none: an empty list
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records], trajs


def kill_row(kills: int, seed: int, tmp: Path, steps: int = 2) -> Row:
    t0 = time.monotonic()
    cfg = tmp / "full.yaml"
    cfg.write_text(TRAIN_CONFIG.format(steps=steps, run_dir=tmp / "full"))
    start, setup = time.monotonic(), None
    proc = _train(cfg)
    while proc.poll() is None:  # when the run has set up (written its config.yaml): moments are drawn after
        if setup is None and (tmp / "full" / "config.yaml").exists():
            setup = time.monotonic() - start
        time.sleep(0.05)
    whole = time.monotonic() - start
    setup = whole if setup is None else setup
    if proc.returncode != 0:
        return Row("kill -9 of rlfactory train", "the uninterrupted run failed", _log_tail(cfg), False, whole, [])
    expected = _outcome(tmp / "full")
    rng = random.Random(seed)
    notes, held = [], 0
    for k in range(kills):
        run_dir = tmp / f"cut{k}"
        cut = tmp / f"cut{k}.yaml"
        cut.write_text(TRAIN_CONFIG.format(steps=steps, run_dir=run_dir))
        moment = rng.uniform(setup, whole)
        proc = _train(cut)
        try:
            proc.wait(moment)
            state = "it had already finished"
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            ckpts = len(list((run_dir / "checkpoints").glob("step_*"))) if (run_dir / "checkpoints").exists() else 0
            state = f"{ckpts} checkpoint(s) on disk"
        resumed = _train(cut, "--resume", "--restart")
        resumed.wait()
        same = resumed.returncode == 0 and _outcome(run_dir) == expected
        held += same
        notes.append(f"killed at {moment:.1f} s of {whole:.1f} s, set-up {setup:.1f} s ({state}): resumed "
                     + ("with identical metrics and trajectories" if same
                        else f"DIFFERENTLY (exit {resumed.returncode}) {_log_tail(cut)}"))
    return Row("kill -9 of `rlfactory train` at a random moment, then `--resume`", f"{kills} moments",
               f"{held} resumed bit-exact", held == kills, time.monotonic() - t0, notes,
               f"this script: tiny:1m, the python env, {steps} steps, a checkpoint each step; seed {seed}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fuzz", type=int, default=10_000, help="parse fuzz inputs per family")
    ap.add_argument("--kills", type=int, default=2, help="kill -9 moments")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, commit {commit.strip() or '?'}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory(prefix="rlf-reliability-") as d:
        tests, pytest_s = pytest_rows(Path(d))
        rows = [fuzz_row(args.fuzz, args.seed), *tests, kill_row(args.kills, args.seed, Path(d))]
    print("\n| what was tried | tried | held | s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r.what} | {r.tried} | {r.held}{'' if r.ok else ' **(not held)**'} | {r.seconds:.0f} |")
    print(f"\n(s: seconds of that row; the test rows ran in one pytest run of {pytest_s:.0f} s wall clock)")
    for r in rows:
        print(f"- {r.what.split(' (')[0]}: {r.source}")
        for note in r.notes:
            print(f"    {note}")
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (other work on this machine shares the CPUs)")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
