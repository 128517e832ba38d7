"""Turn-level advantage estimators on hand-computed values, and the length-bias test (CPU)."""

import math

import pytest
import torch

from rlfactory.algos import (
    advantage_kind,
    get_advantage,
    gigpo_advantages,
    grpo_advantages,
    turn_grpo_advantages,
    turn_loo_advantages,
    turn_returns,
    turn_token_advantages,
)

T, F = True, False


def close(a, b):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=1e-4), (a, b)


def test_turn_estimators_are_registered_as_kind_turn():
    for name in ("turn_grpo", "gigpo", "turn_loo"):
        assert advantage_kind(name) == "turn"
    assert get_advantage("gigpo") is gigpo_advantages


def test_turn_returns_discount_later_rewards_and_put_the_outcome_on_the_last_turn():
    outcome = torch.tensor([1.0, 0.0, 1.0])
    rewards = torch.tensor([[0.5, 0.0, 0.0], [0.2, 0.0, 0.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[T, T, F], [F, F, F], [T, T, T]])
    # row 0: r' = [0.5, 1] -> [0.5 + 0.5 * 1, 1]; row 1 has no turns; row 2: r' = [1, 0, 1] -> [1.25, 0.5, 1]
    close(turn_returns(outcome, rewards, mask, gamma=0.5), [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.25, 0.5, 1.0]])
    close(turn_returns(outcome, rewards, mask, gamma=0.5, reward_weight=0.0), [[0.5, 1.0, 0.0], [0, 0, 0], [0.25, 0.5, 1.0]])


# rows a, b, c: one group of unequal lengths; d: the same group, infra_error; e: a group of its own
OUT = torch.tensor([1.0, 0.0, 0.0, 50.0, 1.0])
REW = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [9.0, 9.0, 0.0], [1.0, 0.0, 0.0]])
MASK = torch.tensor([[T, T, F], [T, F, F], [T, T, T], [T, T, F], [T, F, F]])
GRP = torch.tensor([0, 0, 0, 0, 1])
VAL = torch.tensor([T, T, T, F, T])


def test_turn_grpo_golden():
    # gamma 0.5: G_a = [1 + 0.5 * 1, 1] = [1.5, 1]; G_b = [0]; G_c = [0 + 0.5 * 1, 1, 0] = [0.5, 1, 0]
    # episode returns 1.5, 0, 0.5: mean 2/3; deviations 5/6, -2/3, -1/6 -> unbiased var 7/12
    expected = [[5 / 6, 1 / 3, 0.0], [-2 / 3, 0.0, 0.0], [-1 / 6, 1 / 3, -2 / 3], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    close(turn_grpo_advantages(OUT, REW, MASK, GRP, VAL, gamma=0.5, norm_by_std=False), expected)
    std = math.sqrt(7 / 12)
    close(turn_grpo_advantages(OUT, REW, MASK, GRP, VAL, gamma=0.5), [[x / std for x in row] for row in expected])


def test_turn_grpo_without_process_rewards_and_discount_is_grpo_on_every_turn():
    adv = turn_grpo_advantages(OUT, REW, MASK, GRP, VAL, gamma=1.0, reward_weight=0.0)
    per_row = grpo_advantages(OUT, GRP, VAL)
    assert torch.allclose(adv, per_row.unsqueeze(-1) * MASK)


def test_gigpo_golden_mean_norm():
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0])
    rewards = torch.zeros(4, 2)
    mask = torch.tensor([[T, T], [T, T], [T, F], [T, T]])
    states = torch.tensor([[0, 1], [0, 1], [0, -1], [0, 2]])  # rows 0 and 1 saw the same results; row 3 others
    groups, valid = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)
    # A_E: R = [1, 0, 1, 0], mean 0.5 -> [0.5, -0.5, 0.5, -0.5]
    # G (gamma 0.5, outcome last): [0.5, 1], [0, 0], [1], [0, 0]
    # anchor 0 (turn 1 of all): [0.5, 0, 1, 0] - 0.375; anchor 1: [1, 0] - 0.5; anchor 2: alone -> 0
    # A = A_E + 0.5 * A_S
    adv = gigpo_advantages(outcome, rewards, mask, groups, valid, states=states, gamma=0.5, step_weight=0.5,
                           norm_by_std=False)
    close(adv, [[0.5 + 0.0625, 0.5 + 0.25], [-0.5 - 0.1875, -0.5 - 0.25], [0.5 + 0.3125, 0.0], [-0.5 - 0.1875, -0.5]])


