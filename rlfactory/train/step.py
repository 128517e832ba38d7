"""One training step, top to bottom (`TrainingStep`):

    1. roll out   rows = the step's prompts (from (trainer.seed, step), data.py);
                  trajs = engine.run(rows, n=algo.group_size): generate -> parse -> tools -> observe
    2. score      reward.score(traj) for each scorable trajectory (infra_error: unscored); one whose
                  history rollout.context rewrote then becomes its samples, sharing that score
    3. select     the trajectories that enter the loss: scored, fresh enough (max_staleness), with
                  model tokens, and (algo.dynamic_sampling) in a group whose rewards differ
    4. learn      advantages, old/ref logprobs, the update (learner.py), in `executor`'s thread when given
    5. sync       version += 1; the new weights go to generators that do not read the policy in place
    6. metrics    the step's: rewards, statuses, losses, throughput and times, returned for the log

`step(s)` is `learn(s, await roll_out(s))`: the synchronous loop. The pipelined one
(async_pipeline.py, trainer.max_staleness >= 1) calls the same two halves, with the rollouts of
later steps in flight while one learns. Every random choice of step s is seeded from
(trainer.seed, s), so `--resume` continues exactly where a run stopped.

Under torchrun each rank rolls out its share of the rows; `parallel.gather` gives every rank the
whole step's trajectories (advantages and metrics as in one process), each rank trains on its own
rows of the sharded policy, and the rollout model (the replica) gets the new weights after.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from rlfactory.algos.advantages import dynamic_sampling_filter
from rlfactory.openmp import release_pool, released
from rlfactory.rewards.base import Reward, score_all
from rlfactory.rewards.turns import apply_turn_scores
from rlfactory.branches import all_samples
from rlfactory.rollout.engine import failed_trajectories, group_names
from rlfactory.train.staleness import fresh_mask
from rlfactory.config import RunConfig
from rlfactory.protocols import FreesCache, Generator, Reseedable, Rollouts, SwapsGenerator, WeightSync
from rlfactory.train.data import PromptSampler, derive_seed, seed_everything
from rlfactory.train.learner import Learner
from rlfactory.train.metrics import trajectory_metrics
from rlfactory.train.parallel import Parallel
from rlfactory.trajectory import Trajectory

log = logging.getLogger("rlfactory.train")

MAX_FAILED_ROLLOUTS = 3
"""Steps in a row whose rollout may raise before the run stops with that error."""


@dataclass
class Progress:
    """Where a run stands; the steps, the run loop and its checkpoints read and write it."""

    step_done: int = 0
    """The last completed step."""
    version: int = 0
    """The policy version the learner holds (one per completed step)."""
    weights_step: int | None = 0
    """The step whose update the weights hold; None while an update changes them."""
    failed_rollouts: int = 0
    """Steps in a row whose engine.run raised."""


@dataclass
class StepRollout:
    """One step's rollout (this rank's share), before scoring."""

    trajs: list[Trajectory]
    started: float
    """time.perf_counter() when the step's rollout began."""
    rollout_s: float


@dataclass
class Selection:
    """Step 3: which of the whole step's trajectories [B] enter the loss, and why not."""

    rewards: torch.Tensor
    groups: torch.Tensor
    valid: torch.Tensor
    """[B] each, as `reward_tensors`; `valid` also drops the stale."""
    keep: torch.Tensor
    """[B] bool: the rows trained on."""
    metrics: dict[str, float]
    """batch/kept, batch/kept_frac and (asynchronous training) async/* staleness."""


