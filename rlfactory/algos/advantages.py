"""Advantage estimators behind a small registry (as verl's `register_adv_est`).

Outcome estimators turn one scalar reward per trajectory into one advantage per trajectory:

    fn(rewards: Tensor[B] float, groups: Tensor[B] long, valid: Tensor[B] bool) -> Tensor[B] float

`groups[i]` says which prompt trajectory i answers (any integer ids). `valid[i]` is False for an
infra_error trajectory: it is left out of its group's baseline and gets advantage 0 (the trainer
also drops it from the loss). A group with fewer than 2 valid members has nothing to compare
against, so its members get 0. Broadcast a [B] advantage over the mask to get token advantages.

Token estimators (GAE) take token-level rewards and values; see `gae_advantages`. Turn estimators
(kind "turn": turn_grpo, gigpo, turn_loo) give each model turn its own advantage from per-turn
rewards, without a critic; see turns.py.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlfactory.algos.utils import masked_whiten
from rlfactory.registry import Registry

OUTCOME = "outcome"
TOKEN = "token"
TURN = "turn"
KINDS = (OUTCOME, TOKEN, TURN)

def _adopt(fn: Callable[..., object], name: str) -> tuple[Callable[..., object], str]:
    """A `module:function` estimator: kind "outcome", or the kind it is registered with already."""
    return fn, next((k for f, k in _ADVANTAGES.values() if f is fn), OUTCOME)


# name -> (estimator, kind)
_ADVANTAGES: Registry[tuple[Callable[..., object], str]] = Registry("advantage estimator", adopt=_adopt)


def register_advantage(name: str, *aliases: str, kind: str = OUTCOME) -> Callable[[Callable], Callable]:
    """Decorator: register an estimator under `name` (and `aliases`). `kind`: "outcome", "token" or "turn"."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")

    def deco(fn: Callable) -> Callable:
        for n in (name, *aliases):
            _ADVANTAGES.add(n, fn, (fn, kind))
        return fn

    return deco


def resolve_advantage(name: str) -> str:
    """The registry name of `name`: a registered name as it is; for `module:function` the module is
    imported (registering what it decorates): `function` may be a name registered there, or a
    plain function, which is then registered under `module:function` (kind "outcome", or the kind
    it is registered with). An unknown name is a ConfigError (a ValueError) with the closest and
    the known names."""
    return _ADVANTAGES.resolve(name)


def get_advantage(name: str) -> Callable[..., object]:
    """The estimator named `name` (see `resolve_advantage`)."""
    return _ADVANTAGES.lookup(name)[0]


def advantage_kind(name: str) -> str:
    """"outcome" (rewards [B] -> advantages [B]), "token" (GAE: needs values and token rewards) or
    "turn" (per-turn rewards -> advantages [B, K], turns.py)."""
    return _ADVANTAGES.lookup(name)[1]


def list_advantages() -> list[str]:
    return _ADVANTAGES.names()


def _group_stats(rewards: Tensor, groups: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per trajectory: (group index, valid count, valid sum, unbiased valid variance) of its group.

    Shapes: rewards [B] float, groups [B] long, valid [B] bool -> four [B] tensors.
    """
    if not (rewards.shape == groups.shape == valid.shape) or rewards.dim() != 1:
        raise ValueError(f"rewards, groups, valid must all be [B]; got {rewards.shape}, {groups.shape}, {valid.shape}")
    _, idx = torch.unique(groups, return_inverse=True)
    g = int(idx.max().item()) + 1 if idx.numel() else 0
    v = valid.to(rewards.dtype)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))  # a NaN reward on an invalid row must not leak
    count = torch.zeros(g, dtype=rewards.dtype, device=rewards.device).index_add_(0, idx, v)
    total = torch.zeros(g, dtype=rewards.dtype, device=rewards.device).index_add_(0, idx, r)
    mean = total / count.clamp(min=1.0)
    sq = (r - mean[idx]) ** 2 * v
    var = torch.zeros(g, dtype=rewards.dtype, device=rewards.device).index_add_(0, idx, sq) / (count - 1).clamp(min=1.0)
    return idx, count[idx], total[idx], var[idx]


def _as_float(rewards: Tensor) -> Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


@register_advantage("grpo")
def grpo_advantages(
    rewards: Tensor, groups: Tensor, valid: Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: (r - group mean) / (group std + eps), std unbiased (n-1) over the valid members.

    `norm_by_std=False` is Dr. GRPO (r - group mean). Shapes: [B] -> [B].
    """
    rewards = _as_float(rewards)
    _, count, total, var = _group_stats(rewards, groups, valid)
    adv = rewards - total / count.clamp(min=1.0)
    if norm_by_std:
        adv = adv / (var.sqrt() + eps)
    keep = valid & (count >= 2)
    return torch.where(keep, adv, torch.zeros_like(adv))


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor) -> Tensor:
    """Dr. GRPO: r - group mean (no std normalisation). Shapes: [B] -> [B]."""
    return grpo_advantages(rewards, groups, valid, norm_by_std=False)


