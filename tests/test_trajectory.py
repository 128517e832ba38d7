"""Trajectory JSON lines round-trip exactly, and the derived tensors follow the segment roles."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory, read_jsonl, write_jsonl

ids = st.lists(st.integers(0, 200_000), max_size=20)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
text = st.text(max_size=30)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | floats | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def segments(draw):
    role = draw(st.sampled_from(["prompt", "model", "observation"]))
    tokens = draw(ids)
    if role == "model":
        lps = draw(st.lists(floats, min_size=len(tokens), max_size=len(tokens)))
        return Segment(role, tokens, draw(text), lps, draw(st.integers(0, 1000)))
    return Segment(role, tokens, draw(text))


records = st.builds(
    ToolCallRecord,
    name=text,
    arguments=json_value,
    status=st.sampled_from(["ok", "error", "timeout", "crashed", "malformed"]),
    latency_s=floats,
    cached=st.booleans(),
    turn=st.integers(0, 10),
    truncated=st.booleans(),
    error=st.none() | text,
)

trajectories = st.builds(
    Trajectory,
    id=text,
    group=text,
    segments=st.lists(segments(), max_size=6),
    tool_calls=st.lists(records, max_size=4),
    turns=st.integers(0, 10),
    status=st.sampled_from(["ok", "truncated", "malformed", "infra_error"]),
    reward=st.none() | floats,
    reward_terms=st.dictionaries(text, floats, max_size=3),
    info=st.dictionaries(text, json_value, max_size=3),
    error=st.none() | text,
    metrics=st.dictionaries(text, floats, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(trajectories)
def test_json_line_round_trips_exactly(t):
    line = t.to_json()
    assert "\n" not in line
    back = Trajectory.from_json(line)
    assert back == t
    assert back.to_json() == line


def test_jsonl_file_round_trip_and_required_fields(tmp_path):
    t = Trajectory(
        id="g-0",
        group="g",
        segments=[
            Segment("prompt", [1, 2, 3], "abc"),
            Segment("model", [4, 5], "de", [-0.25, -1e-9], 7),
            Segment("observation", [6], "f"),
            Segment("model", [7], "g", [-math.pi], 7),
        ],
        tool_calls=[ToolCallRecord("calc", {"expression": "1+1", "nested": [1.5, None]}, "ok", 0.125, True, 1)],
        turns=2,
        status="ok",
        info={"question": "ünïcode ✓", "answer": 2},
    )
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [t, t], mode="w")
    assert read_jsonl(path) == [t, t]
    import json

    d = json.loads(path.read_text().splitlines()[0])
    for key in ("id", "group", "segments", "tool_calls", "turns", "status", "reward"):
        assert key in d
    assert d["reward"] is None
    assert set(d["segments"][1]) >= {"role", "token_ids", "text", "logprobs", "policy_version"}
    assert set(d["tool_calls"][0]) >= {"name", "arguments", "status", "latency_s", "cached"}
    assert t.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert t.sampler_logprobs == [-0.25, -1e-9, 0.0, -math.pi]
    assert t.prompt_len == 3


def test_old_lines_without_new_fields_still_load():
    line = '{"id": "a", "group": "g", "segments": [], "tool_calls": [{"name": "x", "arguments": {}, "status": "ok", "latency_s": 0.1}]}'
    t = Trajectory.from_json(line)
    assert t.metrics == {} and t.tool_calls[0].truncated is False and t.tool_calls[0].error is None