class TrainingStep:
    """The story of one step (see the module doc), told with its collaborators: `engine` rolls out
    (its `run(rows, n, ...)`), `generator` is the session's (reseeded each step; its decode cache
    freed before a synchronous update), `weight_sync` pushes each new version to generators that
    do not read the policy in place (None: the local generator does)."""

    def __init__(self, cfg: RunConfig, engine: Rollouts, generator: Generator, reward: Reward, sampler: PromptSampler,
                 learner: Learner, progress: Progress, parallel: Parallel, weight_sync: WeightSync | None) -> None:
        self.cfg, self.engine, self.generator, self.reward = cfg, engine, generator, reward
        self.sampler, self.learner, self.progress, self.parallel = sampler, learner, progress, parallel
        self.weight_sync = weight_sync

    def generating_with(self, generator: Generator, weight_sync: WeightSync | None) -> TrainingStep:
        """These steps with the engine generating with `generator` (the session's, or asynchronous
        training's copy of the policy) and `weight_sync` pushing the versions; the rest shared."""
        if generator is self.generator:
            engine = self.engine
        elif isinstance(self.engine, SwapsGenerator):
            engine = self.engine.with_generator(generator)
        else:
            raise TypeError(f"{type(self.engine).__qualname__} cannot roll out with another generator "
                            "(asynchronous training needs an engine with with_generator)")
        return TrainingStep(self.cfg, engine, self.generator, self.reward, self.sampler, self.learner, self.progress,
                            self.parallel, weight_sync)

    async def __call__(self, step: int) -> tuple[dict[str, float], list[Trajectory]]:
        """Run training step `step` (1-based); returns (metrics, the step's scored trajectories)."""
        return await self.learn(step, await self.roll_out(step))

    async def roll_out(self, step: int, sync_weights: bool = True) -> StepRollout:
        """1. The rollout of step `step` (this rank's share). `sync_weights`: first make sure
        generators hold the current version (and free the decode cache after)."""
        cfg, algo, progress = self.cfg, self.cfg.algo, self.progress
        t0 = time.perf_counter()
        release_pool()  # of this thread: whatever ran here since (loading, copies) must not throttle generation
        seed_everything(derive_seed(cfg.trainer.seed, step, "global"))
        reseed_generation(self.generator, derive_seed(cfg.trainer.seed, step, "sampling"))
        if self.weight_sync is not None and sync_weights:
            await self.weight_sync.ensure(self.learner.policy, progress.version)
        all_rows = self.sampler.rows_for(step - 1)
        # Each row's draws are seeded on their own (by its place in the whole step), so a trajectory
        # does not depend on the batch it is generated in: the same in one engine, on Ray workers,
        # or on the ranks of the FSDP learner, each rolling out its share.
        seeds = [derive_seed(cfg.trainer.seed, step, "sampling", i) for i in range(len(all_rows))]
        rows = self.parallel.share(all_rows)
        # priority = step: with rollouts of several steps in flight (max_staleness >= 1), the older
        # one's turns go first (GenRequest.priority)
        try:
            local = await self.engine.run(rows, algo.group_size, policy_version=progress.version,
                                          seeds=self.parallel.share(seeds), priority=step)
            progress.failed_rollouts = 0
        except Exception as e:  # a rollout bug, not one trajectory's failure (that is its status)
            local = self._failed_rollout(step, rows, e)
        if self.parallel.world_size > 1:  # name groups and ids as one process would (unique over ranks)
            rename_groups(local, self.parallel.share(group_names(all_rows)), algo.group_size)
        if sync_weights:
            self.release_generation_memory()
        return StepRollout(local, t0, time.perf_counter() - t0)

    async def learn(self, step: int, rollout: StepRollout,
                    executor: Executor | None = None) -> tuple[dict[str, float], list[Trajectory]]:
        """2-6. Score `rollout`, train on the whole step's trajectories (in `executor`'s thread when
        given, so the event loop keeps rolling out meanwhile), bump the version and push it."""
        progress, local = self.progress, rollout.trajs
        t_score0 = time.perf_counter()
        await self._score(local)  # 2
        t_score = time.perf_counter() - t_score0
        # rollout.context: a trajectory whose history was rewritten is scored once, as the episode
        # it is, and trained as its samples (rlfactory/branches.py), counted once in its baseline
        local = all_samples(local)

        trajs = self.parallel.gather(local)  # the whole step's, in one process's order
        owners = torch.tensor(self.parallel.gather([self.parallel.rank] * len(local)), dtype=torch.long)
        metrics = trajectory_metrics(trajs)
        chosen = self._select(trajs)  # 3
        metrics.update(chosen.metrics)
        t1 = time.perf_counter()
        train_tokens = 0.0
        if chosen.keep.any():  # 4
            progress.weights_step = None  # until the step is done (Trainer.save_finished_step)
            args = (self.learner.learn, step, trajs, owners, chosen.rewards, chosen.groups, chosen.valid, chosen.keep)
            # the training thread's OpenMP pool is freed after: it would throttle generation (openmp.py)
            learned = (released(*args) if executor is None else
                       await asyncio.get_running_loop().run_in_executor(executor, released, *args))
            metrics.update(learned.metrics)
            train_tokens = learned.train_tokens
            self.parallel.sync_replica(self.learner.policy, self.learner.replica)
            if self.parallel.world_size > 1 and self.cfg.trainer.log_trajectories:
                trajs = self.parallel.gather(local)  # with the annotations the update wrote on each rank's own
        t_train = time.perf_counter() - t1
        progress.version += 1  # 5
        if self.weight_sync is not None:
            metrics.update(await self.weight_sync.push(self.learner.policy, progress.version))
        progress.step_done = progress.weights_step = step
        metrics.update({  # 6
            "policy_version": float(progress.version),
            "perf/gen_tokens_per_s": sum(sum(t.loss_mask) for t in trajs) / max(rollout.rollout_s, 1e-9),
            "perf/train_tokens_per_s": train_tokens / max(t_train, 1e-9),
            "time/rollout_s": rollout.rollout_s,
            "time/score_s": t_score,
            "time/train_s": t_train,
            "time/step_s": time.perf_counter() - rollout.started,
        })
        return metrics, trajs

    def _select(self, trajs: list[Trajectory]) -> Selection:
        """3. A trajectory with a model segment more than trainer.max_staleness versions behind the
        weights being trained is left out of the baseline and the loss (async_pipeline.py)."""
        max_staleness = self.cfg.trainer.max_staleness
        rewards, groups, valid = reward_tensors(trajs)
        metrics: dict[str, float] = {}
        fresh, stale_metrics = fresh_mask(trajs, self.progress.version, max_staleness)
        if max_staleness > 0 or not fresh.all():
            metrics.update(stale_metrics)
            valid &= fresh
        keep = valid & torch.tensor([any(t.loss_mask) for t in trajs], dtype=torch.bool)
        if self.cfg.algo.dynamic_sampling:
            keep &= dynamic_sampling_filter(rewards, groups, valid)
        metrics["batch/kept"] = float(keep.sum())
        metrics["batch/kept_frac"] = float(keep.float().mean()) if len(trajs) else 0.0
        return Selection(rewards, groups, valid, keep, metrics)

    async def _score(self, trajs: list[Trajectory]) -> None:
        """2. Each scorable trajectory's reward, its terms and its turns' rewards."""
        scores = await score_all(self.reward, trajs)
        for t, s in zip(trajs, scores):
            if s is not None:
                t.reward, t.reward_terms = float(s.total), dict(s.terms)
                if s.turns is not None:
                    apply_turn_scores(t, s.turns)

    def _failed_rollout(self, step: int, rows: list[dict], error: Exception) -> list[Trajectory]:
        """The step's trajectories when `engine.run` raised: infra_error, unscored and out of the
        loss, so the step goes on (as one trajectory's failure would); logged with the traceback.
        The MAX_FAILED_ROLLOUTS-th such step in a row raises: the rollout is broken, not unlucky."""
        self.progress.failed_rollouts += 1
        if self.progress.failed_rollouts >= MAX_FAILED_ROLLOUTS:
            raise error
        why = f"the rollout raised {type(error).__name__}: {error}"[:1000]
        log.error("step %d: %s; its %d trajectories are infra_error (left out of the loss) and the run goes on "
                  "(%d such steps in a row stop it)", step, why, len(rows) * self.cfg.algo.group_size,
                  MAX_FAILED_ROLLOUTS, exc_info=error)
        return failed_trajectories(rows, self.cfg.algo.group_size, why)

    def release_generation_memory(self) -> None:
        """Synchronous steps: free the local generator's decode cache before training (it keeps it
        between its worker sessions). Asynchronous ones keep generating meanwhile."""
        if isinstance(self.generator, FreesCache) and self.cfg.trainer.max_staleness == 0:
            self.generator.free_cache()


