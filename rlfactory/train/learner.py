"""The learner: the policy's weights (trained in place), its reference, critic, optimizer and
scheduler, and one step's learning on the trajectories chosen for the loss (`Learner.learn`):

    advantages  (grpo | dr_grpo | rloo | reinforce++; per turn: turn_grpo | gigpo | turn_loo; gae with the critic)
    old_logp    the policy's logprobs before the update (none for a single on-policy pass)
    ref_logp    the reference's (algo.kl_coef > 0)
    update      epochs x minibatches of the clipped policy loss (+ KL, entropy, value loss)

Under torchrun every rank holds its shard of the policy (rlfactory/train/parallel.py) and trains
on its own rows of the whole step's trajectories; `replica` is the full rollout model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfactory.algos.advantages import TURN, advantage_kind, gae_advantages, get_advantage, outcome_to_token_rewards
from rlfactory.train.annotate import annotate_trajectories
from rlfactory.train.staleness import is_weight_stats
from rlfactory.train.batch import TrainBatch, collate, empty_batch, loss_tokens, row_shape
from rlfactory.train.batch_images import PixelSource
from rlfactory.config import RunConfig
from rlfactory.train.critic import Critic
from rlfactory.train.data import step_generator
from rlfactory.train.episodes import episode_advantages
from rlfactory.train.kernels import apply_liger, resolve_kernels
from rlfactory.train.logprobs import batched_logprobs, decoder_and_head
from rlfactory.train.metrics import logprob_mismatch, tensor_stats
from rlfactory.train.model import ReferencePolicy, apply_lora, make_optimizer, make_scheduler
from rlfactory.train.parallel import Parallel, RowLayout
from rlfactory.train.turns import spread_over_tokens, turn_advantages
from rlfactory.train.update import PolicyUpdate, UpdateData
from rlfactory.trajectory import Trajectory


@dataclass
class Learned:
    """What one step's learning gives back."""

    metrics: dict[str, float]
    """adv/*, loss/*, policy/*, critic/*, optim/*, mismatch/*, async/is_* and batch/tokens."""
    train_tokens: float
    """Loss tokens trained on, over all ranks and epochs (perf/train_tokens_per_s)."""


@dataclass
class Advantages:
    """The advantages of the rows this rank trains on, and what the critic computed for them."""

    values: torch.Tensor
    """[B] (outcome and turn estimators spread to [B, Lc]) or [B, Lc] (gae), on the batch's device."""
    metrics: dict[str, float]
    """adv/*: over every rank's kept rows."""
    old_values: torch.Tensor | None = None
    """[B, Lc] the critic's values before the update (gae)."""
    returns: torch.Tensor | None = None
    """[B, Lc] GAE returns (gae)."""


