"""Turn-level advantage estimators: one advantage per model turn, without a critic.

Every estimator of kind "turn" is a pure function

    fn(outcome [B] float, turn_rewards [B, K] float, turn_mask [B, K] bool, groups [B] long,
       valid [B] bool, *, <options>) -> advantages [B, K] float

Row i has turns 0..K_i-1 (`turn_mask[i, :K_i]` True, the rest False); `turn_rewards[i, k]` is turn
k's own (process) reward, `outcome[i]` the trajectory's reward. `groups` and `valid` are as for the
outcome estimators (advantages.py): an invalid row is out of every baseline and gets 0, and so does
a row whose group has fewer than 2 valid members. Advantages are 0 where `turn_mask` is False.
The options a trainer passes (each estimator takes those it names): `gamma` (the discount per
turn, config `algo.turn_gamma`), `reward_weight` (process rewards against the outcome,
`algo.turn_reward_weight`), `norm_by_std` (turn_grpo and gigpo, `algo.turn_norm_by_std`),
`step_weight` (GiGPO's omega, `algo.turn_step_weight`) and `states` ([B, K] long anchor-state
ids, GiGPO).

`turn_token_advantages` spreads [B, K] over the tokens of each turn ([B, T]).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlfactory.algos.advantages import TURN, _group_stats, grpo_advantages, register_advantage


def _check(outcome: Tensor, turn_rewards: Tensor, turn_mask: Tensor, groups: Tensor, valid: Tensor) -> None:
    b = outcome.shape[0]
    if outcome.dim() != 1 or groups.shape != (b,) or valid.shape != (b,):
        raise ValueError(f"outcome, groups, valid must be [B]; got {outcome.shape}, {groups.shape}, {valid.shape}")
    if turn_rewards.dim() != 2 or turn_rewards.shape[0] != b or turn_mask.shape != turn_rewards.shape:
        raise ValueError(f"turn_rewards and turn_mask must be [B, K] with B={b}; "
                         f"got {turn_rewards.shape}, {turn_mask.shape}")


def turn_returns(outcome: Tensor, turn_rewards: Tensor, turn_mask: Tensor, gamma: float = 1.0,
                 reward_weight: float = 1.0) -> Tensor:
    """Each turn's discounted return G[i, k] = r'[i, k] + gamma * G[i, k+1], where
    r'[i, k] = reward_weight * turn_rewards[i, k], plus outcome[i] on the row's last turn.
    Shapes: outcome [B], turn_rewards [B, K], turn_mask [B, K] bool -> [B, K] (0 where masked)."""
    m = turn_mask.to(turn_rewards.dtype if turn_rewards.is_floating_point() else torch.float32)
    r = reward_weight * turn_rewards.to(m.dtype) * m
    n = turn_mask.sum(-1)
    rows = torch.nonzero(n > 0).squeeze(-1)
    r[rows, n[rows] - 1] += outcome.to(m.dtype)[rows]
    out = torch.zeros_like(r)
    nxt = torch.zeros_like(r[:, 0])
    for k in reversed(range(r.shape[1])):
        nxt = (r[:, k] + gamma * nxt) * m[:, k]
        out[:, k] = nxt
    return out


def _episode_returns(outcome: Tensor, returns: Tensor, turn_mask: Tensor) -> Tensor:
    """[B]: the return from the first turn (the outcome itself for a row without turns)."""
    if not returns.shape[1]:
        return outcome.float()
    return torch.where(turn_mask[:, 0], returns[:, 0], outcome.to(returns.dtype))


@register_advantage("turn_grpo", kind=TURN)
def turn_grpo_advantages(outcome: Tensor, turn_rewards: Tensor, turn_mask: Tensor, groups: Tensor, valid: Tensor, *,
                         gamma: float = 1.0, reward_weight: float = 1.0, norm_by_std: bool = True,
                         eps: float = 1e-6) -> Tensor:
    """Turn-discounted returns with a GRPO baseline: A[i, k] = (G[i, k] - mean) / (std + eps).

    G is `turn_returns` (the turn's own reward plus gamma times the later ones, the outcome on the
    last turn). mean and std (unbiased) are the group's statistics of the same quantity at the
    episode level, G[j, 0] over its valid members, each trajectory counted once (a long episode
    weighs no more in the baseline than a short one). `norm_by_std=False`: mean only (Dr. GRPO).
    With gamma=1 and reward_weight=0 every turn gets GRPO's advantage of the outcome.
    Shapes: as the module says; -> [B, K].
    """
    _check(outcome, turn_rewards, turn_mask, groups, valid)
    g = turn_returns(outcome, turn_rewards, turn_mask, gamma, reward_weight)
    ep = _episode_returns(outcome, g, turn_mask)
    _, count, total, var = _group_stats(ep, groups, valid)
    adv = g - (total / count.clamp(min=1.0)).unsqueeze(-1)
    if norm_by_std:
        adv = adv / (var.sqrt() + eps).unsqueeze(-1)
    keep = (valid & (count >= 2)).unsqueeze(-1) & turn_mask
    return torch.where(keep, adv, torch.zeros_like(adv))


def _anchor_ids(groups: Tensor, states: Tensor) -> Tensor:
    """[B, K] long: one id per distinct (group, state) pair."""
    pairs = torch.stack([groups.unsqueeze(-1).expand_as(states), states], dim=-1).reshape(-1, 2)
    _, idx = torch.unique(pairs, dim=0, return_inverse=True)
    return idx.view(states.shape)


@register_advantage("gigpo", kind=TURN)
def gigpo_advantages(outcome: Tensor, turn_rewards: Tensor, turn_mask: Tensor, groups: Tensor, valid: Tensor, *,
                     states: Tensor | None = None, gamma: float = 1.0, reward_weight: float = 1.0,
                     step_weight: float = 1.0, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization"): A = A_E + step_weight * A_S.

    A_E[i] (episode level, every turn of row i): GRPO over the group of the episode's total
    reward R_i = outcome[i] + reward_weight * sum_k turn_rewards[i, k].
    A_S[i, k] (step level): the turn's discounted return G[i, k] (`turn_returns`, discount `gamma`;
    the paper uses 0.95) normalised within its anchor-state group: the turns, over the valid rows
    of the same group, whose `states` id is equal (the trainer gives turns an equal id when they
    saw an identical observation history: the same prompt and the same tool results before them).
    A turn alone in its anchor group gets A_S = 0.
    `norm_by_std`: True is the paper's mean_std_norm ((x - mean) / (std + eps), std unbiased),
    False its mean_norm (x - mean), for both levels, as verl-agent's `mode`. `states` None: every
    turn index of a group is one anchor state (turn k of all members).
    Shapes: states [B, K] long; the rest as the module says; -> [B, K].
    """
    _check(outcome, turn_rewards, turn_mask, groups, valid)
    m = turn_mask.to(torch.float32)
    total = outcome.float() + reward_weight * (turn_rewards.float() * m).sum(-1)
    episode = grpo_advantages(total, groups, valid, norm_by_std=norm_by_std, eps=eps)
    if states is None:
        states = torch.arange(turn_mask.shape[1], device=turn_mask.device).expand_as(turn_mask)
    if states.shape != turn_mask.shape:
        raise ValueError(f"states must be [B, K] like turn_mask; got {states.shape}")
    g = turn_returns(outcome, turn_rewards, turn_mask, gamma, reward_weight)
    member = turn_mask & valid.unsqueeze(-1)
    if member.any():
        anchors = _anchor_ids(groups, states.long())
        # non-members go to a group of their own (-1 -> one past the last id) that is never read
        flat = torch.where(member, anchors, torch.full_like(anchors, int(anchors.max()) + 1)).reshape(-1)
        step = grpo_advantages(g.reshape(-1), flat, member.reshape(-1), norm_by_std=norm_by_std, eps=eps).view(g.shape)
    else:
        step = torch.zeros_like(g)
    adv = episode.unsqueeze(-1) + step_weight * step
    return torch.where(member, adv, torch.zeros_like(adv))


