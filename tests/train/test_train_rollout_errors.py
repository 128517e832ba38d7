"""A rollout that raises (a bug in the engine, the generator or an env hook) does not abort the
training step: its trajectories are infra_error, out of the loss, with a logged error; three such
steps in a row stop the run with that error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlfactory.rewards.rule import RuleReward
from rlfactory.train.step import MAX_FAILED_ROLLOUTS
from train_fixtures import fixed_trainer, make_traj


class FlakyEngine:
    """Unit-test stand-in for the rollout engine: raises on the steps in `broken`, else returns
    hand-built trajectories (one group per row)."""

    def __init__(self, broken: set[int]) -> None:
        self.broken, self.calls, self.sampling = broken, 0, None

    async def run(self, rows, n, policy_version=0, *, seeds=None, priority=0):
        self.calls += 1
        if priority in self.broken:  # the trainer rolls step s out at priority s
            raise RuntimeError(f"an env hook returned 'bogus' at step {priority}")
        trajs = [make_traj([("prompt", [1, 2]), ("model", [3 + j, 4])], f"r{i}", f"r{i}-{j}")
                 for i in range(len(rows)) for j in range(n)]
        for t in trajs:
            t.segments[1].policy_version = policy_version
        return trajs


def test_a_rollout_that_raises_costs_its_step_only_then_stops_the_run(tmp_path, caplog):
    engine = FlakyEngine(broken={1, 3, 4, 5})
    trainer = fixed_trainer(tmp_path, engine, RuleReward({"train_fixtures:first_token_even": 1.0}),
                            rows=[{"id": "a"}, {"id": "b"}])

    with caplog.at_level(logging.ERROR, logger="rlfactory.train"):
        metrics, trajs = asyncio.run(trainer.step(1))
    assert sorted(t.id for t in trajs) == ["a-0", "a-1", "b-0", "b-1"]  # named as the rows' own would be
    assert all(t.status == "infra_error" and t.reward is None for t in trajs)
    assert trajs[0].error == "the rollout raised RuntimeError: an env hook returned 'bogus' at step 1"
    assert metrics["status/infra_error"] == 4 and metrics["batch/kept"] == 0
    (record,) = caplog.records
    assert record.levelname == "ERROR" and record.exc_info is not None
    assert record.getMessage().startswith("step 1: the rollout raised RuntimeError: an env hook returned 'bogus'")

    metrics, trajs = asyncio.run(trainer.step(2))  # the next step trains as usual
    assert metrics["batch/kept"] == 4 and all(t.reward is not None for t in trajs)

    for step in range(3, 3 + MAX_FAILED_ROLLOUTS - 1):
        metrics, _ = asyncio.run(trainer.step(step))
        assert metrics["status/infra_error"] == 4
    with pytest.raises(RuntimeError, match="'bogus' at step 5"):  # a broken rollout, not an unlucky one
        asyncio.run(trainer.step(3 + MAX_FAILED_ROLLOUTS - 1))
