"""Multi-turn conversations: after the model answers, an env's `next_user_turn` supplies the next user
message, which the engine appends as an observation (loss mask 0) and the model goes on. Scripted
turns on the char-level fakes for every branch (all three schedules), then rlfactory's tiny Qwen3
model with the real qwen3 ToolManager for the token contract."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from rollout_fakes import CharToolManager, FakeRunner, RowsEnv, ScriptedGenerator, one_torch_thread
from rollout_tiny import multiply
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.chat import make_tool_manager
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.rollout.observer import RolloutObserver
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
from rlfactory.tiny import resolve_model
from rlfactory.tools import ToolRunner, function_tool
from rlfactory.trajectory import Trajectory

MODES = [("async", "concurrent"), ("lockstep", "concurrent"), ("lockstep", "sequential")]


class UserTurnChars(CharToolManager):
    """CharToolManager that renders a user turn as `\\nU:<text>\\nA:`."""

    def render_user_turn(self, text: str) -> list[int]:
        return self.tok.encode(f"\nU:{text}\nA:")


class ConversationEnv(RowsEnv):
    """The row's `question` opens; its `more` are the next user messages, one after each answer."""

    max_turns = 8

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, int]] = []

    def next_user_turn(self, trajectory: Trajectory) -> str | None:
        done = int(trajectory.metrics.get("user_turns", 0))
        self.asked.append((trajectory.id, trajectory.turns))
        more = trajectory.info.get("more", [])
        return more[done] if done < len(more) else None


def script(ctx: str) -> str:
    """Per user turn: `call` asks for one echo first; every other question is answered at once."""
    question = ctx.rsplit("U:", 1)[1].split("\n", 1)[0]
    since = ctx.rsplit("U:", 1)[1]
    if question.startswith("call") and "\nT:" not in since:
        return 'CALL echo {"text": "%s"}<eot>' % question
    return f"ans {question}<eot>"


def run(rows, n=1, mode=("async", "concurrent"), tm=None, observer=None, env=None, **limits):
    gen = ScriptedGenerator(script)
    env = env or ConversationEnv()
    rollout = RolloutConfig(mode=mode[0], lockstep_tools=mode[1], **limits)
    engine = RolloutEngine(gen, tm or UserTurnChars(), FakeRunner(), env, rollout, SamplingConfig())
    return asyncio.run(engine.run(rows, n, observer=observer)), gen, env


ROW = {"id": "c", "question": "call a", "more": ["b", "call c"]}


@pytest.mark.parametrize("mode", MODES)
def test_user_turns_come_in_order_with_the_right_segments_and_mask(mode):
    rows = [ROW, {"id": "d", "question": "x", "more": ["y"]}]
    trajs, gen, env = run(rows, n=2, mode=mode)
    t = trajs[0]
    assert t.status == "ok" and t.turns == 5 and t.metrics["user_turns"] == 2
    assert [(s.role, s.text) for s in t.segments] == [
        ("prompt", "[echo]U:call a\nA:"),
        ("model", 'CALL echo {"text": "call a"}<eot>'), ("observation", "\nT:echo:call a\nA:"),
        ("model", "ans call a<eot>"), ("observation", "\nU:b\nA:"),
        ("model", "ans b<eot>"), ("observation", "\nU:call c\nA:"),
        ("model", 'CALL echo {"text": "call c"}<eot>'), ("observation", "\nT:echo:call c\nA:"),
        ("model", "ans call c<eot>"),
    ]
    assert t.loss_mask == [int(s.role == "model") for s in t.segments for _ in s.token_ids]
    assert [(c.name, c.arguments["text"], c.turn) for c in t.tool_calls] == [("echo", "call a", 1), ("echo", "call c", 4)]
    # Each request continues the exact token context of the turns before it.
    for req in gen.requests:
        assert req.prompt_ids == next(x.input_ids[: len(req.prompt_ids)] for x in trajs
                                      if x.input_ids[: len(req.prompt_ids)] == req.prompt_ids)
    d = trajs[2]
    assert [s.text for s in d.segments] == ["[echo]U:x\nA:", "ans x<eot>", "\nU:y\nA:", "ans y<eot>"]
    assert d.status == "ok" and d.metrics["user_turns"] == 1
    # The env is asked once per answer: after turns 2, 3 and 5 of c (the last time it has none left).
    assert sorted(k for tid, k in env.asked if tid == "c-0") == [2, 3, 5]


def test_the_observer_sees_each_user_turn_before_its_turn_ends():
    events: list[tuple[str, Any]] = []
    observer = RolloutObserver(
        turn_started=lambda t, r: events.append(("start", t.turns)),
        tools_started=lambda t, calls: events.append(("tools", calls[0].arguments["text"])),
        user_turn=lambda t, text: events.append(("user", text)),
        turn_ended=lambda t: events.append(("end", t.segments[-1].role)))
    run([ROW], observer=observer)
    assert events == [("start", 0), ("tools", "call a"), ("end", "observation"),
                      ("start", 1), ("user", "b"), ("end", "observation"),
                      ("start", 2), ("user", "call c"), ("end", "observation"),
                      ("start", 3), ("tools", "call c"), ("end", "observation"),
                      ("start", 4), ("end", "model")]


