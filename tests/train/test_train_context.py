"""A GRPO step of the real loop under `rollout.context: sliding_window` (issue 32): the calculator env
(its MCP server a real subprocess) on tiny:1m, steered by ScriptedPolicy to call `evaluate` twice and
then answer; with a window of one turn the third turn is prompted without the first, so each
episode is two samples. The trainer scores each episode once, trains both samples (the second's
prompt is what the model saw) with the episode's advantage, and logs them."""

from __future__ import annotations

import asyncio
import math
import re

import pytest

from rlfactory.config import RunConfig, load_config
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
from rlfactory.train.loop import Trainer
from rlfactory.train.run import load_env_data
from rlfactory.train.session import open_rollout
from train_fixtures import run_config

pytestmark = pytest.mark.usefixtures("one_thread")


def two_calls_then_answer(ctx: str) -> TurnPlan:
    """Turn 1 evaluates the question's expression, turn 2 the same in parentheses, turn 3 answers
    with the last result: read off the context, which under the window no longer shows turn 1."""
    expr = re.findall(r"What is (.+?)\?", ctx)[-1]
    if "<tool_response>" not in ctx or f'"({expr})"' not in ctx:
        arg = expr if "<tool_response>" not in ctx else f"({expr})"
        call = f'{{"name": "evaluate", "arguments": {{"expression": "{arg}"}}}}'
        return TurnPlan(free=1, forced=f"\n<tool_call>\n{call}\n</tool_call>")
    result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", ctx, re.S)[-1]
    return TurnPlan(free=2, forced=f" <answer>{result}</answer>")


def test_a_grpo_step_trains_the_samples_of_a_sliding_window(tmp_path):
    cfg = load_config(RunConfig, run_config(
        tmp_path, env={"name": "calculator", "options": {"n_train": 8, "n_test": 2}},
        reward={"terms": {"numeric": 1.0, "train_fixtures:low_ids": 1.0}},  # low_ids: spread for GRPO
        rollout={"max_turns": 4, "max_new_tokens": 64, "max_total_tokens": 1024, "mode": "async",
                 "context": "sliding_window", "context_turns": 1},
        algo={"group_size": 2}, trainer={"steps": 1, "prompts_per_step": 2}))

    async def main():
        from transformers import AutoTokenizer

        from rlfactory.tiny import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
        policy = ScriptedPolicy(tok, two_calls_then_answer, tok.convert_tokens_to_ids("<|im_end|>"))
        async with open_rollout(cfg, reward_mode="required", logits_processor=policy) as session:
            trainer = Trainer(cfg, session, session.reward, load_env_data(session.env, "train"))
            return await trainer.step(1)

    metrics, trajs = asyncio.run(main())
    assert len(trajs) == 8 and metrics["traj/samples"] == 2.0 and metrics["batch/kept"] == 8
    assert metrics["status/ok"] == 4  # episodes, not samples
    assert metrics["reward/numeric"] == 1.0 and metrics["accuracy"] == 1.0
    by_episode: dict[str, list] = {}
    for t in trajs:
        by_episode.setdefault(t.info["episode"], []).append(t)
    for first, second in by_episode.values():
        assert (first.id + ".1", first.turns, second.turns) == (second.id, 2, 1)
        assert first.status == second.status == "ok" and first.reward == second.reward
        assert first.reward_terms["numeric"] == 1.0  # scored whole: the answer is in the second sample
        assert first.advantage == second.advantage and first.advantage is not None
        window = second.segments[0].text  # the prompt and turn 2 only
        assert window.count("<tool_call>\n{\"name\": \"evaluate\"") == 1 and window.count("<tool_response>") == 1
        assert second.info["branch"]["reason"].startswith("sliding_window: turn 1 left out")
    assert math.isfinite(metrics["loss/policy"])
