"""Process rewards: turn terms (built-in and the user's), a model judge per turn behind a real
local OpenAI-shaped HTTP server, composition beside the outcome reward, and their errors."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from rlfactory.config import ConfigError, RewardConfig, validate
from rlfactory.rewards import RuleReward, build_reward, score_many
from rlfactory.rewards.turns import (
    WithTurnRewards,
    apply_turn_scores,
    list_turn_terms,
    turn_term,
    turns_of,
)
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory
from judge_http import send_json, serving


def search_traj(results=("Paris is the capital of France.", "Lyon is a city."), answer="Paris") -> Trajectory:
    """Turn 1 searches and reads results[0]; turn 2 searches (a bad call too) and reads results[1];
    turn 3 answers."""
    segs = [Segment("prompt", [1], "Q: capital of France?\n"),
            Segment("model", [2], '<tool_call>{"name": "search"}</tool_call>', [0.0]),
            Segment("observation", [3], results[0]),
            Segment("model", [4], "<tool_call>two calls</tool_call>", [0.0]),
            Segment("observation", [5], results[1]),
            Segment("model", [6], f"<answer>{answer}</answer>", [0.0])]
    calls = [ToolCallRecord("search", {"query": "capital of France"}, "ok", 0.1, turn=1),
             ToolCallRecord("search", {"query": "x"}, "ok", 0.1, turn=2),
             ToolCallRecord("", None, "malformed", 0.0, turn=2)]
    return Trajectory(id="t0", group="g", segments=segs, tool_calls=calls,
                      info={"id": "q1", "question": "What is the capital of France?", "answer": "Paris"})


def score(reward, trajs):
    return asyncio.run(score_many(reward, trajs))


def test_turns_of_gives_each_model_turn_its_calls_observation_and_context():
    t = search_traj()
    turns = turns_of(t)
    assert [x.index for x in turns] == [1, 2, 3]
    assert [len(x.calls) for x in turns] == [1, 2, 0]
    assert turns[0].observation.text.startswith("Paris") and turns[2].observation is None
    assert turns[1].context == "Q: capital of France?\n" + t.segments[1].text + t.segments[2].text


def test_built_in_turn_terms():
    t = search_traj()
    reward = build_reward(validate(RewardConfig, {"terms": {"exact_match": 1.0},
                                                  "turn_terms": {"tool_success": 1.0, "retrieval_hit": 2.0}}))
    assert isinstance(reward, WithTurnRewards)
    (s,) = score(reward, [t])
    assert s.total == 1.0 and s.terms == {"exact_match": 1.0}  # the outcome as before
    # turn 1: the call ran and its results hold "Paris"; turn 2: a malformed call, results without it; turn 3: no call
    assert [x.terms for x in s.turns] == [{"tool_success": 1.0, "retrieval_hit": 1.0}, {"tool_success": 0.0, "retrieval_hit": 0.0}, {}]
    assert [x.total for x in s.turns] == [3.0, 0.0, 0.0]
    # whole words after normalisation: "Parisian" is not "Paris"
    (s2,) = score(reward, [search_traj(results=("The Parisian metro.", "none"))])
    assert s2.turns[0].terms["retrieval_hit"] == 0.0


def test_code_ran_and_sql_ran_look_at_their_own_tool():
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], "a", [0.0]), Segment("observation", [3], "o"),
            Segment("model", [4], "b", [0.0]), Segment("observation", [5], "o"), Segment("model", [6], "c", [0.0])]
    calls = [ToolCallRecord("python", {"code": "print(1)"}, "ok", 0.1, turn=1),
             ToolCallRecord("sql", {"query": "SELEC"}, "error", 0.1, turn=2), ToolCallRecord("python", {}, "timeout", 5.0, turn=2)]
    t = Trajectory(id="t", group="g", segments=segs, tool_calls=calls)
    reward = build_reward(validate(RewardConfig, {"turn_terms": {"code_ran": 1.0, "sql_ran": 1.0},
                                                  "turn_options": {"sql_ran": {"tool": "sql"}}}),
                          default=RuleReward({"format": 1.0}))
    (s,) = score(reward, [t])
    assert [x.terms for x in s.turns] == [{"code_ran": 1.0}, {"code_ran": 0.0, "sql_ran": 0.0}, {}]


def test_apply_turn_scores_keeps_the_rollouts_step_term_and_is_idempotent():
    t = search_traj()
    t.turn_segments()[0].reward_terms, t.turn_segments()[0].reward = {"step": 0.25}, 0.25
    reward = build_reward(validate(RewardConfig, {"terms": {"exact_match": 1.0}, "turn_terms": {"tool_success": 0.5}}))
    for _ in range(2):
        (s,) = score(reward, [t])
        apply_turn_scores(t, s.turns)
        assert [seg.reward for seg in t.turn_segments()] == [0.75, 0.0, None]
        assert [seg.reward_terms for seg in t.turn_segments()] == [{"step": 0.25, "tool_success": 1.0}, {"tool_success": 0.0}, None]
    assert Trajectory.from_json(t.to_json()) == t


@turn_term("test_turns:boom")
def boom(trajectory, turn):
    return 1.0 / 0.0 if turn.index == 2 else 1.0


def test_a_turn_term_that_raises_is_named_with_its_turn_and_row():
    reward = build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "turn_terms": {"test_turns:boom": 1.0}}))
    with pytest.raises(ConfigError) as e:
        score(reward, [search_traj()])
    msg = str(e.value)
    assert "test_turns:boom (turn 2)" in msg and "ZeroDivisionError" in msg and "row 'q1'" in msg and "\n" not in msg


@turn_term("test_turns:hostile")
def hostile(trajectory, turn):
    return [float("nan"), "1.0", 1.0][turn.index - 1]


def test_a_turn_term_that_returns_no_finite_number_is_named():
    reward = build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "turn_terms": {"test_turns:hostile": 1.0}}))
    with pytest.raises(ConfigError, match=r"'test_turns:hostile \(turn 1\)'.*returned nan, not a finite number"):
        score(reward, [search_traj()])


def test_turn_term_config_mistakes_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"unknown turn term 'tool_sucess'.*tool_success"):
        build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "turn_terms": {"tool_sucess": 1.0}}))
    with pytest.raises(ConfigError, match="turn_options is set but reward.turn_terms is empty"):
        build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "turn_options": {"tool_success": {}}}))
    with pytest.raises(ConfigError, match="takes no option"):
        build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "turn_terms": {"code_ran": 1.0},
                                             "turn_options": {"code_ran": {"budget": 2}}}))
    with pytest.raises(ValueError, match="reserved"):
        turn_term("step")
    assert {"tool_success", "retrieval_hit", "code_ran", "sql_ran"} <= set(list_turn_terms())


def test_an_outcome_only_config_builds_the_same_reward_as_before():
    reward = build_reward(validate(RewardConfig, {"terms": {"exact_match": 1.0}}))
    assert isinstance(reward, RuleReward)
    (s,) = score(reward, [search_traj()])
    assert s.turns is None


# ---- a model judge per turn, over HTTP ----------------------------------------------------------


class _Judge(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        with self.server.lock:
            self.server.prompts.append(prompt)
        step = prompt.split("The step:\n", 1)[1].split("\n\nWhat the tools returned:", 1)[0]
        reply = "yes" if "search" in step else "no" if "two calls" in step else "I am not sure"
        send_json(self, {"choices": [{"message": {"role": "assistant", "content": reply}}]})


@pytest.fixture
def judge_server():
    with serving(_Judge, prompts=[], lock=threading.Lock()) as srv:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", srv


def test_a_judge_scores_each_turn_in_context(judge_server):
    url, srv = judge_server
    cfg = validate(RewardConfig, {"terms": {"exact_match": 1.0}, "turn_terms": {"tool_success": 1.0},
                                  "turn_judge": {"base_url": url, "model": "judge", "weight": 0.5, "fallback": 0.25}})
    reward = build_reward(cfg)
    a, b = search_traj(), search_traj(answer="Lyon")
    sa, sb = score(reward, [a, b])
    # yes, no, and for the answer turn a reply that does not parse: the fallback 0.25
    assert [x.terms["judge"] for x in sa.turns] == [1.0, 0.0, 0.25]
    assert sa.turns[0].total == pytest.approx(1.0 + 0.5 * 1.0) and sb.total == 0.0
    first = srv.prompts[0]
    assert "What is the capital of France?" in first and "Reference answer: Paris" in first
    assert "Paris is the capital of France." in first  # the turn's own results
    # turns identical in both trajectories (the first two) were asked once: 3 + 1 distinct prompts
    assert len(srv.prompts) == 4
    assert any("What happened before this step:\nQ: capital of France?" in p for p in srv.prompts)
