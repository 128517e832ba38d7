"""The training loop. One step, top to bottom (`Trainer.step`):

    rows      = the step's prompts (derived from (seed, step), see data.py)
    trajs     = engine.run(rows, n=algo.group_size)        generate -> parse -> tools -> observe
    scores    = reward.score(traj) for each scorable traj   infra_error: unscored, out of the loss
    adv       = advantage(rewards, groups, valid)           grpo | dr_grpo | rloo | reinforce++ | gae
                (per turn: turn_grpo | gigpo | turn_loo, from each model turn's own reward too)
    old_logp  = the training model's logprobs (mismatch with the sampler's is logged)
    update    = epochs x minibatches of clipped policy loss (+ KL, entropy, value loss)
    version  += 1; log metrics and trajectories; checkpoint; evaluate

`step` is `learn(roll_out(step))`. The policy is the rollout generator's own model object,
updated in place. Every random choice of step s is seeded from (trainer.seed, s), so `--resume`
continues exactly where a run stopped. With trainer.max_staleness >= 1 `run` overlaps the
rollouts of later steps with each update instead (async_pipeline.py: the generator then samples
from a copy of the policy, and the loss corrects for the versions that sampled each token).

Under torchrun the trainer runs on every rank with `parallel` (rlfactory/train/parallel.py): each
rank rolls out its share of the rows, `parallel.gather` gives every rank the whole step's
trajectories (advantages and metrics as in one process), each rank trains on its own rows of the
sharded policy, and the rollout model (the replica) gets the new weights after the update.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlfactory.algos.advantages import (
    TURN,
    advantage_kind,
    dynamic_sampling_filter,
    gae_advantages,
    get_advantage,
    outcome_to_token_rewards,
)
from rlfactory.openmp import release_pool, released
from rlfactory.rewards.base import score_all
from rlfactory.rewards.turns import apply_turn_scores
from rlfactory.train.session import pad_id_of
from rlfactory.rollout.engine import failed_trajectories, group_names
from rlfactory.train.annotate import annotate_trajectories
from rlfactory.train.async_pipeline import AsyncPipeline, fresh_mask, is_weight_stats
from rlfactory.train.batch import collate, empty_batch, loss_tokens, row_shape
from rlfactory.train.checkpoint import (
    CheckpointMeta,
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    set_rng_state,
)
from rlfactory.config import RunConfig
from rlfactory.train.critic import Critic
from rlfactory.train.data import PromptSampler, derive_seed, seed_everything, step_generator
from rlfactory.train.evaluate import evaluate
from rlfactory.train.logprobs import batched_logprobs
from rlfactory.train.metrics import logprob_mismatch, tensor_stats, trajectory_metrics
from rlfactory.train.model import (
    ReferencePolicy,
    apply_lora,
    load_full_weights,
    load_lora_weights,
    make_optimizer,
    make_scheduler,
)
from rlfactory.train.parallel import Parallel, RowLayout, SingleProcess
from rlfactory.train.runlog import RunLog
from rlfactory.train.signal import SignalWatch, step_signal
from rlfactory.train.turns import spread_over_tokens, turn_advantages
from rlfactory.train.update import PolicyUpdate, UpdateData
from rlfactory.train.weight_sync import make_weight_sync
from rlfactory.trajectory import Trajectory


log = logging.getLogger("rlfactory.train")

MAX_FAILED_ROLLOUTS = 3
"""Steps in a row whose rollout may raise before the run stops with that error."""


@dataclass
class StepRollout:
    """One step's rollout (this rank's share), before scoring."""

    trajs: list[Trajectory]
    started: float
    """time.perf_counter() when the step's rollout began."""
    rollout_s: float
    synced: dict[str, float]
    """Metrics of the weight sync done before the rollout (server backend)."""


