"""The FSDP2 learner on GPUs with NCCL (one rank per GPU, up to 2; with one GPU world size 1 still
runs the NCCL + fully_shard path). Skipped without CUDA.

Run: python -m pytest -q tests/distributed/test_distributed_fsdp_gpu.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fsdp_launch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _nproc() -> int:
    return min(2, torch.cuda.device_count())


# The learner is under test, not the code env's sandbox: GPU machines often lack bubblewrap.
ENV = {"name": "python", "options": {"sandbox": "strict" if shutil.which("bwrap") else "weak"}}


def test_fsdp_gpu_step_equals_the_one_process_step(tmp_path):
    ranks = fsdp_launch.update_report(_nproc(), tmp_path / "report.json")
    assert all(r["backend"] == "nccl" for report in ranks for r in report.values())
    fsdp_launch.check_update_report(ranks, world_size=_nproc())


def test_fsdp_gpu_training_checkpoints_and_resumes_exactly(tmp_path):
    from train_fixtures import run_config

    n = _nproc()
    extra = {"trainer": {"prompts_per_step": 2}, "model": {"path": "tiny:1m", "device": "auto"},
             "fsdp": {"mixed_precision": False}, "env": ENV}
    whole = run_config(tmp_path, "whole", **extra)
    proc = fsdp_launch.train(whole, nproc=n)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"FSDP2 learner on {n} rank(s), backend nccl" in proc.stderr
    records = fsdp_launch.metrics(tmp_path / "whole")
    meta = json.loads((tmp_path / "whole" / "checkpoints" / "step_000002" / "meta.json").read_text())
    assert meta["world_size"] == n and meta["sharded"] is True
    split = run_config(tmp_path, "split", **extra)
    assert fsdp_launch.train(split, "trainer.steps=1", nproc=n).returncode == 0
    proc = fsdp_launch.train(split, "--resume", nproc=n)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = fsdp_launch.metrics(tmp_path / "split")
    # CUDA kernels may round differently between runs; the same steps give the same numbers closely
    assert [r["step"] for r in resumed] == [r["step"] for r in records]
    for got, want in zip(resumed, records):  # (pytest.approx compares dicts of numbers, not lists of them)
        assert fsdp_launch.comparable(got) == pytest.approx(fsdp_launch.comparable(want), rel=1e-3, abs=1e-4)


def test_fsdp_gpu_bf16_mixed_precision_trains(tmp_path):
    from train_fixtures import run_config

    cfg = run_config(tmp_path, "bf16", model={"path": "tiny:1m", "device": "auto"},
                     fsdp={"mixed_precision": True}, trainer={"save_every": 0}, env=ENV)
    proc = fsdp_launch.train(cfg, "trainer.steps=1", nproc=_nproc())
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = fsdp_launch.metrics(tmp_path / "bf16")
    assert record["optim/updates"] == 1.0 and record["loss/total"] == record["loss/total"]  # finite, not NaN
