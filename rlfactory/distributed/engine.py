"""RayRolloutEngine: `RolloutEngine.run` over Ray rollout workers.

A step's rows are split into contiguous shards, one per worker, by row (so a row's n
trajectories, its group, stay on one worker), as evenly as the rows allow; each worker rolls its
shard out with its own engine (async or lock-step, as configured) and the trajectories come back
in row order, named as one in-process engine would name them. With per-row seeds (the trainer
passes them) every trajectory samples the same tokens as in one process: a turn's draws depend
on its seed and logits only (rlfactory/generation/sampling.py).

A worker that dies mid-step is replaced (workers.py) and its shard rolled out again on the
replacement, up to `ray.shard_retries` times; after that the shard's trajectories end
`infra_error` (not scored, out of the loss and of their group's baseline) and the step goes on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Sequence

from rlfactory.distributed.cluster import actor_died_errors
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import group_names
from rlfactory.trajectory import Trajectory

if TYPE_CHECKING:
    from rlfactory.distributed.workers import WorkerSet
    from rlfactory.envs.base import Env


def split_rows(rows: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) shards of `rows` rows over `workers`, sizes differing by at most
    one, larger first; empty shards for workers beyond the rows."""
    base, extra = divmod(rows, workers)
    out, start = [], 0
    for w in range(workers):
        stop = start + base + (1 if w < extra else 0)
        out.append((start, stop))
        start = stop
    return out


class RayRolloutEngine:
    """Rolls out on `workers` (a WorkerSet); same `run` contract as RolloutEngine. `env` (the
    driver's) gives the `info` of trajectories that could not be rolled out."""

    def __init__(self, workers: WorkerSet, rollout: RolloutConfig, sampling: SamplingConfig, env: Env,
                 shard_retries: int = 1) -> None:
        self.workers = workers
        self.rollout = rollout
        self.sampling = sampling
        self.env = env
        self.shard_retries = shard_retries
        self.reruns = 0
        """Shards rolled out again after their worker died (since the engine was made)."""

    async def run(self, rows: list[dict[str, Any]], n: int, policy_version: int = 0, *,
                  seeds: Sequence[int] | None = None, priority: int = 0) -> list[Trajectory]:
        """n trajectories per row, row-major, as RolloutEngine.run (see the module doc). `priority`
        is not sent on: the workers serve one rollout at a time (trainer.max_staleness >= 1 needs
        the in-process backend)."""
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"RayRolloutEngine.run: {len(seeds)} seeds for {len(rows)} rows")
        shards = [(w, a, b) for w, (a, b) in enumerate(split_rows(len(rows), len(self.workers))) if b > a]
        names = group_names(rows)  # named over the whole call, as one engine would: a row met twice gets `#2`
        outs = await asyncio.gather(*(
            self._shard(w, rows[a:b], names[a:b], n, policy_version, list(seeds[a:b]) if seeds is not None else None)
            for w, a, b in shards))
        trajs: list[Trajectory] = []
        for (w, a, b), out in zip(shards, outs):
            if len(out) != (b - a) * n:
                raise RuntimeError(f"rollout worker {w} returned {len(out)} trajectories for {b - a} rows x {n}")
            for j, traj in enumerate(out):
                group = names[a + j // n]
                traj.group, traj.id = group, f"{group}-{j % n}"
                trajs.append(traj)
        return trajs

    async def _shard(self, w: int, rows: list[dict[str, Any]], groups: list[str], n: int, version: int,
                     seeds: list[int] | None) -> list[Trajectory]:
        reason = ""
        for attempt in range(1 + self.shard_retries):
            actor = self.workers.actor(w)
            try:
                return await actor.rollout.remote(rows, n, version, seeds, self.sampling)
            except actor_died_errors() as e:
                reason = f"rollout worker {w} died mid-rollout ({type(e).__name__})"
                await self.workers.replace(w, actor, reason)
                if attempt < self.shard_retries:
                    self.reruns += 1
        return [self._lost(row, group, k, reason) for row, group in zip(rows, groups) for k in range(n)]

    def _lost(self, row: dict[str, Any], group: str, k: int, reason: str) -> Trajectory:
        return Trajectory(id=f"{group}-{k}", group=group, info=dict(self.env.info(row)), status="infra_error",
                          error=f"{reason}; not re-run (ray.shard_retries={self.shard_retries})")