def test_a_user_turn_after_the_last_allowed_turn_truncates():
    (t,), _, _ = run([ROW], max_turns=3)
    assert t.status == "truncated" and t.turns == 3
    assert [s.role for s in t.segments][-1] == "model" and t.metrics["user_turns"] == 1


def test_a_user_turn_that_does_not_fit_the_token_budget_truncates():
    (t,), _, _ = run([{"id": "x", "question": "q", "more": ["a long follow-up question " * 4]}], max_total_tokens=40)
    assert t.status == "truncated" and [s.role for s in t.segments] == ["prompt", "model"]


def test_a_family_without_user_turns_ends_the_trajectory_with_one_line():
    (t, plain), _, _ = run([ROW, {"id": "plain", "question": "x"}], tm=CharToolManager())
    assert t.status == "infra_error" and t.turns == 2
    assert "the 'chars' tool manager cannot render a user turn" in t.error and "\n" not in t.error
    assert plain.status == "ok"  # a row without more user turns never asks the family


def test_without_a_next_user_turn_nothing_changes():
    (t,), _, _ = run([{"id": "x", "question": "q"}], env=RowsEnv())
    assert t.status == "ok" and t.turns == 1 and "user_turns" not in t.metrics


def test_an_env_returning_something_else_is_named():
    class Bad(ConversationEnv):
        def next_user_turn(self, trajectory):
            return {"role": "user", "content": "x"}

    with pytest.raises(ValueError, match="next_user_turn returned a dict"):
        run([{"id": "x", "question": "q"}], env=Bad())


# ---- the tiny Qwen3 model, the real qwen3 ToolManager and a real ToolRunner -----------------------

single_thread = pytest.fixture(scope="module")(one_torch_thread)


def plan(ctx: str) -> TurnPlan:
    """Each user turn `times N` calls multiply(N, 2) once, then answers `done N`."""
    n = int(re.findall(r"times (\d+)", ctx)[-1])
    if "<tool_response>" not in ctx.rsplit(f"times {n}", 1)[1]:
        return TurnPlan(free=0, forced=f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {n}, "b": 2}}}}\n</tool_call>')
    return TurnPlan(free=0, forced=f"done {n}")


class TwoQuestions(ConversationEnv):
    def reset(self, row):
        return [{"role": "user", "content": row["question"]}]


def test_tiny_qwen3_conversation_matches_the_chat_template(single_thread):
    path = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tm = make_tool_manager(tok, "qwen3", enable_thinking=False)
    policy = ScriptedPolicy(tok, plan, tok.convert_tokens_to_ids("<|im_end|>"))
    gen = LocalGenerator(model, tok.pad_token_id or 0, tm.stop_token_ids(), tokenizer=tok, logits_processor=policy, seed=0)
    engine = RolloutEngine(gen, tm, ToolRunner([function_tool(multiply)]), TwoQuestions(),
                           RolloutConfig(max_new_tokens=64, max_total_tokens=2048), SamplingConfig(temperature=1.0, seed=0))
    (t,) = asyncio.run(engine.run([{"id": "m", "question": "times 3", "more": ["times 5"]}], 1))
    assert t.status == "ok" and t.turns == 4, (t.status, t.error)
    assert [s.role for s in t.segments] == ["prompt", "model", "observation", "model", "observation", "model",
                                            "observation", "model"]
    user = t.segments[4]
    assert user.text == "\n<|im_start|>user\ntimes 5<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert user.token_ids == tm.render_user_turn("times 5") and user.logprobs is None
    assert [c.arguments for c in t.tool_calls] == [{"a": 3, "b": 2}, {"a": 5, "b": 2}]
    assert "<tool_response>\n10\n</tool_response>" in t.segments[6].text
    # The whole is the chat template's rendering of the conversation, the thinking blocks of the
    # turns before the last user message aside (Qwen3's template drops them; the model saw them).
    text = tok.decode(t.input_ids)
    calls = [f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {n}, "b": 2}}}}\n</tool_call>' for n in (3, 5)]
    conv = [{"role": "user", "content": "times 3"}, {"role": "assistant", "content": calls[0]},
            {"role": "tool", "content": "6"}, {"role": "assistant", "content": "done 3"},
            {"role": "user", "content": "times 5"}, {"role": "assistant", "content": calls[1]},
            {"role": "tool", "content": "10"}, {"role": "assistant", "content": "done 5"}]
    reference = tm.template.render(conv, [s.openai_schema() for s in engine.runner.specs()])
    assert text.replace("<think>\n\n</think>\n\n", "") == reference.replace("<think>\n\n</think>\n\n", "").rstrip("\n")
    assert t.loss_mask == [int(s.role == "model") for s in t.segments for _ in s.token_ids]