def test_gigpo_golden_mean_std_norm_and_invalid_rows():
    outcome = torch.tensor([1.0, 0.0, 7.0])
    rewards = torch.zeros(3, 2)
    mask = torch.tensor([[T, T], [T, T], [T, T]])
    states = torch.tensor([[0, 1], [0, 1], [0, 1]])
    groups, valid = torch.zeros(3, dtype=torch.long), torch.tensor([T, T, F])
    # episode [1, 0]: +-0.5 / std sqrt(0.5); every anchor state holds rows 0 and 1 with G [1, 0]: the same
    a = 0.5 / math.sqrt(0.5)
    adv = gigpo_advantages(outcome, rewards, mask, groups, valid, states=states)
    close(adv, [[2 * a, 2 * a], [-2 * a, -2 * a], [0.0, 0.0]])


def test_gigpo_with_process_rewards_sums_them_into_the_episode_reward():
    outcome = torch.tensor([0.0, 0.0])
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[T, T], [T, T]])
    groups, valid = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)
    # R = [1, 0] -> A_E = [0.5, -0.5]; states None: anchor = turn index; G = [[1, 0], [0, 0]]
    # turn 1: [1, 0] -> [0.5, -0.5]; turn 2: [0, 0] -> [0, 0]
    adv = gigpo_advantages(outcome, rewards, mask, groups, valid, norm_by_std=False)
    close(adv, [[1.0, 0.5], [-1.0, -0.5]])


