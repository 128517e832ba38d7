"""Asynchronous, off-policy training (`trainer.max_staleness: k`): the rollouts of the next k
steps run while the learner trains the current one.

Step s (1-based) is rolled out once the learner holds version >= s-1-k, i.e. its rollout starts
when step s-k begins to train, so generation, tool calls and scoring of steps s+1..s+k overlap
the update of step s (which runs in a thread of its own, off the event loop). An empty pipeline
(the first step, or after a resume) starts the rollouts of steps s..s+k at once, as the version
it holds allows: nothing trains before the first one is done, and that rollout mostly waits for
its tools, so the next ones generate in its idle time instead of beside the first update.
Where the gain comes from: the learner no longer waits for the slowest trajectory of each step (a
long tool call), and the rollout no longer waits for the update.

Versions. The learner's weights after step s are version s. Generation never reads weights that
the optimizer is writing:
  local generator   it samples from its own copy of the policy (`LocalWeightSync`); after each
                    update the trainable weights are snapshot (while the learner is idle) and
                    loaded into the copy between turns (rlfactory/generation/versioned.py), so every
                    model segment comes from one version and records it.
  server backend    the weight sync pushes each version after the update, before the next update
                    starts, and each server reports the version of every turn (weight_sync.py).
A trajectory whose turns span an update keeps each segment's own version (a partial rollout).

Staleness. Training step s trains version s-1; a model segment sampled by version v is s-1-v
versions stale. A trajectory is trained on only if every model segment is at most k stale; the
others are dropped (staleness.py; `async/dropped_stale`; with this schedule that happens only when a generator
lags, e.g. a server whose weight sync failed). The loss corrects for the sampling policy with the
sampler's logprobs (algo.tis_cap; rlfactory/algos/losses.py `truncated_is_weights`).

Resume. Checkpoints hold the learner (weights, optimizer, step, RNG), not the rollouts in flight:
`--resume` discards them and rolls out the next steps again with the restored weights. With k >= 1
a run is therefore not bit-reproducible across a resume, nor run to run: which version generates
which turn depends on timing. k = 0 is the synchronous loop, bit for bit.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, TypeVar

import torch
from torch import nn

from rlfactory.openmp import release_pool
from rlfactory.protocols import Generator, WeightSync
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.versioned import VersionedGenerator
from rlfactory.trajectory import Trajectory

Rolled = TypeVar("Rolled")
"""One step's rollout as `roll_out` returns it and `learn` takes it (step.py's StepRollout); the
pipeline only holds it between the two, so it does not name step.py's type."""


@dataclass(frozen=True)
class CoreSplit:
    """Torch CPU threads of the learner and the local generator on the CPU while both run."""

    learner: int
    """The learner's while the generator is idle (every trajectory in flight waits for a tool, or
    the next rollout waits for a version)."""
    learner_shared: int
    """The learner's while the generator generates: the cores its threads leave."""
    generator: int
    """The generator's while the learner trains (all of the process's at other times)."""


def split_threads(learner: int | None, generator: int | None, available: int | None = None) -> CoreSplit:
    """How learning and generation share the CPU (`available`: default this process's torch
    threads): the generator gets `generator` threads while the learner trains (default half, at
    least 1), the learner `learner` (default all) while the generator is idle and the rest while it
    generates (`SharedCores` switches between the two per decoder layer).

    Why: two OpenMP teams on the same cores make every parallel region end in a futex wait
    (libgomp throttles spinning once its threads outnumber the cores, rlfactory/openmp.py), and a
    decode step is hundreds of small regions. Split, each runs on cores of its own.
    benchmarks/async_train.py (a), max_staleness 1 on 2 cores: 62.4 s and 13.7k context switches
    (4891d99) against 64.9 s and 527k with both teams on both cores (e2de384); runs of the same hour,
    62.5, 63.9, 64.3 s split against 64.0, 66.6 s not; the learner on 1 thread throughout: 81.4 s."""
    n = available or torch.get_num_threads()
    gen = generator or max(1, n // 2)
    alone = learner or n
    return CoreSplit(learner=alone, learner_shared=max(1, min(alone, n - gen)), generator=gen)


class SharedCores:
    """Switches the learner's torch threads before each decoder layer of `policy` runs, forward
    and backward: `shared` while `generator.busy`, else `alone`. Layers are the modules whose
    class name ends in "DecoderLayer" (transformers' naming); a model without them keeps its count.
    Only the learner runs `policy` (the generator samples from a copy), and torch's thread count
    is per thread, so nothing else is touched. `close` removes the hooks."""

    def __init__(self, policy: nn.Module, generator: LocalGenerator, alone: int, shared: int) -> None:
        self.generator, self.alone, self.shared = generator, alone, shared
        self.switches = 0
        """How many times the count changed since the last `take_switches` (the generator came or went)."""
        layers = [m for m in policy.modules() if type(m).__name__.endswith("DecoderLayer")]
        self._handles = [h for layer in layers for h in (layer.register_forward_pre_hook(self._before),
                                                          layer.register_forward_hook(self._after))]

    def adapt(self) -> None:
        want = self.shared if self.generator.busy else self.alone
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)
            self.switches += 1

    def _before(self, module: nn.Module, args: Any) -> None:
        self.adapt()

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if torch.is_tensor(out) and out.requires_grad:  # its gradient arrives just before the layer's backward
            out.register_hook(self._before_backward)

    def _before_backward(self, grad: torch.Tensor) -> None:
        self.adapt()  # returns None: the gradient is unchanged

    def take_switches(self) -> int:
        """The switch count so far, reset to 0."""
        n, self.switches = self.switches, 0
        return n

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