class Learner:
    """Owns the policy side of a run. `model` is the rollout model (the session's), trained in
    place in one process; `pad_id` pads the training batches; `pixels` turns trajectories' images
    into the model's pixel inputs (a vision-language ToolManager; None for text models)."""

    def __init__(self, cfg: RunConfig, model: Any, pad_id: int, parallel: Parallel,
                 pixels: PixelSource | None = None) -> None:
        tr, algo = cfg.trainer, cfg.algo
        self.cfg, self.parallel, self.pad_id, self.pixels = cfg, parallel, pad_id, pixels
        self.device = next(model.parameters()).device
        self.temperature = cfg.sampling.logprob_temperature
        if tr.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # The reference is taken from the freshly loaded weights, before any checkpoint is loaded.
        self.reference = ReferencePolicy(model, lora=False) if algo.kl_coef > 0 and tr.lora is None else None
        if self.reference is not None and self.reference.copy is not None:
            self.reference.copy = parallel.wrap_frozen(self.reference.copy)
        self.replica = model  # the rollout model; the trained policy itself in one process
        lora = apply_lora(model, tr.lora) if tr.lora is not None else None  # injected into `model` in place
        # Resolved on the model as trained (LoRA on lm_head rules out the fused head), patched
        # before FSDP's sharded copy is made, so that the copy carries Liger's switches.
        self.kernels = resolve_kernels(tr.kernels, model, *decoder_and_head(model), self.device)
        if self.kernels.liger:
            apply_liger(model)
        self.policy = lora if lora is not None else parallel.wrap_policy(model)
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
            share_prefix=not tr.gradient_checkpointing, parallel=parallel, kernels=self.kernels,
        )
        self.policy.eval()

    def learn(self, step: int, trajs: list[Trajectory], owners: torch.Tensor, rewards: torch.Tensor,
              groups: torch.Tensor, valid: torch.Tensor, keep: torch.Tensor) -> Learned:
        """Advantages, old/ref logprobs and the update for the kept trajectories; annotates this
        rank's trained trajectories with their logprobs and advantages.

        `trajs` [B] are the whole step's, `owners` [B] the rank that rolled each out, `rewards`,
        `groups`, `valid` [B] as step.py's reward_tensors, `keep` [B] the rows that enter the loss;
        this rank trains on its own kept rows (all of them in one process)."""
        algo, tr = self.cfg.algo, self.cfg.trainer
        idx = torch.nonzero(keep).squeeze(-1)
        own = owners[idx] == self.parallel.rank
        mine = [trajs[i] for i in idx[own].tolist()]
        batch = collate(mine, self.pad_id, self.pixels).to(self.device) if mine else empty_batch(self.device)
        layout = RowLayout(owners[idx], torch.tensor([float(loss_tokens(trajs[i])) for i in idx.tolist()]),
                           self.parallel.rank, self.parallel.world_size,
                           shape=torch.tensor([row_shape(trajs[i]) for i in idx.tolist()], dtype=torch.long).view(-1, 3))
        micro = algo.micro_batch_size
        chunks, passes = self.update.passes(layout, torch.arange(len(layout)), self.device)  # the update's own
        fwd = dict(temperature=self.temperature, bf16=tr.bf16, share_prefix=not tr.gradient_checkpointing, passes=passes,
                   chunks=chunks, kernels=self.kernels)
        old_logp = None if self.update.single_pass(len(layout)) else batched_logprobs(self.policy, batch, micro, **fwd)
        ref_logp = self.reference.logprobs(batch, micro, **fwd) if self.reference is not None else None
        adv = self._advantages(trajs, rewards, groups, valid, idx, own, mine, batch, chunks)
        is_cap = algo.tis_cap if tr.max_staleness > 0 else None
        data = UpdateData(batch, advantages=adv.values, old_logp=old_logp, ref_logp=ref_logp,
                          old_values=adv.old_values, returns=adv.returns, is_cap=is_cap)
        metrics, logp_before = self.update(data, step_generator(tr.seed, step, "minibatch"), layout)
        annotate_trajectories(mine, logp_before, data.advantages)
        out = {**adv.metrics, **metrics}
        sel = batch.loss_mask.bool()
        parts = self.parallel.gather([(logp_before[sel].cpu(), batch.sampler_logprobs[sel].cpu(), batch.num_tokens())])
        train_logp, sampler_logp = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        out.update(logprob_mismatch(train_logp, sampler_logp, torch.ones_like(train_logp)))
        if is_cap is not None:
            out.update(is_weight_stats(train_logp, sampler_logp, torch.ones_like(train_logp), is_cap))
        out["batch/tokens"] = float(sum(p[2] for p in parts))
        return Learned(out, out["batch/tokens"] * algo.epochs)

    def _advantages(self, trajs: list[Trajectory], rewards: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor,
                    idx: torch.Tensor, own: torch.Tensor, mine: list[Trajectory], batch: TrainBatch,
                    chunks: list[torch.Tensor]) -> Advantages:
        """The advantages of `mine` (the kept rows `idx` this rank owns, `own`), from the whole
        step's rewards, groups and valid mask ([B] each)."""
        algo, tr = self.cfg.algo, self.cfg.trainer
        if self.critic is not None:  # gae: per token, from the critic's values
            old_values = self.critic.values(batch, algo.micro_batch_size, tr.bf16, not tr.gradient_checkpointing,
                                            chunks=chunks)
            token_rewards = outcome_to_token_rewards(rewards[idx].to(self.device), batch.loss_mask)
            values, returns = gae_advantages(token_rewards, old_values, batch.loss_mask, algo.gamma, algo.lam)
            return Advantages(values, tensor_stats("adv", values, batch.loss_mask), old_values, returns)
        if advantage_kind(algo.advantage) == TURN:  # one advantage per turn, on its tokens
            turn_adv, turn_mask = turn_advantages(algo, trajs, rewards, groups, valid)
            values = spread_over_tokens(turn_adv[idx][own], mine, batch.loss_mask.shape[1]).to(self.device)
            return Advantages(values, tensor_stats("adv", turn_adv[idx], turn_mask[idx]))
        # a branched episode (gateway) counts once in its group's baseline (episodes.py)
        advantages = episode_advantages(get_advantage(algo.advantage), rewards, groups, valid, trajs)[idx]
        return Advantages(advantages[own].to(self.device), tensor_stats("adv", advantages))