def test_turn_loo_golden():
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0])
    rewards = torch.tensor([[0.5, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    mask = torch.tensor([[T, T, F], [T, F, F], [T, T, F], [T, T, T], [T, F, F]])
    groups = torch.tensor([0, 0, 0, 0, 1])
    valid = torch.ones(5, dtype=torch.bool)
    # G: [1.5, 1], [0], [0, 0], [1, 1, 1]
    # turn 1, others' mean: row0 (0+0+1)/3, row1 (1.5+0+1)/3, row2 the same, row3 1.5/3
    # turn 2 (rows 0, 2, 3): row0 (0+1)/2, row2 (1+1)/2, row3 (1+0)/2
    # turn 3: row 3 alone -> the others' episode returns (1.5+0+0)/3
    expected = [[1.5 - 1 / 3, 1 - 0.5, 0], [-5 / 6, 0, 0], [-5 / 6, -1.0, 0], [1 - 0.5, 1 - 0.5, 1 - 0.5], [0, 0, 0]]
    close(turn_loo_advantages(outcome, rewards, mask, groups, valid), expected)
    # an infra_error row leaves every baseline
    out2 = torch.cat([outcome, torch.tensor([99.0])])
    adv = turn_loo_advantages(out2, torch.cat([rewards, torch.zeros(1, 3)]), torch.cat([mask, torch.tensor([[T, T, T]])]),
                              torch.cat([groups, torch.tensor([0])]), torch.cat([valid, torch.tensor([F])]))
    close(adv, expected + [[0, 0, 0]])


def test_turn_token_advantages_spread_each_turn_over_its_tokens():
    adv = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    token_turn = torch.tensor([[0, 0, -1, 1, -1], [0, -1, -1, -1, -1]])
    close(turn_token_advantages(adv, token_turn), [[1, 1, 0, -2, 0], [0.5, 0, 0, 0, 0]])


def test_turn_estimators_check_shapes():
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        turn_grpo_advantages(OUT, REW[:, 0], MASK[:, 0], GRP, VAL)


# ---- the length-bias test (verl RFC #7244) ------------------------------------------------------

def _synthetic_groups(n_groups: int = 20000, size: int = 8, seed: int = 0):
    """Groups of unequal length where taking another turn is worth exactly as much as stopping.

    Each trajectory decides after turn 1: stop (1 turn, outcome ~ Bernoulli(0.5)) or go on (turn 1
    earns a process reward of 0.3, then a 2nd turn with outcome ~ Bernoulli(0.2)). Both choices
    have an expected return of 0.5, so an unbiased estimator gives turn 1 the same expected
    advantage whether the trajectory went on or stopped."""
    gen = torch.Generator().manual_seed(seed)
    b = n_groups * size
    goes_on = torch.rand(b, generator=gen) < 0.5
    outcome = torch.where(goes_on, (torch.rand(b, generator=gen) < 0.2).float(), (torch.rand(b, generator=gen) < 0.5).float())
    rewards = torch.zeros(b, 2)
    rewards[:, 0] = torch.where(goes_on, 0.3, 0.0)
    mask = torch.stack([torch.ones(b, dtype=torch.bool), goes_on], dim=1)
    groups = torch.arange(n_groups).repeat_interleave(size)
    return outcome, rewards, mask, groups, torch.ones(b, dtype=torch.bool), goes_on


def _mt_grpo_per_turn_index(outcome, rewards, mask, groups, valid):
    """The biased construction: normalise each turn's reward (the outcome on the last turn) by
    its turn index's group mean, then sum the normalised rewards from turn k on."""
    r = rewards.clone()
    n = mask.sum(-1)
    r[torch.arange(len(r)), n - 1] += outcome
    norm = torch.zeros_like(r)
    for k in range(r.shape[1]):
        sel = mask[:, k]
        norm[sel, k] = grpo_advantages(r[sel, k], groups[sel], valid[sel], norm_by_std=False)
    return torch.flip(torch.cumsum(torch.flip(norm * mask, [1]), 1), [1]) * mask


def _length_gap(adv, goes_on):
    """Mean turn-1 advantage of trajectories that went on minus those that stopped."""
    return float(adv[goes_on, 0].mean() - adv[~goes_on, 0].mean())


@pytest.mark.parametrize("estimator", ["turn_loo", "turn_grpo", "gigpo"])
def test_turn_baselines_are_not_biased_toward_longer_or_shorter_episodes(estimator):
    outcome, rewards, mask, groups, valid, goes_on = _synthetic_groups()
    fn = {"turn_loo": lambda *a: turn_loo_advantages(*a),
          "turn_grpo": lambda *a: turn_grpo_advantages(*a, norm_by_std=False),
          "gigpo": lambda *a: gigpo_advantages(*a, norm_by_std=False)}[estimator]
    gap = _length_gap(fn(outcome, rewards, mask, groups, valid), goes_on)
    # the gap's standard error here is about 0.003: 0.015 is 5 of them (seeds 0-2 of 50,000 groups: |gap| <= 0.0024)
    assert abs(gap) < 0.015, gap


def test_dividing_by_the_group_std_tilts_the_choice_when_the_spreads_differ():
    """Why turn_loo has no std option: going on has returns {0.3, 1.3} (var 0.16), stopping {0, 1}
    (var 0.25); the group's std depends on who went on, and the scaled advantages no longer agree
    (about -0.027 on turn_grpo, -0.05 on gigpo; seeds 0-2 of 50,000 groups)."""
    outcome, rewards, mask, groups, valid, goes_on = _synthetic_groups(n_groups=50000)
    assert _length_gap(gigpo_advantages(outcome, rewards, mask, groups, valid), goes_on) < -0.025


def test_the_per_turn_index_construction_fails_the_same_test():
    outcome, rewards, mask, groups, valid, goes_on = _synthetic_groups()
    gap = _length_gap(_mt_grpo_per_turn_index(outcome, rewards, mask, groups, valid), goes_on)
    # its expected gap is 0.3 + 0.2 - E[b_2] - 0.5 = -0.2: each extra turn pays that turn's mean
    assert gap < -0.15, gap