def reseed_generation(generator: Generator, seed: int) -> None:
    """Seed the generator's own draws (those of requests without GenRequest.seed); a generator
    that is not `Reseedable` has none of its own to seed."""
    if isinstance(generator, Reseedable):
        generator.reseed(seed)


def reward_tensors(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards [B] float (0 where unscored), groups [B] long, valid [B] bool.

    groups[b] numbers `trajs[b].group` (the engine's group: one per row of the step, unique even
    when a step wraps around the dataset and meets a row again).
    """
    rewards = torch.tensor([t.reward if t.reward is not None else 0.0 for t in trajs], dtype=torch.float32)
    numbers: dict[str, int] = {}
    groups = torch.tensor([numbers.setdefault(t.group, len(numbers)) for t in trajs], dtype=torch.long)
    valid = torch.tensor([t.reward is not None for t in trajs], dtype=torch.bool)
    return rewards, groups, valid


def rename_groups(trajs: list[Trajectory], names: list[str], group_size: int) -> None:
    """Give a rank's row-major trajectories their groups' names in the whole step (`names`, one
    per row of this rank's share) and ids `<group>-<k>`, as one process's engine would."""
    for i, t in enumerate(trajs):
        t.group = names[i // group_size]
        t.id = f"{t.group}-{i % group_size}"
