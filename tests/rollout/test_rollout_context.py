"""`rollout.context` (rlfactory/rollout/context.py) end to end with real parts: rlfactory's tiny
Qwen3 model and tokenizer, the qwen3 ToolManager, a real ToolRunner with Python tools. The untrained
model is steered by ScriptedPolicy (free=0: every turn's text is forced, so what each mode rewrites
is known). For every mode, each sample of a trajectory is exactly what the model was prompted with
(the observer sees each turn's request), and every sampled token is in exactly one sample's loss."""

from __future__ import annotations

import asyncio
import re

import pytest
from rollout_fakes import one_torch_thread
from rollout_tiny import scripted_engine, tiny_parts

from rlfactory.branches import episode_samples
from rlfactory.rollout.context import SUMMARY_INTRO, SUMMARY_REQUEST
from rlfactory.rollout.observer import RolloutObserver
from rlfactory.rollout.scripted import TurnPlan

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)

THINK = "<think>\nI should add.\n</think>\n\n"


tiny = pytest.fixture(scope="module")(tiny_parts)


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return str(a + b)


def summarize(text: str) -> str:
    """Summarize a conversation.

    Args:
        text: the conversation
    """
    return f"SUMMARY({text.count('[call add')} calls)"


def plan_calls(calls: int, think_on: set[int] = frozenset(), summary: str = "Added twice.") -> object:
    """Task N calls add(a=N, b=k) on its k-th turn (k = 1..calls), then answers; turns in
    `think_on` think first. A summary request is answered with `summary`. Counts turns per task
    (one trajectory per task), since a rewritten context no longer shows them all."""
    turns: dict[int, int] = {}

    def plan(ctx: str) -> TurnPlan:
        if ctx.rstrip().endswith("assistant") and SUMMARY_REQUEST in ctx[-400:]:
            return TurnPlan(0, summary)
        n = int(re.search(r"Task (\d+)", ctx).group(1))
        k = turns[n] = turns.get(n, 0) + 1
        think = THINK if k in think_on else ""
        if k <= calls:
            return TurnPlan(0, think + f'<tool_call>\n{{"name": "add", "arguments": {{"a": {n}, "b": {k}}}}}\n</tool_call>')
        return TurnPlan(0, think + f"The answer is {n}.")

    return plan


def rollout(tiny, plan, tools=(add,), rows=1, **cfg):
    """Roll out `rows` tasks once each; returns (trajectories, each trajectory's turn prompts)."""
    engine = scripted_engine(tiny, list(tools), plan, max_turns=6, **cfg)
    prompts: dict[str, list[list[int]]] = {}
    observer = RolloutObserver(turn_started=lambda t, req: prompts.setdefault(t.id, []).append(list(req.prompt_ids)))
    trajs = asyncio.run(engine.run([{"id": f"r{n}", "question": f"Task {n}: add."} for n in range(rows)], 1,
                                   observer=observer))
    return trajs, prompts


def check_samples(traj, prompts) -> list:
    """Each sample's context before each of its model turns is that turn's request prompt; every
    model segment of the episode is in exactly one sample; the samples share the episode's end."""
    samples = episode_samples(traj)
    turn = 0
    for s in samples:
        for j, seg in enumerate(s.segments):
            if seg.role == "model":
                assert [t for x in s.segments[:j] for t in x.token_ids] == prompts[traj.id][turn], (s.id, turn)
                turn += 1
        assert (s.status, s.info["episode"], s.info["samples"]) == (traj.status, traj.id, len(samples))
    assert turn == traj.turns == len(prompts[traj.id])
    assert sum(sum(s.loss_mask) for s in samples) == sum(traj.loss_mask)
    assert [b.prompt_ids for b in traj.branches] == [s.segments[0].token_ids for s in samples[1:]]
    return samples


def test_keep_is_one_sequence(tiny):
    [t], prompts = rollout(tiny, plan_calls(2, think_on={1}))
    assert t.status == "ok" and t.turns == 3 and t.branches == [] and "samples" not in t.metrics
    assert episode_samples(t) == [t]
    assert prompts[t.id][-1] == t.input_ids[: len(prompts[t.id][-1])]


