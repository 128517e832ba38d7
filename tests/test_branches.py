"""rlfactory/branches.py on hand-built trajectories: a trajectory with branches becomes its samples
(each sampled token in exactly one of them, the rewritten history as a prompt), sharing the
episode's reward and status; branches survive the JSON-lines round trip; the branch reason names
the first differing token."""

from __future__ import annotations

from rlfactory.branches import all_samples, branch_reason, episode_samples, extends, first_difference
from rlfactory.trajectory import Branch, Segment, ToolCallRecord, Trajectory


def decode(ids):
    return " ".join(f"t{i}" for i in ids)


def branched() -> Trajectory:
    """prompt [1 2] model [3] obs [4] | branch: prompt [1 9 4] model [5] obs [6] model [7]."""
    segs = [Segment("prompt", [1, 2], "p"), Segment("model", [3], "m1", [-0.1], 0), Segment("observation", [4], "o1"),
            Segment("model", [5], "m2", [-0.2], 0), Segment("observation", [6], "o2"),
            Segment("model", [7], "m3", [-0.3], 0)]
    calls = [ToolCallRecord("add", {"a": 1}, "ok", 0.0, turn=1), ToolCallRecord("add", {"a": 2}, "ok", 0.0, turn=2)]
    return Trajectory("g-0", "g", segs, calls, 3, "ok", 1.0, {"exact": 1.0}, {"question": "q"},
                      branches=[Branch(3, [1, 9, 4], "p'", 1, "sliding_window: turn 1 left out")])


def test_a_branched_trajectory_becomes_its_samples():
    traj = branched()
    s0, s1 = episode_samples(traj)
    assert (s0.id, s1.id) == ("g-0", "g-0.1") and {s0.group, s1.group} == {"g"}
    # sample 0 ends at its last model turn: the observation rewritten into sample 1's prompt is not in it
    assert s0.input_ids == [1, 2, 3] and s0.loss_mask == [0, 0, 1] and s0.turns == 1
    assert s1.input_ids == [1, 9, 4, 5, 6, 7] and s1.loss_mask == [0, 0, 0, 1, 0, 1] and s1.turns == 2
    assert s1.sampler_logprobs == [-0.2, 0.0, -0.3]
    # every sampled token trained exactly once
    assert sum(s0.loss_mask) + sum(s1.loss_mask) == sum(traj.loss_mask)
    assert [(c.arguments, c.turn) for c in s0.tool_calls] == [({"a": 1}, 1)]
    assert [(c.arguments, c.turn) for c in s1.tool_calls] == [({"a": 2}, 1)]
    for s in (s0, s1):
        assert (s.status, s.reward, s.reward_terms) == ("ok", 1.0, {"exact": 1.0})
        assert s.info["episode"] == "g-0" and s.info["samples"] == 2 and s.info["question"] == "q"
    assert s0.info["branch"] is None
    assert s1.info["branch"] == {"from_sample": 0, "first_diff": 1, "reason": "sliding_window: turn 1 left out"}
    assert all_samples([traj, Trajectory("h-0", "h")])[2].id == "h-0"


def test_an_unbranched_trajectory_is_its_own_sample_and_its_line_unchanged():
    t = Trajectory("g-0", "g", [Segment("prompt", [1]), Segment("model", [2], "", [0.0], 0)])
    assert episode_samples(t) == [t] and all_samples([t]) == [t]
    assert "branches" not in t.to_dict()


def test_branches_round_trip_json():
    traj = branched()
    back = Trajectory.from_json(traj.to_json())
    assert back.branches == traj.branches and back == traj
    assert [s.input_ids for s in episode_samples(back)] == [s.input_ids for s in episode_samples(traj)]


def test_branch_reason_names_the_first_difference():
    assert first_difference([1, 2, 3], [1, 5]) == 1 and extends([1, 2, 3], [1, 2]) and not extends([1, 2], [1, 3])
    diff, why = branch_reason([1, 2, 3], [1, 5], decode)
    assert diff == 1 and "'t2 t3'" in why and "'t5'" in why
    diff, why = branch_reason([1, 2, 3], [1, 2], decode, "sample 0")
    assert diff == 2 and "shorter than sample 0" in why
