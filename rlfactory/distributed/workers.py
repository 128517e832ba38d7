"""The driver's view of the rollout workers: start them, give them weights, replace the dead.

Worker i calls tool pool i mod len(pools). A worker that dies (its process is killed, its node
is lost) is replaced by a new actor at the same index, which starts from the last weights
pushed, with their version; the caller decides what happens to the work it was doing
(engine.py re-runs it or ends it `infra_error`).
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from rlfactory.distributed.cluster import actor_died_errors, end_actors
from rlfactory.distributed.worker import RolloutWorker

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rlfactory.config import RunConfig
    from rlfactory.distributed.tool_pool import ToolPool
    from rlfactory.distributed.weights import WireState


class WorkerStartError(RuntimeError):
    """A rollout worker could not start (bad model path, a tool server that does not start, ...)."""


class WorkerSet:
    """`cfg.ray.rollout_workers` RolloutWorker actors (see the module doc)."""

    def __init__(self, cfg: RunConfig, pools: list[ActorHandle[ToolPool]], sys_path: list[str],
                 logits_processor: str | None = None,
                 load_policy: bool = True) -> None:
        self.cfg, self.pools, self.sys_path = cfg, pools, sys_path
        self.logits_processor = logits_processor
        self.load_policy = load_policy
        rc = cfg.ray
        self.count = rc.rollout_workers
        self.actors: list[ActorHandle[RolloutWorker] | None] = [None] * self.count
        self.pids: list[int | None] = [None] * self.count
        self.replacements = 0
        self.weights: tuple[ObjectRef[WireState], int] | None = None  # (object ref, version) of the last push
        self._locks = [asyncio.Lock() for _ in range(self.count)]
        self._actor_class = None

    def __len__(self) -> int:
        return self.count

    async def start(self) -> None:
        """Start every worker (at once); raises WorkerStartError naming the first that failed."""
        import ray

        rc = self.cfg.ray
        have = ray.cluster_resources()
        for what, each in (("CPU", rc.worker_cpus), ("GPU", rc.worker_gpus)):
            if each * self.count > have.get(what, 0.0) + 1e-9:
                print(f"rlfactory: {self.count} rollout workers x ray.worker_{what.lower()}s={each:g} need "
                      f"{each * self.count:g} {what}s; the cluster has {have.get(what, 0.0):g}: workers wait until "
                      f"the cluster grows (ray.worker_start_timeout_s={rc.worker_start_timeout_s:g})",
                      file=sys.stderr, flush=True)
        await asyncio.gather(*(self._start(i) for i in range(self.count)))

    def actor(self, index: int) -> ActorHandle[RolloutWorker]:
        actor = self.actors[index]
        if actor is None:
            raise RuntimeError(f"rollout worker {index} is not running (the WorkerSet was not started, or is closed)")
        return actor

    async def replace(self, index: int, dead: ActorHandle[RolloutWorker],
                      reason: str) -> ActorHandle[RolloutWorker] | None:
        """Replace worker `index` if it is still the actor `dead`; returns the live actor (None when
        the set was closed meanwhile)."""
        async with self._locks[index]:
            if self.actors[index] is not dead:
                return self.actors[index]  # another caller replaced it already
            print(f"rlfactory: rollout worker {index} (pid {self.pids[index]}) is gone ({reason}); "
                  "starting a replacement", file=sys.stderr, flush=True)
            _kill(dead)
            self.replacements += 1
            return await self._start_locked(index)

    async def load_weights(self, ref: ObjectRef[WireState], version: int) -> None:
        """Every worker loads the weights `ref` as `version`; a worker that died meanwhile is
        replaced (and its replacement starts from these weights)."""
        self.weights = (ref, version)

        async def one(i: int) -> None:
            actor = self.actor(i)
            try:
                await actor.load_weights.remote(ref, version)
            except actor_died_errors() as e:
                await self.replace(i, actor, f"died while loading weights: {type(e).__name__}")

        await asyncio.gather(*(one(i) for i in range(self.count)))

    async def close(self, timeout_s: float = 30.0) -> None:
        """Close every worker's session (its tools, its generator), then end the actors."""
        live = [a for a in self.actors if a is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*(a.close.remote() for a in live), return_exceptions=True), timeout_s)
        except TimeoutError:
            pass
        await end_actors(live)
        self.actors = [None] * self.count

    # ---- starting ---------------------------------------------------------------------------

    async def _start(self, index: int) -> ActorHandle[RolloutWorker]:
        async with self._locks[index]:
            return await self._start_locked(index)

    async def _start_locked(self, index: int) -> ActorHandle[RolloutWorker]:
        import ray

        rc = self.cfg.ray
        if self._actor_class is None:
            self._actor_class = ray.remote(RolloutWorker).options(
                num_cpus=rc.worker_cpus, num_gpus=rc.worker_gpus, max_restarts=0, max_task_retries=0,
                max_concurrency=1000)
        actor = self._actor_class.remote(self.cfg, index, self.pools[index % len(self.pools)], self.sys_path,
                                         self.logits_processor, self.load_policy)
        weights, version = self.weights if self.weights is not None else (None, 0)
        try:
            info = await asyncio.wait_for(actor.start.remote(weights, version), rc.worker_start_timeout_s)
        except TimeoutError:
            _kill(actor)
            raise WorkerStartError(f"rollout worker {index} did not start within ray.worker_start_timeout_s="
                                   f"{rc.worker_start_timeout_s:g}s (is the cluster out of CPUs for "
                                   f"ray.worker_cpus={rc.worker_cpus:g}?)") from None
        except Exception as e:
            _kill(actor)
            raise WorkerStartError(f"rollout worker {index} failed to start: {_cause(e)}") from e
        self.actors[index], self.pids[index] = actor, info["pid"]
        return actor


def _kill(actor: ActorHandle[RolloutWorker]) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass


def _cause(e: BaseException) -> str:
    """The worker-side exception of a Ray task error, in one line."""
    from ray.exceptions import RayTaskError

    cause = (e.cause if isinstance(e, RayTaskError) else None) or e
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