def test_sliding_window_keeps_the_prompt_and_the_last_turns(tiny):
    [t], prompts = rollout(tiny, plan_calls(3), context="sliding_window", context_turns=1)
    assert t.status == "ok" and t.turns == 4, (t.status, t.error)
    s0, s1, s2 = check_samples(t, prompts)
    assert t.metrics["samples"] == 3.0
    prompt = t.segments[0].token_ids
    # sample 1 is prompt + turn 2 (its call and result), as sampled; sample 2 prompt + turn 3
    assert s1.segments[0].token_ids == prompt + t.segments[3].token_ids + t.segments[4].token_ids
    assert s2.segments[0].token_ids == prompt + t.segments[5].token_ids + t.segments[6].token_ids
    assert [s.turns for s in (s0, s1, s2)] == [2, 1, 1]
    assert '"b": 1' not in s1.segments[0].text and '"b": 2' in s1.segments[0].text
    diff = s1.info["branch"]["first_diff"]  # inside turn 2's call, where it first differs from turn 1's
    assert len(prompt) < diff < len(prompt) + len(t.segments[1].token_ids)
    assert s1.info["branch"]["reason"].startswith(f"sliding_window: turn 1 left out; history rewritten: at token "
                                                  f"{diff} sample 0 has")
    assert [c.arguments["b"] for c in s0.tool_calls] == [1, 2] and [c.arguments["b"] for c in s1.tool_calls] == [3]


def test_drop_thinking_branches_only_where_thinking_was_dropped(tiny):
    [t], prompts = rollout(tiny, plan_calls(2, think_on={1}), context="drop_thinking")
    assert t.status == "ok" and t.turns == 3, (t.status, t.error)
    s0, s1 = check_samples(t, prompts)  # turn 2 did not think: its re-rendering is what was sampled
    assert "<think>" in s0.model_text() and "<think>" not in s1.segments[0].text
    assert s1.segments[0].text.endswith('{"a": 0, "b": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
                                        '1\n</tool_response><|im_end|>\n<|im_start|>assistant\n')  # turn 1's call, its result
    assert "'<think>" in s1.info["branch"]["reason"] and s1.info["branch"]["reason"].startswith("drop_thinking")
    # a rollout that never thinks is never rewritten
    [t], prompts = rollout(tiny, plan_calls(2), context="drop_thinking")
    assert t.status == "ok" and t.branches == [] and t.input_ids[: len(prompts[t.id][-1])] == prompts[t.id][-1]


def test_summarize_by_the_policy_when_the_context_passes_its_budget(tiny):
    [t], prompts = rollout(tiny, plan_calls(3), context="summarize", summarize_at=340)
    assert t.status == "ok" and t.turns == 4, (t.status, t.error)
    samples = check_samples(t, prompts)
    assert len(samples) == 3  # turn 1 fits; after turns 2 and 3 the turns before the last are summarised
    first = samples[1].segments[0].text
    # the env's messages, the summary, then the last turn (turn 2: its call and result) re-rendered
    assert SUMMARY_INTRO + "Added twice." in first and first.count("<tool_response>") == 1
    assert first.endswith('"b": 2}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response>'
                          '<|im_end|>\n<|im_start|>assistant\n') and '"b": 1}' not in first
    assert samples[1].info["branch"]["reason"].startswith("summarize: the context (")
    # the summary's own tokens are context, never trained: no sample's model text holds them
    assert all("Added twice." not in s.model_text() for s in samples)


def test_summarize_by_a_tool(tiny):
    [t], prompts = rollout(tiny, plan_calls(3), tools=(add, summarize), context="summarize", summarize_at=400,
                           summary_tool="summarize")
    assert t.status == "ok", (t.status, t.error)
    samples = check_samples(t, prompts)
    # the tool got the turns before the last as text: turn 1's call (then the summary and turn 2's)
    assert len(samples) == 3 and [SUMMARY_INTRO + "SUMMARY(1 calls)" in s.segments[0].text for s in samples[1:]] == [True] * 2


def test_a_summary_tool_that_is_not_there_is_named_when_the_engine_is_built(tiny):
    from rlfactory.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.summary_tool: no tool named 'summarise' \(did you mean "
                                          r"'summarize'\?\); the tools are: add, summarize"):
        scripted_engine(tiny, [add, summarize], plan_calls(1), context="summarize", summary_tool="summarise")
    scripted_engine(tiny, [add], plan_calls(1), context="drop_thinking", summary_tool="summarise")  # not summarising


def test_many_trajectories_at_once_keep_their_own_histories(tiny):
    trajs, prompts = rollout(tiny, plan_calls(3, think_on={1, 3}), rows=4, context="drop_thinking")
    for t in trajs:
        assert t.status == "ok" and len(check_samples(t, prompts)) == 3  # turns 1 and 3 thought


def broken_summarize(text: str) -> str:
    """Summarize a conversation (and fail).

    Args:
        text: the conversation
    """
    raise RuntimeError("summarizer offline")


broken_summarize.__name__ = "summarize"  # offered under the summary tool's name


def test_a_failing_summary_tool_ends_its_trajectory_with_the_reason(tiny):
    [t], _ = rollout(tiny, plan_calls(3), tools=(add, broken_summarize), context="summarize", summarize_at=400,
                     summary_tool="summarize")
    assert t.status == "infra_error" and t.turns == 2
    assert t.error.startswith("rollout.context=summarize: RuntimeError: the summary tool 'summarize' failed (error)")
    assert "summarizer offline" in t.error
