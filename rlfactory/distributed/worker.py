"""The rollout worker: a Ray actor that rolls out its share of each step.

Built by the same `open_rollout(cfg)` as in-process training, so its generator is whatever the
config asks for: the embedded LocalGenerator on its own copy of the policy, or, with
`generator.backend: server`, a ServerGenerator on the configured generation servers (no model
here). Its ToolRunner has the config's and the env's tools: Python tools run here, MCP servers are
reached through a tool-pool actor (tool_pool.py). An embedded worker holds one policy version at a
time: `load_weights` replaces the weights in place and sets the version its model segments record.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from rlfactory.config import SamplingConfig
from rlfactory.imports import import_ref
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.weights import load_weights
from rlfactory.trajectory import Trajectory

if TYPE_CHECKING:
    import numpy as np
    from ray.actor import ActorHandle

    from rlfactory.config import RunConfig
    from rlfactory.distributed.tool_pool import ToolPool
    from rlfactory.distributed.weights import Bf16Bits, WireState
    from rlfactory.train.session import RolloutSession


class StaleWorker(RuntimeError):
    """A worker was asked to roll out a policy version it does not hold."""


def load_state(model: torch.nn.Module, state: Mapping[str, np.ndarray | Bf16Bits | torch.Tensor]) -> None:
    """Copy `state` (name -> tensor or numpy array, see weights.policy_state) into `model`'s
    parameters in place. Every parameter must be given, and nothing else (WeightsMismatch)."""
    from rlfactory.distributed.weights import from_wire

    load_weights(model, {name: from_wire(value) for name, value in state.items()}, "the worker's model")


class RolloutWorker:
    """Ray actor body (made remote by workers.WorkerSet). Methods are async: one event loop runs
    the engine, the generator's worker and the tool calls."""

    def __init__(self, cfg: RunConfig, index: int, pool: ActorHandle[ToolPool], sys_path: list[str] | None = None,
                 logits_processor: str | None = None, load_policy: bool = True) -> None:
        for entry in reversed(sys_path or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.cfg, self.index, self.pool = cfg, index, pool
        self.logits_processor = logits_processor
        self.load_policy = load_policy
        self.version = 0
        self.last_rollout_s = 0.0
        self.session: RolloutSession | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self, weights: WireState | None = None, version: int = 0) -> dict[str, Any]:
        """Build the rollout session (model, tokenizer, env, tools through the pool) and load
        `weights` as `version` when given. Returns {"pid", "tools"}."""
        from rlfactory.distributed.tool_pool import pool_connector
        from rlfactory.train.session import open_rollout

        self.session = await self._stack.enter_async_context(
            open_rollout(self.cfg, connect_server=pool_connector(self.pool), load_policy=self.load_policy))
        if self.logits_processor:
            if not isinstance(self.session.generator, LocalGenerator):
                raise ValueError("a logits_processor needs generator.backend: local")
            factory = import_ref(self.logits_processor, "logits_processor", "function")
            self.session.generator.logits_processor = factory(self.session.tokenizer)
        if weights is not None:
            await self.load_weights(weights, version)
        return {"pid": os.getpid(), "tools": [s.name for s in self.session.runner.specs()]}

    async def load_weights(self, weights: WireState, version: int) -> int:
        """Load the policy's weights (the object-store copy the driver put) as `version`."""
        if self.session.model is None:
            raise RuntimeError(f"rollout worker {self.index} holds no model (its generator is a server)")
        load_state(self.session.model, weights)
        self.version = int(version)
        return self.version

    async def rollout(self, rows: list[dict[str, Any]], n: int, version: int, seeds: list[int] | None,
                      sampling: SamplingConfig) -> list[Trajectory]:
        """`engine.run(rows, n, seeds=seeds)` with `sampling`; model segments record the version
        held here, which must be `version` (a worker whose generator is a server holds no weights:
        the servers hold `version` and report it)."""
        if self.session.model is None:
            self.version = version
        if version != self.version:
            raise StaleWorker(f"rollout worker {self.index} holds policy version {self.version}, asked for {version}")
        engine = self.session.engine
        engine.sampling = sampling
        t0 = time.perf_counter()
        try:
            return await engine.run(rows, n, policy_version=self.version, seeds=seeds)
        finally:
            self.last_rollout_s = time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        """{"pid", "version", "last_rollout_s": seconds in the engine for the last rollout,
        "generator": the generator's counters (decode steps, busy seconds, ...)}."""
        generator = self.session.generator if self.session is not None else None
        gen = dict(generator.stats) if isinstance(generator, LocalGenerator) else {}
        return {"pid": os.getpid(), "version": self.version, "last_rollout_s": self.last_rollout_s, "generator": gen}

    async def close(self) -> None:
        await self._stack.aclose()