@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor) -> Tensor:
    """RLOO: r - mean of the *other* valid members of the group. Shapes: [B] -> [B]."""
    rewards = _as_float(rewards)
    _, count, total, _ = _group_stats(rewards, groups, valid)
    others = (total - torch.where(valid, rewards, torch.zeros_like(rewards))) / (count - 1).clamp(min=1.0)
    adv = rewards - others
    keep = valid & (count >= 2)
    return torch.where(keep, adv, torch.zeros_like(adv))


@register_advantage("reinforce_plus_plus_baseline", "reinforce++")
def reinforce_pp_baseline_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ with baseline: subtract the group mean, then whiten over the batch.

    The batch mean and (unbiased) std are taken over the trajectories that get an advantage (valid,
    in a group with >= 2 valid members), each counting once. verl whitens over tokens instead,
    which weighs long responses more; broadcast and call `masked_whiten` for that form.
    Shapes: [B] -> [B].
    """
    rewards = _as_float(rewards)
    _, count, total, _ = _group_stats(rewards, groups, valid)
    keep = valid & (count >= 2)
    centered = torch.where(keep, rewards - total / count.clamp(min=1.0), torch.zeros_like(rewards))
    if int(keep.sum()) < 2:
        return torch.zeros_like(rewards)
    return masked_whiten(centered, keep, eps=eps)


@register_advantage("gae", kind=TOKEN)
def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """GAE for PPO with a value head, skipping tokens the policy did not produce.

    rewards, values, mask: [B, T] (mask 1 on model tokens; observation and padding tokens are
    skipped: no TD step is taken across them, so a multi-turn response is one chain of the
    model's own tokens). Returns (advantages [B, T], returns [B, T]), both 0 where mask is 0;
    returns = advantages + values (before whitening); advantages are whitened over the mask when
    `whiten`. Put an outcome reward on the last model token with `outcome_to_token_rewards`.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(f"rewards, values, mask must all be [B, T]; got {rewards.shape}, {values.shape}, {mask.shape}")
    m = mask.to(values.dtype)
    values = values.detach()
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    out = []
    with torch.no_grad():
        for t in reversed(range(rewards.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            gae_t = delta + gamma * lam * last_gae
            next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
            last_gae = gae_t * m[:, t] + (1 - m[:, t]) * last_gae
            out.append(last_gae)
        adv = torch.stack(out[::-1], dim=1) * m
        returns = (adv + values) * m
        if whiten:
            adv = masked_whiten(adv, m)
    return adv, returns


def outcome_to_token_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each trajectory's scalar reward on its last set token: scores [B], mask [B, T] -> [B, T]."""
    m = mask.to(torch.long)
    out = torch.zeros(m.shape, dtype=_as_float(scores).dtype, device=m.device)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = _as_float(scores)[rows]
    return out


def dynamic_sampling_filter(rewards: Tensor, groups: Tensor, valid: Tensor | None = None, atol: float = 1e-6) -> Tensor:
    """DAPO dynamic sampling: keep mask [B] bool that drops every group whose rewards all agree.

    A group is kept when its valid members' rewards differ by more than `atol` (so a group with
    fewer than 2 valid members is dropped: it carries no learning signal). Kept groups keep all
    their rows, invalid ones included (the trainer drops those by `valid`). Shapes: [B] -> [B].
    """
    rewards = _as_float(rewards)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    _, idx = torch.unique(groups, return_inverse=True)
    g = int(idx.max().item()) + 1 if idx.numel() else 0
    big = torch.finfo(rewards.dtype).max
    hi = torch.full((g,), -big, dtype=rewards.dtype, device=rewards.device)
    lo = torch.full((g,), big, dtype=rewards.dtype, device=rewards.device)
    hi = hi.scatter_reduce(0, idx, torch.where(valid, rewards, torch.full_like(rewards, -big)), reduce="amax")
    lo = lo.scatter_reduce(0, idx, torch.where(valid, rewards, torch.full_like(rewards, big)), reduce="amin")
    spread_ok = (hi - lo) > atol
    return spread_ok[idx]
