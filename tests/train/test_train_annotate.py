"""The trainer's per-token logprobs and the advantage written onto the logged trajectories."""

from __future__ import annotations

import json

import pytest
import torch

from rlfactory.cli.main import main
from rlfactory.train.annotate import annotate_trajectories
from train_fixtures import make_traj, run_config


def test_trainer_logprobs_land_on_the_model_segments_in_column_order():
    a = make_traj([("prompt", [1, 2, 3]), ("model", [4, 5]), ("observation", [6, 7]), ("model", [8])])
    b = make_traj([("prompt", [1, 2]), ("model", [9, 9, 9])])
    # completion columns: a = 4 5 6 7 8, b = 9 9 9 (padded)
    logp = torch.tensor([[-0.1, -0.2, 0.0, 0.0, -0.5], [-1.0, -2.0, -3.0, 0.0, 0.0]])
    annotate_trajectories([a, b], logp, torch.tensor([0.5, -0.5]))
    assert a.segments[1].trainer_logprobs == pytest.approx([-0.1, -0.2])
    assert a.segments[3].trainer_logprobs == pytest.approx([-0.5])
    assert a.segments[0].trainer_logprobs is None and a.segments[2].trainer_logprobs is None
    assert b.segments[1].trainer_logprobs == pytest.approx([-1.0, -2.0, -3.0])
    assert (a.advantage, b.advantage) == (0.5, -0.5)


def test_token_level_advantages_give_the_mean_over_model_tokens():
    a = make_traj([("prompt", [1]), ("model", [4, 5]), ("observation", [6]), ("model", [8])])
    adv = torch.tensor([[1.0, 2.0, 100.0, 3.0]])  # the observation column is not the model's
    annotate_trajectories([a], torch.zeros(1, 4), adv)
    assert a.advantage == pytest.approx(2.0)


def test_a_trajectory_without_prompt_has_no_logprob_for_its_first_token():
    a = make_traj([("model", [4, 5, 6])])
    annotate_trajectories([a], torch.tensor([[-0.3, -0.4]]), torch.tensor([1.0]))
    assert a.segments[0].trainer_logprobs == [None, pytest.approx(-0.3), pytest.approx(-0.4)]


def test_logged_trajectories_carry_trainer_logprobs_advantages_and_per_tool_metrics(tmp_path):
    cfg = run_config(tmp_path, trainer={"steps": 1})
    assert main(["train", cfg]) == 0
    run = tmp_path / "run"
    trajs = [json.loads(line) for line in (run / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    for t in trajs:
        model = [s for s in t["segments"] if s["role"] == "model"]
        assert model and all(len(s["trainer_logprobs"]) == len(s["token_ids"]) for s in model)
        for s in model:  # the weights before the update sampled these tokens: both logprobs agree
            assert s["trainer_logprobs"] == pytest.approx(s["logprobs"], abs=1e-3)
        assert all(s["trainer_logprobs"] is None for s in t["segments"] if s["role"] != "model")
    advantages = [t["advantage"] for t in trajs]
    assert all(a is not None for a in advantages)
    for g in range(0, len(trajs), 2):  # grpo: advantages of a group sum to zero
        assert advantages[g] + advantages[g + 1] == pytest.approx(0.0, abs=1e-5)
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "time/traj_gen_s" in record and "time/traj_tool_s" in record
    called = {c["name"] for t in trajs for c in t["tool_calls"] if c["name"]}
    for name in called:
        assert record[f"tool/{name}/calls"] >= 1 and f"time/tool/{name}/latency_s" in record


def test_per_tool_metrics_count_calls_errors_timeouts_and_mean_latency():
    from rlfactory.trajectory import ToolCallRecord
    from rlfactory.train.metrics import trajectory_metrics

    a = make_traj([("prompt", [1]), ("model", [2])])
    a.tool_calls = [ToolCallRecord("search", {}, "ok", 0.2), ToolCallRecord("search", {}, "timeout", 1.0),
                    ToolCallRecord("", None, "malformed", 0.0)]
    b = make_traj([("prompt", [1]), ("model", [2])])
    b.tool_calls = [ToolCallRecord("calc", {}, "error", 0.1)]
    m = trajectory_metrics([a, b])
    assert (m["tool/search/calls"], m["tool/search/errors"], m["tool/search/timeouts"]) == (2.0, 1.0, 1.0)
    assert m["time/tool/search/latency_s"] == pytest.approx(0.6)
    assert (m["tool/calc/calls"], m["tool/calc/errors"], m["tool/calc/timeouts"]) == (1.0, 1.0, 0.0)
    assert not any(k.startswith("tool//") for k in m)
