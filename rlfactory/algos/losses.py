"""Policy losses (behind a registry), value loss, KL to a reference and the entropy bonus.

Every policy loss has the signature

    fn(logp [B,T], old_logp [B,T], advantages [B] or [B,T], mask [B,T], *, clip_low, clip_high,
       dual_clip, agg, norm_constant[, is_weights]) -> (loss: scalar Tensor, metrics: dict[str, float])

`logp` carries the gradient (the current policy), `old_logp` is the policy that sampled the
tokens (the sampler's logprobs, or a recomputation under the same weights), `mask` is 1 on the
model's own tokens. Metrics always hold `clipfrac`, `approx_kl` (k1 of old vs current, a mean
over set tokens) and `ratio_mean`. Losses are to be minimised.

Off-policy data (asynchronous training, trainer.max_staleness >= 1): `old_logp` is then the
proximal policy (the trainer's recomputation under the weights being trained) and the trainer
passes `is_weights` [B,T] = `truncated_is_weights(old_logp, behavior_logp, cap)`, a detached
per-token weight that multiplies the per-token loss before aggregation (decoupled PPO). A loss of
your own must accept `is_weights` to be used with max_staleness >= 1; it is not passed otherwise.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlfactory.algos.utils import agg_loss, entropy_from_logits, masked_mean
from rlfactory.registry import Registry

PolicyLoss = Callable[..., tuple[Tensor, dict[str, float]]]
_POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str, *aliases: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register a policy loss under `name` (and `aliases`)."""
    return _POLICY_LOSSES.register(name, *aliases)


