"""The gateway's episode recorder (rlfactory/serve/gateway_record.py) on hand-built token ids:
calls whose prompt extends a sample continue it (the delta is an observation), a rewritten
history starts a new sample with the first differing token and why, parallel calls and n > 1
choices fork without training a token twice, and every sample carries the episode's reward."""

from __future__ import annotations

from rlfactory.protocols import GenResult
from rlfactory.branches import first_difference
from rlfactory.serve.gateway_record import BY_AGENT, Episode
from rlfactory.tools.base import ToolCall


def decode(ids):
    return " ".join(f"t{i}" for i in ids)


def turn(ids, lp=-0.5):
    return GenResult(list(ids), [lp] * len(ids), "stop", decode(ids))


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [1]) == 0


def test_calls_that_extend_the_sample_merge_into_one_sequence():
    ep = Episode("k", decode, {"q": 1})
    p1 = [1, 2, 3]
    m = ep.match(p1)
    assert m.index is None and m.branch is None  # the first call: nothing to branch from
    assert ep.record(m, p1, [turn([10, 11])], 4, [[ToolCall("add", {"a": 1})]]) == [0]
    p2 = p1 + [10, 11] + [20, 21]  # the agent appended the tool result: [20, 21] is the observation
    m = ep.match(p2)
    assert m.index == 0
    ep.record(m, p2, [turn([12])], 4, [[]])
    (traj,) = ep.trajectories("g", 3, "ok", 1.0)
    assert traj.id == "g-3" and traj.group == "g" and traj.reward == 1.0
    assert [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.input_ids == p2 + [12]
    assert traj.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert traj.sampler_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert all(s.policy_version == 4 for s in traj.segments if s.role == "model")
    assert traj.info == {"q": 1, "episode": "k", "sample": 0, "samples": 1, "branch": None}
    assert [(c.name, c.status, c.turn) for c in traj.tool_calls] == [("add", BY_AGENT, 1)]
    assert traj.turns == 2


def test_a_rewritten_history_starts_a_new_sample_sharing_the_reward():
    ep = Episode("k", decode)
    p1 = [1, 2, 3]
    ep.record(ep.match(p1), p1, [turn([10, 11])], 0, [[]])
    p2 = [1, 2, 9, 9]  # the agent summarised: token 2 differs
    m = ep.match(p2)
    assert m.index is None and m.branch["from_sample"] == 0 and m.branch["first_diff"] == 2
    assert "history rewritten" in m.branch["reason"] and "'t3 t10 t11'" in m.branch["reason"]
    ep.record(m, p2, [turn([12])], 0, [[]])
    p3 = p2 + [12, 30]  # continuing the new sample
    ep.record(ep.match(p3), p3, [turn([13])], 0, [[]])
    a, b = ep.trajectories("g", 0, "ok", 0.5)
    assert (a.id, b.id) == ("g-0", "g-0.1") and a.reward == b.reward == 0.5
    assert a.input_ids == [1, 2, 3, 10, 11] and b.input_ids == [1, 2, 9, 9, 12, 30, 13]
    assert b.info["branch"]["first_diff"] == 2 and b.info["samples"] == 2
    # every sampled token is in exactly one sample's loss
    assert sum(a.loss_mask) + sum(b.loss_mask) == 4


def test_a_prompt_that_stops_inside_a_sample_says_so():
    ep = Episode("k", decode)
    ep.record(ep.match([1, 2, 3]), [1, 2, 3], [turn([4])], 0, [[]])
    m = ep.match([1, 2])
    assert m.index is None and "shorter than sample 0" in m.branch["reason"]


def test_n_choices_and_parallel_calls_fork_without_training_a_token_twice():
    ep = Episode("k", decode)
    p = [1, 2]
    assert ep.record(ep.match(p), p, [turn([5]), turn([6]), turn([7])], 0, [[], [], []]) == [0, 1, 2]
    # two calls continue sample 0 from the same state; the second to finish forks
    p2 = [1, 2, 5, 40]
    m_a, m_b = ep.match(p2), ep.match(p2)
    ep.record(m_a, p2, [turn([8])], 0, [[]])
    assert ep.record(m_b, p2, [turn([9])], 0, [[]]) == [3]
    trajs = ep.trajectories("g", 1, "ok", 2.0)
    assert [t.id for t in trajs] == ["g-1", "g-1.1", "g-1.2", "g-1.3"]
    assert trajs[1].input_ids == [1, 2, 6] and trajs[1].info["branch"]["reason"] == "choice 1 of an n > 1 call"
    fork = trajs[3]
    assert fork.input_ids == [1, 2, 5, 40, 9] and fork.loss_mask == [0, 0, 0, 0, 1]
    assert "continued by another call" in fork.info["branch"]["reason"]
    trained = sorted(t for tr in trajs for t, m in zip(tr.input_ids, tr.loss_mask) if m)
    assert trained == [5, 6, 7, 8, 9]  # each sampled token once


def test_an_episode_without_calls_is_an_infra_error():
    (t,) = Episode("k", decode).trajectories("g", 0, "ok", 1.0)
    assert t.status == "infra_error" and t.reward is None and "no model call" in t.error
