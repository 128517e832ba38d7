"""A Ray run whose rollout workers cannot start stops with one line naming the setting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlfactory.cli.main import main

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"
if str(TRAIN_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAIN_TESTS))

from train_fixtures import run_config  # noqa: E402

pytestmark = pytest.mark.slow


def test_workers_that_do_not_fit_the_cluster_are_reported_in_one_line(ray_cluster, tmp_path, capsys):
    cfg = run_config(tmp_path, trainer={"backend": "ray"},
                     ray={"rollout_workers": 2, "worker_cpus": 64, "worker_start_timeout_s": 3})
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "rlfactory: 2 rollout workers x ray.worker_cpus=64 need 128 CPUs; the cluster has" in err[0]
    assert err[-1] == ("rlfactory train: rollout worker 0 did not start within ray.worker_start_timeout_s=3s "
                       "(is the cluster out of CPUs for ray.worker_cpus=64?)")
    assert not list((tmp_path / "run").glob("checkpoints/*"))
