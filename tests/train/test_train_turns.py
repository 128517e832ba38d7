"""Turn-level credit in the trainer on tiny:1m: process rewards scored per turn and logged, the
turn estimators (turn_grpo, gigpo, turn_loo) with the PPO and GSPO losses, KL, epochs and
minibatches, asynchronous steps (max_staleness); turn_grpo without process rewards trains exactly
as grpo; per-turn advantages land on their own turn's tokens."""

from __future__ import annotations

import json

import pytest
import torch

from rlfactory.cli.main import main
from rlfactory.train.runlog import read_metrics
from rlfactory.train.turns import token_turns, turn_tensors
from train_fixtures import make_traj, run_config

PROCESS = {"turn_terms": {"train_fixtures:turn_low_ids": 0.5, "tool_success": 1.0}}


@pytest.mark.parametrize("variant", ["turn_grpo_ppo", "gigpo_gspo_kl", "turn_loo_epochs_async"])
def test_turn_level_variants_train(tmp_path, variant):
    algo = {
        "turn_grpo_ppo": {"advantage": "turn_grpo", "turn_gamma": 0.9},
        "gigpo_gspo_kl": {"advantage": "gigpo", "loss": "gspo", "kl_coef": 0.1, "clip_low": 3e-4, "clip_high": 4e-4,
                          "loss_agg": "seq-mean-token-mean", "turn_gamma": 0.95, "turn_norm_by_std": False},
        "turn_loo_epochs_async": {"advantage": "turn_loo", "epochs": 2, "minibatch_size": 2, "micro_batch_size": 1},
    }[variant]
    trainer = {"steps": 2 if variant.endswith("async") else 1}
    if variant.endswith("async"):
        trainer["max_staleness"] = 1
    cfg = run_config(tmp_path, algo=algo, trainer=trainer, reward=PROCESS)
    assert main(["train", cfg]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    rec = records[-1]
    assert rec["optim/grad_norm"] > 0 and "adv/mean" in rec
    assert 0.0 <= rec["turn_reward/train_fixtures:turn_low_ids"] <= 1.0 and "turn_reward/mean" in rec
    if variant == "gigpo_gspo_kl":
        assert rec["policy/kl"] >= 0
    if variant == "turn_loo_epochs_async":
        assert rec["optim/updates"] == 4 and "async/staleness_max" in rec
    lines = (tmp_path / "run" / "trajectories" / f"step_{len(records):06d}.jsonl").read_text().splitlines()
    turns = [s for line in lines for s in json.loads(line)["segments"] if s["role"] == "model"]
    assert turns and all("train_fixtures:turn_low_ids" in s["reward_terms"] for s in turns)
    for s in turns:  # a turn's reward is the weighted sum of the terms that applied to it
        expected = 0.5 * s["reward_terms"]["train_fixtures:turn_low_ids"] + s["reward_terms"].get("tool_success", 0.0)
        assert s["reward"] == pytest.approx(expected)


def test_turn_grpo_without_process_rewards_trains_exactly_as_grpo(tmp_path):
    grpo = run_config(tmp_path, "grpo", trainer={"steps": 1})
    turn = run_config(tmp_path, "turn", trainer={"steps": 1}, reward=PROCESS,
                      algo={"advantage": "turn_grpo", "turn_reward_weight": 0.0})
    assert main(["train", grpo]) == 0 and main(["train", turn]) == 0
    (a,), (b,) = read_metrics(tmp_path / "grpo" / "metrics.jsonl"), read_metrics(tmp_path / "turn" / "metrics.jsonl")
    for key in ("loss/policy", "loss/total", "optim/grad_norm", "reward/mean", "policy/entropy"):
        assert a[key] == b[key], key
    assert "turn_reward/mean" not in a and "turn_reward/mean" in b


def test_per_turn_tensors_and_token_columns():
    t = make_traj([("prompt", [1, 2]), ("model", [3, 4]), ("observation", [5]), ("model", [6]), ("observation", [7, 8]),
                   ("model", [9])], "g", "a")
    u = make_traj([("prompt", [1, 2]), ("model", [13]), ("observation", [5]), ("model", [16, 17])], "g", "b")
    v = make_traj([("prompt", [1, 2]), ("model", [23]), ("observation", [9])], "g", "c")
    t.turn_segments()[1].reward = 0.25
    tt = turn_tensors([t, u, v])
    assert tt.mask.tolist() == [[True, True, True], [True, True, False], [True, False, False]]
    assert tt.rewards.tolist() == [[0.0, 0.25, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    # turn 1: one state (the prompt); turn 2 of a and b saw the same observation [5]
    assert tt.states[0, 0] == tt.states[1, 0] == tt.states[2, 0] and tt.states[0, 1] == tt.states[1, 1]
    assert tt.states[0, 2] != tt.states[0, 1]
    # completion columns (after the 2 prompt tokens): a = 3 4 | 5 | 6 | 7 8 | 9
    assert token_turns([t, u], 7).tolist() == [[0, 0, -1, 1, -1, -1, 2], [0, -1, 1, 1, -1, -1, -1]]
    # a trajectory without a prompt: its first token serves as the prompt and is never predicted
    w = make_traj([("model", [3, 4, 5]), ("observation", [6]), ("model", [7])], "g", "w")
    assert token_turns([w], 4).tolist() == [[0, 0, -1, 1]]
    assert torch.equal(token_turns([], 3), torch.zeros((0, 3), dtype=torch.long))
