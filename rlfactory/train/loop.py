"""The training run: `Trainer` assembles a run's parts from its config and the open rollout
session, then runs its steps from the last completed one to trainer.steps, with logging,
checkpoints and evaluations (`run`).

One step is step.py's `TrainingStep` (roll out -> score -> select -> learn -> sync -> metrics),
read top to bottom; learner.py holds the policy and its update. With trainer.max_staleness >= 1
the rollouts of later steps overlap each update (async_pipeline.py: the generator then samples
from a copy of the policy, and the loss corrects for the versions that sampled each token); with
0 each step rolls out, then learns.

Under torchrun the trainer runs on every rank with `parallel` (rlfactory/train/parallel.py): each
rank rolls out its share of the rows and trains on its own rows of the sharded policy (step.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfactory.train.session import pad_id_of
from rlfactory.train.async_pipeline import AsyncPipeline, off_policy_generation
from rlfactory.train.checkpoint import (
    CheckpointMeta,
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    set_rng_state,
)
from rlfactory.config import RunConfig
from rlfactory.protocols import HasWeightSync, Session
from rlfactory.train.data import PromptSampler, derive_seed
from rlfactory.train.evaluate import evaluate
from rlfactory.train.learner import Learner
from rlfactory.train.batch_images import PixelSource
from rlfactory.train.model import load_full_weights, load_lora_weights
from rlfactory.train.parallel import Parallel, SingleProcess
from rlfactory.train.runlog import RunLog
from rlfactory.train.signal import SignalWatch, step_signal
from rlfactory.train.step import Progress, TrainingStep, reseed_generation
from rlfactory.train.weight_sync import make_weight_sync
from rlfactory.trajectory import Trajectory

if TYPE_CHECKING:
    from rlfactory.rewards.base import Reward


class Trainer:
    """One run: its learner (the policy, trained in place), its progress and its steps.

    `session` is an open rollout session (rlfactory.train.session.open_rollout, or
    rlfactory.distributed.open_ray_rollout): its `engine` rolls out, its `model` is the policy
    (the local generator samples from it; generation servers and Ray rollout workers get its
    weights after each update through its `weight_sync`), `tokenizer` is saved with every
    checkpoint.
    """

    def __init__(self, cfg: RunConfig, session: Session, reward: Reward, train_rows: list[dict],
                 test_rows: list[dict] | None = None, parallel: Parallel | None = None) -> None:
        self.cfg = cfg
        self.parallel = parallel if parallel is not None else SingleProcess()
        self.session = session
        self.test_rows = test_rows or []
        self.tokenizer = session.tokenizer
        # A vision-language ToolManager turns trajectories' images into pixels.
        tm = session.tool_manager
        self.learner = Learner(cfg, session.model, pad_id_of(session.tokenizer, session.model), self.parallel,
                               pixels=tm if isinstance(tm, PixelSource) else None)
        self.sampler = PromptSampler(train_rows, cfg.trainer.prompts_per_step, cfg.trainer.seed)
        self.progress = Progress()
        # Generators that do not read the policy in place get its weights pushed after updates:
        # the session's own (Ray rollout workers) or the generation servers' weight sync.
        own = session.weight_sync if isinstance(session, HasWeightSync) else None
        weight_sync = own or make_weight_sync(cfg, session.generator)
        self.steps = TrainingStep(cfg, session.engine, session.generator, reward, self.sampler, self.learner,
                                  self.progress, self.parallel, weight_sync)

    async def step(self, step: int) -> tuple[dict[str, float], list[Trajectory]]:
        """Run training step `step` (1-based), synchronously; returns (metrics, its trajectories)."""
        return await self.steps(step)

    # ---- the run ----------------------------------------------------------------------------

    async def run(self, log: RunLog | None) -> list[dict[str, float]]:
        """Steps from the last completed one to trainer.steps, with logging, checkpoints, evals.

        `log` is None on the ranks other than 0 of the FSDP learner (rank 0 writes the logs).

        Resumed at a step whose evaluation was due but never logged (the run was killed during
        it, after the step's checkpoint was written), that evaluation runs first.
        """
        tr, progress = self.cfg.trainer, self.progress
        history = []
        if self._eval_due(progress.step_done) and log is not None and not log.has_eval(progress.step_done):
            await self._evaluate_and_log(log, self.steps)
        steps, pipeline = self.pipelined()
        bar = _progress(tr.steps, progress.step_done, enabled=tr.progress and self.parallel.is_main)
        watch = SignalWatch()  # says so when most groups carry no learning signal for several steps
        try:
            for step in range(progress.step_done + 1, tr.steps + 1):
                metrics, trajs = await pipeline.step(step)
                if log is not None:
                    log.log(step, metrics)
                    if tr.log_trajectories:
                        log.trajectories(step, trajs)
                history.append(metrics)
                if step == tr.steps or (tr.save_every > 0 and step % tr.save_every == 0):
                    self.save()
                if self._eval_due(step) and log is not None:
                    await self._evaluate_and_log(log, steps)
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
            await pipeline.close()
            if bar is not None:
                bar.close()
        return history

    def pipelined(self) -> tuple[TrainingStep, AsyncPipeline]:
        """The run's steps, generating as trainer.max_staleness needs (async_pipeline.py's
        `off_policy_generation`), and the pipeline that runs them (close it after)."""
        tr, progress, policy = self.cfg.trainer, self.progress, self.learner.policy
        generation = off_policy_generation(self.steps.generator, self.steps.weight_sync, policy, progress.version,
                                           tr.max_staleness, self.parallel.world_size, tr.learner_threads,
                                           tr.generator_threads)
        steps = self.steps.generating_with(generation.generator, generation.weight_sync)
        return steps, AsyncPipeline(steps.roll_out, steps.learn, tr.steps, tr.max_staleness, generation, policy,
                                    lambda: progress.version)

    def _eval_due(self, step: int) -> bool:
        """Rank 0 evaluates (on the whole test split, with its full rollout model); the others go on."""
        every = self.cfg.trainer.eval_every
        return every > 0 and step > 0 and step % every == 0 and bool(self.test_rows) and self.parallel.is_main

    async def _evaluate_and_log(self, log: RunLog, steps: TrainingStep) -> None:
        report = await self.evaluate(steps)
        log.log(self.progress.step_done, report["averages"], kind="eval")

    async def evaluate(self, steps: TrainingStep | None = None) -> dict[str, Any]:
        """Greedy rollouts of the test split (its first trainer.eval_limit rows), scored, with the
        current weights and `steps`' engine (default the synchronous one)."""
        steps = steps if steps is not None else self.steps
        tr, progress = self.cfg.trainer, self.progress
        rows = self.test_rows[: tr.eval_limit] if tr.eval_limit else self.test_rows
        if steps.weight_sync is not None:  # e.g. asynchronous training: the generator's copy may lag
            await steps.weight_sync.ensure(self.learner.policy, progress.version)
        reseed_generation(steps.generator, derive_seed(tr.seed, progress.step_done, "eval"))
        report = await evaluate(steps.engine, steps.reward, rows, greedy=True, policy_version=progress.version)
        steps.release_generation_memory()
        return report

    # ---- checkpoints ------------------------------------------------------------------------

    def save(self) -> Path:
        """Write the checkpoint of the last completed step (every rank calls it under torchrun)."""
        tr, learner = self.cfg.trainer, self.learner
        state = {"scheduler": learner.scheduler.state_dict()}
        if learner.critic is not None:
            state["critic"] = learner.critic.state_dict()
        meta = CheckpointMeta(
            step=self.progress.step_done, policy_version=self.progress.version,
            data_position=self.sampler.position(self.progress.step_done), seed=tr.seed, lora=tr.lora is not None,
        )
        if self.parallel.sharded:
            return self.parallel.save_checkpoint(tr.run_dir, meta, learner.policy, learner.replica, self.tokenizer,
                                                 learner.optimizer, state, tr.keep_last)
        state["optimizer"] = learner.optimizer.state_dict()
        return save_checkpoint(tr.run_dir, meta, learner.policy, self.tokenizer, state, tr.keep_last)

    def save_finished_step(self) -> Path | None:
        """On a stop: the checkpoint of the last finished step, unless it exists already; None
        when the weights are past that step (the stop came during an update)."""
        if self.progress.weights_step != self.progress.step_done:
            return None
        last = latest_checkpoint(self.cfg.trainer.run_dir)
        if last is not None and read_meta(last).step == self.progress.step_done:
            return last
        return self.save()

    def restore(self, path: str | Path) -> None:
        """Continue from checkpoint folder `path` (weights, optimizer, scheduler, RNG, position)."""
        learner = self.learner
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
            meta, state = self.parallel.load_checkpoint(path, learner.policy, learner.replica, learner.optimizer)
        else:
            meta, state = load_checkpoint(path)
            (load_lora_weights if meta.lora else load_full_weights)(learner.policy, Path(path) / "model")
            learner.optimizer.load_state_dict(state["optimizer"])
        learner.scheduler.load_state_dict(state["scheduler"])
        if learner.critic is not None and "critic" in state:
            learner.critic.load_state_dict(state["critic"])
        set_rng_state(state["rng"])
        self.progress.step_done = self.progress.weights_step = meta.step
        self.progress.version = meta.policy_version
        learner.policy.eval()


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, file=sys.stderr, desc="train", unit="step", dynamic_ncols=True)