LEARNER_NICE = 10
"""How much nicer than the process the learner's thread is (Linux): it yields the CPU to
generation and the event loop."""


def learner_thread(threads: int, nice: int = LEARNER_NICE) -> None:
    """Initialiser of the learner's thread: its own torch thread count (OpenMP's is per thread) and,
    on Linux, a lower priority for it and the OpenMP workers it starts (they inherit it)."""
    torch.set_num_threads(threads)
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()  # this thread only; never raised (that would need privileges)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class LocalWeightSync:
    """The local generator's side of asynchronous training: generation runs on a copy of the
    policy behind a VersionedGenerator; `push` snapshots the trainable weights (call it while the
    learner is idle) and has the copy load them between turns. Same interface as WeightSync."""

    def __init__(self, generator: LocalGenerator, version: int) -> None:
        self.source: nn.Module = generator.model
        self.copy: nn.Module = copy.deepcopy(self.source).eval()
        self.copy.requires_grad_(False)
        generator.model = self.copy  # the generator now reads only the copy
        self.versioned = VersionedGenerator(generator, version)
        self._pending: list[asyncio.Future] = []

    async def ensure(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Make sure the generator holds `version` (push it unless it is already on its way);
        returns once it does. Call it while the learner is idle."""
        await asyncio.gather(*self._pending)
        if self.versioned.version == version:
            return {}
        metrics = await self.push(policy, version)
        await asyncio.gather(*self._pending)
        return metrics

    async def push(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Snapshot the trainable weights now; the generator loads them once its turns in flight end."""
        t0 = time.perf_counter()
        with torch.no_grad():
            staged = [(dst, src.detach().clone()) for dst, src in zip(self.copy.parameters(), self.source.parameters())
                      if src.requires_grad]
        release_pool()  # the event loop's thread computes nothing else (openmp.py)

        def load() -> None:
            with torch.no_grad():
                for dst, value in staged:
                    dst.copy_(value)

        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(asyncio.ensure_future(self.versioned.update(load, version)))
        return {"weight_sync/seconds": time.perf_counter() - t0}

    async def close(self) -> None:
        for f in self._pending:
            f.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        self._pending = []


@dataclass
class OffPolicyGeneration:
    """How generation runs beside the learner in asynchronous training (`off_policy_generation`)."""

    generator: Generator
    """What the engine generates with: the session's, or (local generator) a VersionedGenerator
    on a copy of the policy."""
    weight_sync: WeightSync | None
    """Gives the generators each new version: the session's, or a LocalWeightSync (None: none needed)."""
    learner_threads: int
    """The learner's torch threads."""
    local: LocalGenerator | None = None
    """The local generator on a CPU whose threads are shared with the learner (None: not shared)."""
    generator_threads: int | None = None
    """The local generator's torch threads while the learner trains (None: unchanged); it has the
    process's while the learner waits for a rollout."""
    shared: SharedCores | None = None
    """Switches the learner's threads while the generator generates (CPU only)."""


def off_policy_generation(generator: Generator, weight_sync: WeightSync | None, policy: nn.Module, version: int,
                          max_staleness: int, world_size: int = 1, learner_threads: int | None = None,
                          generator_threads: int | None = None) -> OffPolicyGeneration:
    """Set up generation for `max_staleness` (k): k = 0 changes nothing; k >= 1 with the local
    generator has it sample from a copy of the policy (LocalWeightSync, see the module doc) and,
    on the CPU, split the cores between it and the learner (`split_threads`); with generation
    servers `weight_sync` must exist. Raises ValueError for what k >= 1 does not support."""
    threads = torch.get_num_threads()
    if max_staleness == 0:
        return OffPolicyGeneration(generator, weight_sync, threads)
    if world_size > 1:
        raise ValueError("trainer.max_staleness >= 1 is not supported with the FSDP learner (torchrun) yet")
    if not isinstance(generator, LocalGenerator):
        if weight_sync is None:
            raise ValueError("trainer.max_staleness >= 1 needs the generators to get each new version: "
                             "generator.weight_sync is none")
        return OffPolicyGeneration(generator, weight_sync, threads)
    local = LocalWeightSync(generator, version)
    if generator.device.type != "cpu":
        return OffPolicyGeneration(local.versioned, local, threads)
    split = split_threads(learner_threads, generator_threads)  # learning and generation share the cores
    return OffPolicyGeneration(local.versioned, local, split.learner, generator, split.generator,
                               SharedCores(policy, generator, split.learner, split.learner_shared))


class AsyncPipeline(Generic[Rolled]):
    """Runs training steps with the rollouts of up to `max_staleness` later steps in flight (see
    the module doc): `roll_out(s, sync_weights)` and `learn(s, rollout, executor)` are one step's
    two halves (step.py's TrainingStep), `steps` the run's last step, `generation` what
    `off_policy_generation` set up. `step(s)` returns what `learn` does, plus async/* metrics.
    max_staleness 0 is the synchronous loop: each step rolls out, then learns on the event loop."""

    def __init__(self, roll_out: Callable[[int, bool], Awaitable[Rolled]],
                 learn: Callable[[int, Rolled, Executor | None],
                                 Awaitable[tuple[dict[str, float], list[Trajectory]]]],
                 steps: int, max_staleness: int, generation: OffPolicyGeneration, policy: nn.Module,
                 version: Callable[[], int]) -> None:
        self.roll_out, self.learn, self.steps, self.k = roll_out, learn, steps, int(max_staleness)
        self.generation, self.policy, self.version = generation, policy, version
        self.rollouts: dict[int, asyncio.Task] = {}
        self._synced = False
        threads = generation.learner_threads
        self.learner = (ThreadPoolExecutor(1, "rlfactory-learn", initializer=learner_thread, initargs=(threads,))
                        if self.k > 0 else None)
        """The learner's own thread (k >= 1): the event loop keeps rolling out while it trains."""

    async def step(self, step: int) -> tuple[dict[str, float], list[Trajectory]]:
        gen = self.generation
        if not self._synced and self.k > 0 and gen.weight_sync is not None:
            await gen.weight_sync.ensure(self.policy, self.version())  # before anything reads the weights concurrently
        self._synced = True
        t0 = time.perf_counter()
        # Steps step..step+k (the version the learner holds allows them): after the first step only
        # step+k is new; an empty pipeline (the first step, a resume) starts them all.
        self._start(*range(step, min(step + self.k, self.steps) + 1))
        rollout = await self.rollouts.pop(step)
        waited = time.perf_counter() - t0
        if gen.local is not None and gen.generator_threads is not None:
            gen.local.threads = gen.generator_threads  # share the cores with the learner ...
        try:
            metrics, trajs = await self.learn(step, rollout, self.learner)
        finally:
            if gen.local is not None:
                gen.local.threads = None  # ... and take them all back while it waits
        if self.k > 0:
            metrics["time/wait_rollout_s"] = waited
            metrics["async/learner_threads"] = float(gen.learner_threads)
            if gen.generator_threads is not None:
                metrics["async/generator_threads"] = float(gen.generator_threads)
            if gen.shared is not None:
                metrics["async/learner_threads_shared"] = float(gen.shared.shared)
                metrics["async/learner_thread_switches"] = float(gen.shared.take_switches())
        return metrics, trajs

    def _start(self, *steps: int) -> None:
        """Start the rollouts of `steps` not yet in flight (with k >= 1 without a weight sync: the
        learner may be writing the weights)."""
        for s in steps:
            if s not in self.rollouts:
                self.rollouts[s] = asyncio.ensure_future(self.roll_out(s, self.k == 0))

    async def close(self) -> None:
        """Cancel the rollouts still in flight (they are not checkpointed; see the module doc)."""
        if self.learner is not None:
            self.learner.shutdown(wait=False)
        if self.generation.shared is not None:
            self.generation.shared.close()
        tasks = list(self.rollouts.values())
        self.rollouts.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if isinstance(self.generation.weight_sync, LocalWeightSync):
            await self.generation.weight_sync.close()