class Trainer:
    """Owns the policy, optimizer and step of one run.

    `session` is an open rollout session (rlfactory.train.session.open_rollout, or
    rlfactory.distributed.open_ray_rollout): its `engine` rolls out, its `model` is the policy
    (trained in place; the local generator samples from it, generation servers and Ray rollout
    workers get its weights after each update through its `weight_sync`), `tokenizer` is saved
    with every checkpoint.
    """

    def __init__(self, cfg: RunConfig, session: Any, reward: Any, train_rows: list[dict], test_rows: list[dict] | None = None,
                 parallel: Parallel | None = None) -> None:
        self.cfg = cfg
        self.parallel = parallel if parallel is not None else SingleProcess()
        self.session = session
        self.engine = session.engine
        self.reward = reward
        self.test_rows = test_rows or []
        tr, algo = cfg.trainer, cfg.algo
        base = session.model
        self.device = next(base.parameters()).device
        self.tokenizer = session.tokenizer
        self.pad_id = pad_id_of(session.tokenizer, base)
        # Generators that do not read the policy in place get its weights pushed after updates:
        # the session's own (Ray rollout workers) or the generation servers' weight sync.
        self.weight_sync = getattr(session, "weight_sync", None) or make_weight_sync(cfg, session.generator)
        self.temperature = cfg.sampling.logprob_temperature
        if tr.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        # The reference is taken from the freshly loaded weights, before any checkpoint is loaded.
        self.reference = ReferencePolicy(base, lora=False) if algo.kl_coef > 0 and tr.lora is None else None
        if self.reference is not None and self.reference.copy is not None:
            self.reference.copy = self.parallel.wrap_frozen(self.reference.copy)
        self.replica = base  # the rollout model; the trained policy itself in one process
        self.policy = apply_lora(base, tr.lora) if tr.lora is not None else self.parallel.wrap_policy(base)
        if algo.kl_coef > 0 and tr.lora is not None:
            self.reference = ReferencePolicy(self.policy, lora=True)
        self.critic = Critic(self.policy).to(self.device) if advantage_kind(algo.advantage) == "token" else None
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.critic is not None:
            params += list(self.critic.parameters())
        self.optimizer = make_optimizer(params, tr)
        self.scheduler = make_scheduler(self.optimizer, tr)
        self.update = PolicyUpdate(
            self.policy, self.optimizer, self.scheduler, algo, max_grad_norm=tr.max_grad_norm, bf16=tr.bf16,
            temperature=self.temperature, norm_constant=float(cfg.rollout.max_total_tokens), critic=self.critic,
            share_prefix=not tr.gradient_checkpointing, parallel=self.parallel,
        )
        self.sampler = PromptSampler(train_rows, tr.prompts_per_step, tr.seed)
        self.step_done = 0
        self.version = 0
        self.failed_rollouts = 0  # steps in a row whose engine.run raised
        self.weights_step: int | None = 0
        """The step whose update the weights hold; None while an update changes them."""
        self.policy.eval()

    # ---- the step ---------------------------------------------------------------------------

    async def step(self, step: int) -> tuple[dict[str, float], list[Trajectory]]:
        """Run training step `step` (1-based); returns (metrics, the step's scored trajectories)."""
        return await self.learn(step, await self.roll_out(step))

    async def roll_out(self, step: int, sync_weights: bool = True) -> StepRollout:
        """The rollout of step `step` (this rank's share; rows and seeds derive from
        (trainer.seed, step)). `sync_weights`: first make sure generators hold the current version."""
        cfg, algo = self.cfg, self.cfg.algo
        t0 = time.perf_counter()
        release_pool()  # of this thread: whatever ran here since (loading, copies) must not throttle generation
        seed_everything(derive_seed(cfg.trainer.seed, step, "global"))
        self._reseed_generation(derive_seed(cfg.trainer.seed, step, "sampling"))
        synced = await self.weight_sync.ensure(self.policy, self.version) if self.weight_sync and sync_weights else {}
        all_rows = self.sampler.rows_for(step - 1)
        # Each row's draws are seeded on their own (by its place in the whole step), so a trajectory
        # does not depend on the batch it is generated in: the same in one engine, on Ray workers,
        # or on the ranks of the FSDP learner, each rolling out its share.
        seeds = [derive_seed(cfg.trainer.seed, step, "sampling", i) for i in range(len(all_rows))]
        # priority = step: with rollouts of several steps in flight (max_staleness >= 1), the older
        # one's turns go first (GenRequest.priority)
        try:
            local = await self.engine.run(self.parallel.share(all_rows), algo.group_size, policy_version=self.version,
                                          seeds=self.parallel.share(seeds), priority=step)
            self.failed_rollouts = 0
        except Exception as e:  # a rollout bug, not one trajectory's failure (that is its status)
            local = self._failed_rollout(step, self.parallel.share(all_rows), e)
        if self.parallel.world_size > 1:  # name groups and ids as one process would (unique over ranks)
            _rename_groups(local, self.parallel.share(group_names(all_rows)), algo.group_size)
        if sync_weights:
            self._release_generation_memory()
        return StepRollout(local, t0, time.perf_counter() - t0, synced)

    def _failed_rollout(self, step: int, rows: list[dict], error: Exception) -> list[Trajectory]:
        """The step's trajectories when `engine.run` raised: infra_error, unscored and out of the
        loss, so the step goes on (as one trajectory's failure would); logged with the traceback.
        The MAX_FAILED_ROLLOUTS-th such step in a row raises: the rollout is broken, not unlucky."""
        self.failed_rollouts += 1
        if self.failed_rollouts >= MAX_FAILED_ROLLOUTS:
            raise error
        why = f"the rollout raised {type(error).__name__}: {error}"[:1000]
        log.error("step %d: %s; its %d trajectories are infra_error (left out of the loss) and the run goes on "
                  "(%d such steps in a row stop it)", step, why, len(rows) * self.cfg.algo.group_size,
                  MAX_FAILED_ROLLOUTS, exc_info=error)
        return failed_trajectories(rows, self.cfg.algo.group_size, why)

    def _release_generation_memory(self) -> None:
        """Synchronous steps: free the local generator's decode cache before training (it keeps it
        between its worker sessions). Asynchronous ones keep generating meanwhile."""
        free = getattr(self.session.generator, "free_cache", None)
        if free is not None and self.cfg.trainer.max_staleness == 0:
            free()

    async def learn(self, step: int, rollout: StepRollout,
                    executor: Executor | None = None) -> tuple[dict[str, float], list[Trajectory]]:
        """Score `rollout`, train on the whole step's trajectories (in `executor`'s thread when
        given, so the event loop keeps rolling out meanwhile), bump the version and push it to the
        generators.

        A trajectory with a model segment more than trainer.max_staleness versions behind the
        weights being trained is left out of the baseline and the loss (async_pipeline.py)."""
        cfg, algo = self.cfg, self.cfg.algo
        local, t0, t_gen = rollout.trajs, rollout.started, rollout.rollout_s
        t_score0 = time.perf_counter()
        await self._score(local)
        t_score = time.perf_counter() - t_score0

        trajs = self.parallel.gather(local)  # the whole step's, in one process's order
        owners = torch.tensor(self.parallel.gather([self.parallel.rank] * len(local)), dtype=torch.long)
        metrics = trajectory_metrics(trajs)
        rewards, groups, valid = _reward_tensors(trajs)
        fresh, stale_metrics = fresh_mask(trajs, self.version, cfg.trainer.max_staleness)
        if cfg.trainer.max_staleness > 0 or not fresh.all():
            metrics.update(stale_metrics)
            valid &= fresh
        has_tokens = torch.tensor([any(t.loss_mask) for t in trajs], dtype=torch.bool)
        keep = valid & has_tokens
        if algo.dynamic_sampling:
            keep &= dynamic_sampling_filter(rewards, groups, valid)
        metrics["batch/kept"] = float(keep.sum())
        metrics["batch/kept_frac"] = float(keep.float().mean()) if len(trajs) else 0.0
        gen_tokens = sum(sum(t.loss_mask) for t in trajs)
        t1 = time.perf_counter()
        if keep.any():
            self.weights_step = None  # until step_done says which step they hold (save_finished_step)
            args = (self._learn, step, trajs, owners, rewards, groups, valid, keep)
            # the training thread's OpenMP pool is freed after: it would throttle generation (openmp.py)
            metrics.update(released(*args) if executor is None else
                           await asyncio.get_running_loop().run_in_executor(executor, released, *args))
            self.parallel.sync_replica(self.policy, self.replica)
            if self.parallel.world_size > 1 and self.cfg.trainer.log_trajectories:
                trajs = self.parallel.gather(local)  # with the annotations the update wrote on each rank's own
        t_train = time.perf_counter() - t1
        self.version += 1
        synced = rollout.synced
        if self.weight_sync is not None:
            synced = await self.weight_sync.push(self.policy, self.version)
        metrics.update(synced)
        self.step_done = self.weights_step = step
        metrics.update({
            "policy_version": float(self.version),
            "perf/gen_tokens_per_s": gen_tokens / max(t_gen, 1e-9),
            "perf/train_tokens_per_s": metrics.pop("_train_tokens", 0.0) / max(t_train, 1e-9),
            "time/rollout_s": t_gen,
            "time/score_s": t_score,
            "time/train_s": t_train,
            "time/step_s": time.perf_counter() - t0,
        })
        return metrics, trajs

    def _learn(self, step: int, trajs: list[Trajectory], owners: torch.Tensor, rewards: torch.Tensor,
               groups: torch.Tensor, valid: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
        """Advantages, old/ref logprobs and the update for the kept trajectories.

        `trajs` [B] are the whole step's, `owners` [B] the rank that rolled each out; this rank
        trains on its own kept rows (all of them in one process)."""
        algo, tr = self.cfg.algo, self.cfg.trainer
        idx = torch.nonzero(keep).squeeze(-1)
        own = owners[idx] == self.parallel.rank
        mine = [trajs[i] for i in idx[own].tolist()]
        batch = collate(mine, self.pad_id).to(self.device) if mine else empty_batch(self.device)
        layout = RowLayout(owners[idx], torch.tensor([float(loss_tokens(trajs[i])) for i in idx.tolist()]),
                           self.parallel.rank, self.parallel.world_size,
                           shape=torch.tensor([row_shape(trajs[i]) for i in idx.tolist()], dtype=torch.long).view(-1, 3))
        out: dict[str, float] = {}
        micro = algo.micro_batch_size
        chunks, passes = self.update.passes(layout, torch.arange(len(layout)), self.device)  # the update's own
        fwd = dict(temperature=self.temperature, bf16=tr.bf16, share_prefix=not tr.gradient_checkpointing, passes=passes,
                   chunks=chunks)
        old_logp = None if self.update.single_pass(len(layout)) else batched_logprobs(self.policy, batch, micro, **fwd)
        ref_logp = self.reference.logprobs(batch, micro, **fwd) if self.reference is not None else None
        is_cap = algo.tis_cap if tr.max_staleness > 0 else None
        data = UpdateData(batch, advantages=torch.zeros(0), old_logp=old_logp, ref_logp=ref_logp, is_cap=is_cap)
        if self.critic is not None:
            data.old_values = self.critic.values(batch, micro, tr.bf16, fwd["share_prefix"], chunks=chunks)
            token_rewards = outcome_to_token_rewards(rewards[idx].to(self.device), batch.loss_mask)
            data.advantages, data.returns = gae_advantages(token_rewards, data.old_values, batch.loss_mask, algo.gamma, algo.lam)
            out.update(tensor_stats("adv", data.advantages, batch.loss_mask))
        elif advantage_kind(algo.advantage) == TURN:  # one advantage per turn, on its tokens
            turn_adv, turn_mask = turn_advantages(algo, trajs, rewards, groups, valid)
            out.update(tensor_stats("adv", turn_adv[idx], turn_mask[idx]))
            data.advantages = spread_over_tokens(turn_adv[idx][own], mine, batch.loss_mask.shape[1]).to(self.device)
        else:
            fn = get_advantage(algo.advantage)
            advantages = fn(rewards, groups, valid)[idx]
            data.advantages = advantages[own].to(self.device)
            out.update(tensor_stats("adv", advantages))
        metrics, logp_before = self.update(data, step_generator(tr.seed, step, "minibatch"), layout)
        annotate_trajectories(mine, logp_before, data.advantages)
        out.update(metrics)
        sel = batch.loss_mask.bool()
        parts = self.parallel.gather([(logp_before[sel].cpu(), batch.sampler_logprobs[sel].cpu(), batch.num_tokens())])
        train_logp, sampler_logp = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        out.update(logprob_mismatch(train_logp, sampler_logp, torch.ones_like(train_logp)))
        if is_cap is not None:
            out.update(is_weight_stats(train_logp, sampler_logp, torch.ones_like(train_logp), is_cap))
        out["batch/tokens"] = float(sum(p[2] for p in parts))
        out["_train_tokens"] = out["batch/tokens"] * algo.epochs
        return out

    async def _score(self, trajs: list[Trajectory]) -> None:
        scores = await score_all(self.reward, trajs)
        for t, s in zip(trajs, scores):
            if s is not None:
                t.reward, t.reward_terms = float(s.total), dict(s.terms)
                if s.turns is not None:
                    apply_turn_scores(t, s.turns)

    def _reseed_generation(self, seed: int) -> None:
        gen = self.session.generator
        if hasattr(gen, "reseed"):
            gen.reseed(seed)
        elif isinstance(getattr(gen, "rng", None), torch.Generator):
            gen.rng.manual_seed(seed)

    # ---- the run ----------------------------------------------------------------------------

    async def run(self, log: RunLog | None) -> list[dict[str, float]]:
        """Steps from the last completed one to trainer.steps, with logging, checkpoints, evals.

        `log` is None on the ranks other than 0 of the FSDP learner (rank 0 writes the logs).

        Resumed at a step whose evaluation was due but never logged (the run was killed during
        it, after the step's checkpoint was written), that evaluation runs first.
        """
        tr = self.cfg.trainer
        history = []
        if self._eval_due(self.step_done) and log is not None and not log.has_eval(self.step_done):
            await self._evaluate_and_log(log)
        bar = _progress(tr.steps, self.step_done, enabled=tr.progress and self.parallel.is_main)
        watch = SignalWatch()  # says so when most groups carry no learning signal for several steps
        pipeline = AsyncPipeline(self, tr.max_staleness) if tr.max_staleness > 0 else None
        try:
            for step in range(self.step_done + 1, tr.steps + 1):
                metrics, trajs = await (pipeline.step(step) if pipeline is not None else self.step(step))
                if log is not None:
                    log.log(step, metrics)
                    if tr.log_trajectories:
                        log.trajectories(step, trajs)
                history.append(metrics)
                if step == tr.steps or (tr.save_every > 0 and step % tr.save_every == 0):
                    self.save()
                if self._eval_due(step) and log is not None:
                    await self._evaluate_and_log(log)
                signal = step_signal(trajs)
                warning = watch.observe(step, signal) if self.parallel.is_main else None
                if warning:
                    (bar.write if bar is not None else print)(warning, file=sys.stderr)
                if bar is not None:
                    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}",
                                    no_signal=f"{signal.flat_frac:.0%}", tool_ok=f"{signal.tool_success:.0%}",
                                    tok_s=f"{metrics['perf/gen_tokens_per_s']:.0f}", refresh=False)
                    bar.update(1)
        finally:
            if pipeline is not None:
                await pipeline.close()
            if bar is not None:
                bar.close()
        return history

    def _eval_due(self, step: int) -> bool:
        """Rank 0 evaluates (on the whole test split, with its full rollout model); the others go on."""
        every = self.cfg.trainer.eval_every
        return every > 0 and step > 0 and step % every == 0 and bool(self.test_rows) and self.parallel.is_main

    async def _evaluate_and_log(self, log: RunLog) -> None:
        report = await self.evaluate()
        log.log(self.step_done, report["averages"], kind="eval")

    async def evaluate(self) -> dict[str, Any]:
        tr = self.cfg.trainer
        rows = self.test_rows[: tr.eval_limit] if tr.eval_limit else self.test_rows
        if self.weight_sync is not None:  # e.g. asynchronous training: the generator's copy may lag
            await self.weight_sync.ensure(self.policy, self.version)
        self._reseed_generation(derive_seed(tr.seed, self.step_done, "eval"))
        report = await evaluate(self.engine, self.reward, rows, greedy=True, policy_version=self.version)
        self._release_generation_memory()
        return report

    # ---- checkpoints ------------------------------------------------------------------------

    def save(self) -> Path:
        """Write the checkpoint of the last completed step (every rank calls it under torchrun)."""
        state = {"scheduler": self.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        meta = CheckpointMeta(
            step=self.step_done, policy_version=self.version, data_position=self.sampler.position(self.step_done),
            seed=self.cfg.trainer.seed, lora=self.cfg.trainer.lora is not None,
        )
        tr = self.cfg.trainer
        if self.parallel.sharded:
            return self.parallel.save_checkpoint(tr.run_dir, meta, self.policy, self.replica, self.tokenizer,
                                                 self.optimizer, state, tr.keep_last)
        state["optimizer"] = self.optimizer.state_dict()
        return save_checkpoint(tr.run_dir, meta, self.policy, self.tokenizer, state, tr.keep_last)

    def save_finished_step(self) -> Path | None:
        """On a stop: the checkpoint of the last finished step, unless it exists already; None
        when the weights are past that step (the stop came during an update)."""
        if self.weights_step != self.step_done:
            return None
        last = latest_checkpoint(self.cfg.trainer.run_dir)
        if last is not None and read_meta(last).step == self.step_done:
            return last
        return self.save()

    def restore(self, path: str | Path) -> None:
        """Continue from checkpoint folder `path` (weights, optimizer, scheduler, RNG, position)."""
        meta = read_meta(path)
        if meta.lora != (self.cfg.trainer.lora is not None):
            raise ValueError(f"checkpoint {path} was {'' if meta.lora else 'not '}trained with LoRA; the config disagrees")
        if meta.data_position != self.sampler.position(meta.step):
            raise ValueError(f"checkpoint {path}: data position {meta.data_position} does not match "
                             f"trainer.prompts_per_step={self.cfg.trainer.prompts_per_step}")
        if meta.sharded != self.parallel.sharded:
            how = "under torchrun (rlfactory train CONFIG --resume --nproc N)" if meta.sharded else "in one process"
            raise ValueError(f"checkpoint {path} was written by {'the FSDP learner' if meta.sharded else 'one process'}; "
                             f"resume it {how}")
        if self.parallel.sharded:
            meta, state = self.parallel.load_checkpoint(path, self.policy, self.replica, self.optimizer)
        else:
            meta, state = load_checkpoint(path)
            if meta.lora:
                load_lora_weights(self.policy, Path(path) / "model")
            else:
                load_full_weights(self.policy, Path(path) / "model")
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None and "critic" in state:
            self.critic.load_state_dict(state["critic"])
        set_rng_state(state["rng"])
        self.step_done = self.weights_step = meta.step
        self.version = meta.policy_version
        self.policy.eval()


def _reward_tensors(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards [B] float (0 where unscored), groups [B] long, valid [B] bool.

    groups[b] numbers `trajs[b].group` (the engine's group: one per row of the step, unique even
    when a step wraps around the dataset and meets a row again).
    """
    rewards = torch.tensor([t.reward if t.reward is not None else 0.0 for t in trajs], dtype=torch.float32)
    numbers: dict[str, int] = {}
    groups = torch.tensor([numbers.setdefault(t.group, len(numbers)) for t in trajs], dtype=torch.long)
    valid = torch.tensor([t.reward is not None for t in trajs], dtype=torch.bool)
    return rewards, groups, valid


def _rename_groups(trajs: list[Trajectory], names: list[str], group_size: int) -> None:
    """Give a rank's row-major trajectories their groups' names in the whole step (`names`, one
    per row of this rank's share) and ids `<group>-<k>`, as one process's engine would."""
    for i, t in enumerate(trajs):
        t.group = names[i // group_size]
        t.id = f"{t.group}-{i % group_size}"


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, file=sys.stderr, desc="train", unit="step", dynamic_ncols=True)