@register_advantage("turn_loo", kind=TURN)
def turn_loo_advantages(outcome: Tensor, turn_rewards: Tensor, turn_mask: Tensor, groups: Tensor, valid: Tensor, *,
                        gamma: float = 1.0, reward_weight: float = 1.0) -> Tensor:
    """A length-unbiased per-turn baseline: A[i, k] = G[i, k] - b[i, k], G as `turn_returns`.

    b[i, k] is the mean of G[j, k] over the *other* valid rows j of the group that have a turn k
    (leave-one-out, per turn index); when none has, the mean of the others' episode returns G[j, 0].
    Why this is not biased toward long (or short) episodes: the baseline of row i's turn k is made
    of other trajectories only, so it cannot depend on how many turns row i goes on to take, and the
    return G[i, k] is compared with one baseline. MT-GRPO's construction (normalise each turn's
    reward by its turn index's group statistics, then sum the normalised rewards into a return)
    subtracts one baseline per remaining turn of row i's own: a hidden bonus or penalty on every
    further turn, which the policy controls (verl RFC #7244). tests/algos shows on synthetic groups
    of unequal length that the advantage of "take another turn" and "stop" agree when their
    expected returns do, and that the MT-GRPO construction fails that test.
    There is deliberately no division by the group's standard deviation: that scale is computed
    from the same returns, and where going on and stopping differ in the spread of their returns
    it tilts the advantage toward one of them (the test measures it on turn_grpo with its std).
    Shapes: as the module says; -> [B, K].
    """
    _check(outcome, turn_rewards, turn_mask, groups, valid)
    g = turn_returns(outcome, turn_rewards, turn_mask, gamma, reward_weight)
    ep = _episode_returns(outcome, g, turn_mask)
    gidx, count, ep_total, _ = _group_stats(ep, groups, valid)
    n_groups = int(gidx.max()) + 1 if gidx.numel() else 0
    member = turn_mask & valid.unsqueeze(-1)
    mf = member.to(g.dtype)
    # per (group, turn index): how many valid rows have the turn, and their returns' sum
    k_count = torch.zeros((n_groups, g.shape[1]), dtype=g.dtype, device=g.device).index_add_(0, gidx, mf)
    k_total = torch.zeros_like(k_count).index_add_(0, gidx, g * mf)
    others_k = k_count[gidx] - mf
    base_k = (k_total[gidx] - g * mf) / others_k.clamp(min=1.0)
    v = valid.to(g.dtype)
    others = (count - v).unsqueeze(-1)
    base_ep = ((ep_total - ep * v).unsqueeze(-1) / others.clamp(min=1.0)).expand_as(g)
    adv = g - torch.where(others_k > 0, base_k, base_ep)
    keep = member & (count >= 2).unsqueeze(-1)
    return torch.where(keep, adv, torch.zeros_like(adv))


def turn_token_advantages(turn_advantages: Tensor, token_turn: Tensor) -> Tensor:
    """Spread per-turn advantages over tokens: out[b, t] = turn_advantages[b, token_turn[b, t]],
    0 where token_turn is -1 (prompt, observation and padding tokens).
    Shapes: turn_advantages [B, K] float, token_turn [B, T] long -> [B, T]."""
    if turn_advantages.shape[0] != token_turn.shape[0]:
        raise ValueError(f"rows differ: {turn_advantages.shape} vs {token_turn.shape}")
    if turn_advantages.shape[1] == 0:
        return torch.zeros(token_turn.shape, dtype=turn_advantages.dtype, device=token_turn.device)
    idx = token_turn.clamp(min=0, max=turn_advantages.shape[1] - 1)
    out = torch.gather(turn_advantages, 1, idx)
    return torch.where(token_turn >= 0, out, torch.zeros_like(out))
