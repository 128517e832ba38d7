"""Helpers for the FSDP learner tests: torchrun launches of real processes on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_TESTS = HERE.parent / "train"
if str(TRAIN_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAIN_TESTS))  # train_fixtures


def env() -> dict[str, str]:
    """The test environment, with tests/train importable (its fixtures name reward terms)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(TRAIN_TESTS), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"  # one thread per rank (2 ranks on 2 cores)
    return e


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env(), capture_output=True, text=True, timeout=timeout)


def update_report(nproc: int, out: Path) -> list[dict]:
    """Run fsdp_update_worker.py on `nproc` ranks; each rank's {case: report}."""
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                str(HERE / "fsdp_update_worker.py"), str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def train(config: str, *extra: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """`rlfactory train CONFIG ... --nproc N` (which starts torchrun)."""
    return run([sys.executable, "-m", "rlfactory.cli.main", "train", config, *extra, "--nproc", str(nproc)])


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(record: dict) -> dict:
    """A metrics record without timings (they differ between any two runs)."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "perf/", "system/", "wall_time"))}


def check_update_report(ranks: list[dict], world_size: int) -> None:
    """Each case's step on the FSDP learner equals the one-process step (weights, metrics, annotations)."""
    assert len(ranks) == world_size
    for report in ranks:
        for case, r in report.items():
            assert r["world_size"] == world_size, case
            assert r["weights_moved"] > 1e-3, case  # the step did train
            # Adam's first step is ~lr * sign(g): where g is ~0 float rounding shows most
            assert r["weight_diff"] < 1e-4, (case, r)
            assert r["missing_metrics"] == [], case
            assert abs(r["loss_single"] - r["loss_fsdp"]) < 1e-6, (case, r)
            assert max(r["metric_diff"].values()) < 1e-5, (case, r["metric_diff"])
            assert r["annotation_diff"] < 1e-5, (case, r)
