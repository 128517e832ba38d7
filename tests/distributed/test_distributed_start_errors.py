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
    # rlfactory's own lines (the driver's model load may draw transformers' "Loading weights" bar first)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("rlfactory")]
    assert "rlfactory: 2 rollout workers x ray.worker_cpus=64 need 128 CPUs; the cluster has" in err[0]
    assert err[-1] == ("rlfactory train: rollout worker 0 did not start within ray.worker_start_timeout_s=3s "
                       "(is the cluster out of CPUs for ray.worker_cpus=64?)")
    assert not list((tmp_path / "run").glob("checkpoints/*"))


def test_a_worker_that_raises_while_starting_is_named_with_its_own_error(ray_cluster, tmp_path):
    """The line names the worker-side exception (ConfigError), not Ray's wrapper of it
    (RayTaskError(ConfigError)), and its message."""
    import asyncio

    from ray_fixtures import gate_config

    from rlfactory.distributed import open_ray_rollout
    from rlfactory.distributed.workers import WorkerStartError

    cfg = gate_config(tmp_path / "gate", rollout_workers=1)

    async def go() -> None:
        async with open_ray_rollout(cfg, logits_processor="ray_fixtures:no_such_factory"):
            pass

    with pytest.raises(WorkerStartError) as e:
        asyncio.run(go())
    assert str(e.value).startswith("rollout worker 0 failed to start: ConfigError: logits_processor: "), str(e.value)
    assert "no_such_factory" in str(e.value)
