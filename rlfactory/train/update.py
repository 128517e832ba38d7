"""One policy update: epochs x minibatches of the step's trajectories, each an optimizer step.

The loss sees only tokens whose loss mask is 1: every term (policy loss, KL, entropy, value
loss) is reduced with `agg_loss` over `loss_mask`, so prompt, observation and padding positions
contribute exactly zero gradient.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from rlfactory.algos.losses import entropy_bonus, get_policy_loss, kl_loss, truncated_is_weights, value_loss
from rlfactory.train.batch import TrainBatch, filler_batch
from rlfactory.config import AlgoConfig
from rlfactory.train.critic import Critic
from rlfactory.train.kernels import PLAIN, TrainKernels
from rlfactory.train.logprobs import policy_forward
from rlfactory.train.parallel import Parallel, RowLayout, SingleProcess, reduce_weighted


@dataclass
class UpdateData:
    """What one update trains on (rows that enter the loss only)."""

    batch: TrainBatch
    advantages: torch.Tensor
    """[B] (outcome estimators) or [B, Lc] (gae)."""
    old_logp: torch.Tensor | None
    """[B, Lc] logprobs under the weights before the update; None = a single on-policy pass,
    where the current logprobs (detached) are the old ones."""
    ref_logp: torch.Tensor | None = None
    """[B, Lc] reference-model logprobs (only when algo.kl_coef > 0)."""
    old_values: torch.Tensor | None = None
    """[B, Lc] critic values before the update (gae)."""
    returns: torch.Tensor | None = None
    """[B, Lc] GAE returns (gae)."""
    is_cap: float | None = None
    """Off-policy correction (asynchronous training): each token's loss is weighted by
    min(pi_old / pi_behaviour, is_cap), pi_behaviour being the sampler's logprobs
    (`batch.sampler_logprobs`) and pi_old the logprobs before the update; None = no weight."""


@dataclass
class PolicyUpdate:
    """Runs `algo.epochs` passes of minibatch updates; returns averaged metrics."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    algo: AlgoConfig
    max_grad_norm: float = 1.0
    bf16: bool = False
    temperature: float = 1.0
    norm_constant: float | None = None
    """Dr. GRPO's constant for loss_agg=seq-mean-token-sum-norm (e.g. the token budget)."""
    critic: Critic | None = None
    share_prefix: bool = True
    """Run each distinct prompt once per micro-batch (see logprobs.py); off with gradient checkpointing."""
    parallel: Parallel = field(default_factory=SingleProcess)
    """The processes the update runs in (metrics are reduced over them)."""
    kernels: TrainKernels = PLAIN
    """The training forward's kernels (trainer.kernels, resolved by rlfactory/train/kernels.py)."""

    def params(self) -> list[nn.Parameter]:
        ps = [p for p in self.model.parameters() if p.requires_grad]
        if self.critic is not None:
            ps += list(self.critic.parameters())
        return ps

    def passes(self, layout: RowLayout, positions: torch.Tensor,
               device: torch.device | str) -> tuple[list[torch.Tensor], int]:
        """This rank's forward/backward passes over global rows `positions` (its local row indices,
        on `device`; by length or consecutive, as algo says) and how many passes the busiest rank
        makes (the FSDP learner pads to that; one process: its own count)."""
        split = (self.algo.micro_batch_size, self.algo.micro_batch_tokens, self.algo.group_by_length)
        packed = self.kernels.packed  # passes packed without padding: micro_batch_tokens counts real tokens
        chunks = [c.to(device) for c in layout.micro_batches(positions, *split, packed=packed)]
        return chunks, (layout.passes(positions, *split, packed=packed) if layout.world_size > 1 else len(chunks))

    def single_pass(self, n: int) -> bool:
        """True when an update of n rows is one pass of one minibatch (old logprobs = current)."""
        return self.algo.epochs == 1 and (self.algo.minibatch_size or n) >= n

    def __call__(self, data: UpdateData, generator: torch.Generator,
                 layout: RowLayout | None = None) -> tuple[dict[str, float], torch.Tensor]:
        """Update in place; returns (metrics, logp_before [B, Lc]).

        `generator` (CPU) shuffles the minibatches, so the order derives from the caller's seed.
        `logp_before` are the logprobs under the weights before the update: `data.old_logp`, or,
        for a single on-policy pass, those of the forward pass itself (no extra forward).
        `layout` (the FSDP learner): the update's rows across ranks; `data.batch` holds this rank's.
        Every rank forms the same minibatches of the global rows, weighs its micro-batches by the
        global token (or sequence) count and runs as many passes as the busiest rank, so the
        summed gradients equal one process's. Metrics: loss/*, policy/*, critic/*,
        optim/grad_norm, optim/lr, optim/updates.
        """
        layout = layout if layout is not None else RowLayout.single(data.batch)
        n = len(layout)
        device = data.batch.loss_mask.device
        self._seen = torch.zeros(data.batch.loss_mask.shape, dtype=torch.float32, device=device)
        size = self.algo.minibatch_size or n
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        shuffle = self.algo.epochs > 1 or size < n
        self.model.train()
        if self.critic is not None:
            self.critic.train()
        for _ in range(self.algo.epochs):
            order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
            for mb in torch.split(order, size):
                tokens = layout.tokens[mb]
                if float(tokens.sum()) == 0:
                    continue  # nothing to learn from (e.g. only truncated-at-0-token rows)
                totals = (float(tokens.sum()), float((tokens > 0).sum()))
                self.optimizer.zero_grad(set_to_none=True)
                chunks, passes = self.passes(layout, mb, device)
                for idx in chunks:
                    for key, value, w in self._accumulate(data, idx, totals, layout.world_size > 1):
                        sums[key] += value * w
                        weights[key] += w
                for _ in range(passes - len(chunks)):
                    self._filler_pass(device)
                norm = torch.nn.utils.clip_grad_norm_(
                    self.params(), self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
                )
                from torch.distributed.tensor import DTensor  # FSDP2 grad norm; a sys.modules lookup after the first

                grad_norms.append(float(norm.full_tensor() if isinstance(norm, DTensor) else norm))
                self.optimizer.step()
                self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        out = reduce_weighted(self.parallel.gather([(dict(sums), dict(weights))]))
        out["optim/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
        out["optim/updates"] = float(len(grad_norms))
        out["optim/lr"] = float(self.scheduler.get_last_lr()[0])
        return out, (data.old_logp if data.old_logp is not None else self._seen)

    def _micro_weight(self, mask: torch.Tensor, totals: tuple[float, float]) -> float:
        """Share of the minibatch loss that a micro-batch carries, so that accumulating
        micro-batch losses gives the loss of the whole minibatch for every aggregation.
        `totals`: (loss tokens, sequences with loss tokens) of the whole minibatch, all ranks."""
        if self.algo.loss_agg == "token-mean":
            return float(mask.sum()) / totals[0]
        return float((mask.sum(-1) > 0).sum()) / totals[1]

    def _filler_pass(self, device: torch.device) -> None:
        """A forward and backward of weight 0: keeps this rank's collectives in step with a rank
        that has more micro-batches in this minibatch (FSDP all-gathers and reduce-scatters)."""
        logp, _ = policy_forward(self.model, filler_batch(device), temperature=self.temperature, bf16=self.bf16,
                                 share_prefix=self.share_prefix, kernels=self.kernels)
        loss = logp.sum() * 0.0
        if self.critic is not None:
            loss = loss + self.critic(filler_batch(device), self.bf16, self.share_prefix).sum() * 0.0
        loss.backward()

    def _accumulate(self, data: UpdateData, idx: torch.Tensor, totals: tuple[float, float] | None = None,
                    keep_in_step: bool = False):
        """Forward + backward of micro-batch `idx` (local rows); yields (metric, value, weight).

        `totals`: the minibatch's (loss tokens, sequences), default those of `idx` itself. A
        micro-batch without loss tokens is skipped, or with `keep_in_step` replaced by a filler pass."""
        algo = self.algo
        policy_loss = get_policy_loss(algo.loss)
        sub = data.batch.select(idx)
        mask = sub.loss_mask
        if float(mask.sum()) == 0:
            if keep_in_step:
                self._filler_pass(mask.device)
            return
        t = mask.shape[1]
        if totals is None:
            totals = (float(mask.sum()), float((mask.sum(-1) > 0).sum()))
        w = self._micro_weight(mask, totals)
        logp, ent = policy_forward(
            self.model, sub, temperature=self.temperature, bf16=self.bf16,
            with_entropy=True, entropy_grad=algo.entropy_coef != 0, share_prefix=self.share_prefix,
            kernels=self.kernels,
        )
        if data.old_logp is None:
            old = logp.detach()
            self._seen[idx, :t] = old
        else:
            old = data.old_logp[idx, :t]
        adv = data.advantages[idx] if data.advantages.dim() == 1 else data.advantages[idx, :t]
        extra = {}
        if data.is_cap is not None:  # decoupled PPO: the ratio against `old`, times the behaviour weight
            extra["is_weights"] = truncated_is_weights(old, sub.sampler_logprobs, data.is_cap)
        pg, m = policy_loss(
            logp, old, adv, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
            agg=algo.loss_agg, norm_constant=self.norm_constant, **extra,
        )
        loss = pg
        stats = {"loss/policy": float(pg.detach()), "policy/clipfrac": m["clipfrac"],
                 "policy/approx_kl": m["approx_kl"], "policy/ratio_mean": m["ratio_mean"]}
        if algo.kl_coef > 0 and data.ref_logp is not None:
            kl_term, km = kl_loss(logp, data.ref_logp[idx, :t], mask, algo.kl_coef, algo.kl_estimator, algo.loss_agg,
                                  self.norm_constant)
            loss = loss + kl_term
            stats["policy/kl"] = km["kl"]
        ent_term, em = entropy_bonus(mask, algo.entropy_coef, entropies=ent, agg=algo.loss_agg,
                                     norm_constant=self.norm_constant)
        if algo.entropy_coef != 0:
            loss = loss + ent_term
        stats["policy/entropy"] = em["entropy"]
        if self.critic is not None and data.returns is not None and data.old_values is not None:
            values = self.critic(sub, self.bf16, self.share_prefix)
            vl, vm = value_loss(values, data.old_values[idx, :t], data.returns[idx, :t], mask,
                                algo.value_clip, algo.loss_agg, self.norm_constant)
            loss = loss + algo.value_coef * vl
            stats.update({"loss/value": float(vl.detach()), "critic/vf_clipfrac": vm["vf_clipfrac"],
                          "critic/value_mean": vm["vpred_mean"]})
        (loss * w).backward()
        stats["loss/total"] = float(loss.detach())
        for k, v in stats.items():
            yield k, v, w