def resolve_policy_loss(name: str) -> str:
    """The registry name of `name`: a registered name as it is; for `module:function` the module is
    imported (registering what it decorates): `function` may be a name registered there, or a
    plain function with the signature above, which is then registered under `module:function`.
    An unknown name is a ConfigError (a ValueError) with the closest and the known names."""
    return _POLICY_LOSSES.resolve(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss named `name` (see `resolve_policy_loss`)."""
    return _POLICY_LOSSES.lookup(name)


def list_policy_losses() -> list[str]:
    return _POLICY_LOSSES.names()


def _token_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.expand_as(mask).to(torch.float32)


def truncated_is_weights(old_logp: Tensor, behavior_logp: Tensor, cap: float) -> Tensor:
    """Per-token behaviour importance weights min(pi_old / pi_behaviour, cap), without gradient.

    old_logp [B,T]: the proximal policy (the trainer's recomputation before the update);
    behavior_logp [B,T]: the sampler's logprobs (the policy version that generated each token).
    This is verl's truncated importance sampling (`tis_imp_ratio_cap`, core_algos.py
    `compute_policy_loss_vanilla`: `clamp(exp(old_log_prob - rollout_log_probs), max=cap)`) and
    the behaviour weight of AReaL's decoupled PPO loss (`ppo_actor_loss_fn`: pi_prox / pi_behave),
    except that AReaL masks tokens whose weight exceeds its `behav_imp_weight_cap` where this
    truncates them to the cap. Returns [B,T] float32 (positions outside the loss mask are
    meaningless; the loss masks them).
    """
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    log_w = (old_logp.detach().float() - behavior_logp.detach().float()).clamp(-20.0, 20.0)
    return torch.exp(log_w).clamp(max=cap)


def _weighted(loss: Tensor, is_weights: Tensor | None) -> Tensor:
    if is_weights is None:
        return loss
    if is_weights.shape != loss.shape:
        raise ValueError(f"is_weights must be [B, T] like logp; got {tuple(is_weights.shape)} for {tuple(loss.shape)}")
    return loss * is_weights.detach().to(loss.dtype)


def _check(logp: Tensor, old_logp: Tensor, mask: Tensor) -> None:
    if not (logp.shape == old_logp.shape == mask.shape) or logp.dim() != 2:
        raise ValueError(f"logp, old_logp, mask must all be [B, T]; got {logp.shape}, {old_logp.shape}, {mask.shape}")


@register_policy_loss("ppo", "vanilla", "ppo_clip")
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_constant: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with a token-level ratio r = exp(logp - old_logp).

    Per token: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); `clip_high` defaults to
    `clip_low` (set it higher for DAPO's clip-higher, e.g. 0.28). `dual_clip` = c > 1 (e.g. 3.0)
    additionally bounds the loss of negative-advantage tokens by -A c (dual-clip PPO).
    Shapes: logp, old_logp, mask [B, T]; advantages [B] or [B, T]. Metrics: clipfrac (tokens
    where the clipped branch is taken), clipfrac_lower (tokens bounded by the dual clip),
    approx_kl, ratio_mean. `is_weights` [B, T] (off-policy data, see the module doc) multiplies
    each token's loss: the decoupled PPO objective -w A min(r, clip(r)) with r against `old_logp`.
    """
    _check(logp, old_logp, mask)
    clip_high = clip_low if clip_high is None else clip_high
    adv = _token_advantages(advantages, mask)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {"clipfrac": float(masked_mean((loss_clipped > loss_unclipped).float(), mask))}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -adv * dual_clip
        lower = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
        metrics["clipfrac_lower"] = float(masked_mean(lower.float(), mask))
    metrics["approx_kl"] = float(masked_mean(-log_ratio.detach(), mask))
    metrics["ratio_mean"] = float(masked_mean(ratio.detach(), mask))
    return agg_loss(_weighted(loss, is_weights), mask, agg, norm_constant), metrics


@register_policy_loss("gspo")
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float | None = 4e-4,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: a sequence-level ratio s = exp(mean over set tokens of (logp - old_logp)).

    s is the geometric mean of the token ratios. Implemented as GSPO-token: each token carries
    the value s (so clipping is decided per sequence) with the gradient of its own logp, i.e.
    s_t = sg[s] * exp(logp_t - sg[logp_t]); with a per-sequence advantage this equals GSPO.
    The clip range is small (paper: 3e-4 / 4e-4). `dual_clip` is not used. Default aggregation
    `seq-mean-token-mean` (the paper's 1/|y| per sequence). Shapes and `is_weights` as
    `ppo_clip_loss` (the weight multiplies each token's loss).
    """
    _check(logp, old_logp, mask)
    del dual_clip
    clip_high = clip_low if clip_high is None else clip_high
    adv = _token_advantages(advantages, mask)
    m = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [B]
    log_s = (logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    s = torch.exp(log_s)
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {
        "clipfrac": float(masked_mean((loss_clipped > loss_unclipped).float(), mask)),
        "approx_kl": float(masked_mean(-log_ratio.detach(), mask)),
        "ratio_mean": float(masked_mean(s.detach(), mask)),
    }
    return agg_loss(_weighted(loss, is_weights), mask, agg, norm_constant), metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_range: float | None = 0.2,
    agg: str = "token-mean",
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped value loss: 0.5 * agg(max((v - R)^2, (clip(v, v_old ± c) - R)^2)).

    values (with gradient), old_values (at sampling time), returns: [B, T]; `clip_range=None`
    gives the plain squared error; `norm_constant` as for the policy loss. Metrics: vf_clipfrac (tokens where the clipped branch is
    larger), vpred_mean.
    """
    err = (values - returns) ** 2
    if clip_range is None:
        loss, frac = err, torch.zeros_like(err)
    else:
        clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err_clipped = (clipped - returns) ** 2
        loss, frac = torch.maximum(err, err_clipped), (err_clipped > err).float()
    metrics = {"vf_clipfrac": float(masked_mean(frac, mask)), "vpred_mean": float(masked_mean(values.detach(), mask))}
    return 0.5 * agg_loss(loss, mask, agg, norm_constant), metrics


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi: [B, T] -> [B, T].

    - `k1`: logp - ref_logp (unbiased, high variance, can be negative).
    - `k2`: 0.5 * (logp - ref_logp)^2.
    - `k3` (low variance, always >= 0): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10].
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind == "k3":
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected k1, k2 or k3")


def kl_loss(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, coef: float, kind: str = "k3", agg: str = "token-mean",
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KL-to-reference loss term: coef * agg(kl_estimate(logp, ref_logp, kind)). Shapes [B, T];
    `norm_constant` as for the policy loss (seq-mean-token-sum-norm).

    Metrics: kl (the aggregated estimate, before the coefficient).
    """
    kl = agg_loss(kl_estimate(logp, ref_logp, kind), mask, agg, norm_constant)
    return coef * kl, {"kl": float(kl.detach())}


def entropy_bonus(
    mask: Tensor,
    coef: float,
    logits: Tensor | None = None,
    entropies: Tensor | None = None,
    agg: str = "token-mean",
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Entropy bonus as a loss term: -coef * agg(entropy) (minimising it raises the entropy).

    Give either `logits` [B, T, V] or precomputed `entropies` [B, T]; mask [B, T]; `norm_constant`
    as for the policy loss (seq-mean-token-sum-norm).
    Metrics: entropy (the aggregated entropy).
    """
    if (logits is None) == (entropies is None):
        raise ValueError("give exactly one of logits or entropies")
    ent = entropy_from_logits(logits) if entropies is None else entropies
    h = agg_loss(ent, mask, agg, norm_constant)
    return -coef * h, {"entropy": float(h.detach())}
