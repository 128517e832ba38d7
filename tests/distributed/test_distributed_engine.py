"""RayRolloutEngine's naming and sharding, with stand-in workers (the real Ray path is covered by
test_distributed_train_on_cpu.py, which compares a Ray run with the in-process trainer)."""

from __future__ import annotations

import asyncio
from typing import Any

from rlfactory.distributed.engine import RayRolloutEngine
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import group_names
from rlfactory.trajectory import Trajectory


class _Rollout:
    def __init__(self, calls: list[list[str]]) -> None:
        self.calls = calls

    async def remote(self, rows: list[dict[str, Any]], n: int, version: int, seeds: Any, sampling: Any) -> list[Trajectory]:
        self.calls.append([str(r["id"]) for r in rows])
        # a worker's own engine names its shard on its own: a repeat across shards is invisible to it
        return [Trajectory(id=f"{g}-{k}", group=g, info={}) for g in group_names(rows) for k in range(n)]


class _Actor:
    def __init__(self, calls: list[list[str]]) -> None:
        self.rollout = _Rollout(calls)


class _Workers:
    def __init__(self, count: int) -> None:
        self.calls: list[list[str]] = []
        self._actors = [_Actor(self.calls) for _ in range(count)]

    def __len__(self) -> int:
        return len(self._actors)

    def actor(self, w: int) -> _Actor:
        return self._actors[w]


class _Env:
    def info(self, row: dict[str, Any]) -> dict[str, Any]:
        return dict(row)


def test_a_row_met_twice_in_a_step_gets_its_own_group_as_in_process():
    # a step that wraps its dataset: row r0 comes back as the 3rd row, on the other worker
    rows = [{"id": "r0"}, {"id": "r1"}, {"id": "r0"}, {"id": "r2"}]
    workers = _Workers(2)
    engine = RayRolloutEngine(workers, RolloutConfig(), SamplingConfig(), _Env())
    trajs = asyncio.run(engine.run(rows, 2))
    assert workers.calls == [["r0", "r1"], ["r0", "r2"]]
    assert [t.group for t in trajs] == ["r0", "r0", "r1", "r1", "r0#2", "r0#2", "r2", "r2"]
    assert [t.group for t in trajs[::2]] == group_names(rows)
    assert len({t.id for t in trajs}) == len(trajs)
