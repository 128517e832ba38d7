"""A Trajectory as verl's AgentLoopOutput fields, and a verl row as the env's row."""

from __future__ import annotations

import json

import numpy as np

from rlfactory.integrations.verl.output import trajectory_fields
from rlfactory.integrations.verl.rollout import env_row
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory


def traj(status="ok") -> Trajectory:
    t = Trajectory(id="t", group="g", status=status, turns=2, metrics={"tool_s": 0.25})
    t.segments = [Segment("prompt", [1, 2, 3]), Segment("model", [10, 11], logprobs=[-0.5, -1.5]),
                  Segment("observation", [20, 21, 22]), Segment("model", [12], logprobs=[-0.25])]
    t.tool_calls = [ToolCallRecord("add", {"a": 1}, "ok", 0.1, turn=1), ToolCallRecord("div", {}, "error", 0.2, turn=1)]
    return t


def test_prompt_response_mask_and_logprobs_line_up_with_the_trajectory():
    t = traj()
    f = trajectory_fields(t, generate_s=1.5, num_preempted=None, with_logprobs=True)
    assert f.prompt_ids == [1, 2, 3] and f.prompt_ids + f.response_ids == t.input_ids
    assert f.response_mask == [1, 1, 0, 0, 0, 1] == t.loss_mask[3:]
    assert f.response_logprobs == [-0.5, -1.5, 0.0, 0.0, 0.0, -0.25]
    assert f.num_turns == 1 + 2 + 1  # verl counts the user turn, the model turns and the tool turn
    assert f.metrics == {"generate_sequences": 1.5, "tool_calls": 0.25, "num_preempted": -1}
    e = f.extra_fields
    assert (e["rlfactory_status"], e["rlfactory_error"], e["rlfactory_turns"]) == ("ok", None, 2)
    assert e["rlfactory_tool_statuses"] == {"ok": 1, "error": 1}
    assert [c["name"] for c in e["rlfactory_tool_calls"]] == ["add", "div"]
    assert "rlfactory_trajectory" not in e and "reward_score" not in f.as_kwargs()
    kept = trajectory_fields(t, generate_s=0, num_preempted=2, with_logprobs=False, keep_trajectory=True)
    assert kept.response_logprobs is None and kept.metrics["num_preempted"] == 2
    assert Trajectory.from_json(kept.extra_fields["rlfactory_trajectory"]).input_ids == t.input_ids


def test_an_infra_error_trajectory_is_masked_out_and_says_why():
    t = traj("infra_error")
    t.error = "add: crashed: server died"
    f = trajectory_fields(t, generate_s=0, num_preempted=None, with_logprobs=True)
    assert f.response_mask == [0] * 6 and f.prompt_ids + f.response_ids == t.input_ids
    assert f.extra_fields["rlfactory_status"] == "infra_error" and "server died" in f.extra_fields["rlfactory_error"]
    kept = trajectory_fields(t, generate_s=0, num_preempted=None, with_logprobs=True, mask_infra_errors=False)
    assert kept.response_mask == t.loss_mask[3:]


def test_the_env_row_comes_from_rlfactory_row_or_from_the_other_columns():
    row = {"id": "r1", "question": "Task 1", "answer": "1", "nested": {"k": [1, 2]}}
    verl_columns = {"rlfactory_row": json.dumps(row), "raw_prompt": np.array([{"role": "user", "content": "x"}]),
                    "agent_name": "rlfactory", "index": np.int64(4), "uid": "u"}
    assert env_row(verl_columns) == row
    plain = {"question": "Q?", "answer": np.int64(7), "tags": np.array(["a", "b"], dtype=object),
             "raw_prompt": np.array([{"role": "user", "content": "Q?"}], dtype=object), "index": np.int64(0),
             "extra_info": {"index": 0}, "data_source": "d", "reward_model": {"ground_truth": "7"}}
    assert env_row(plain) == {"question": "Q?", "answer": 7, "tags": ["a", "b"]}
    chat = {"raw_prompt": np.array([{"role": "user", "content": "hi"}], dtype=object), "data_source": "d"}
    assert env_row(chat) == {"messages": [{"role": "user", "content": "hi"}]}
