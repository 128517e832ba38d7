"""One bad row, one bad tool result or one turn with far too many calls costs its own trajectory
at most, never the rollout: rlfactory's tiny Qwen3 model steered by ScriptedPolicy, the qwen3
ToolManager, a real ToolRunner with Python tools, PromptEnv."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from rollout_fakes import one_torch_thread
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.chat import make_tool_manager
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.generation.local import LocalGenerator
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
from rlfactory.tiny import resolve_model
from rlfactory.tools import ToolRunner, function_tool
from rlfactory.trajectory import read_jsonl, write_jsonl

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


def lookup(key: str) -> str:
    """Look a key up in a corpus with broken emoji.

    Args:
        key: what to look up
    """
    if key == "broken":
        return json.loads('"half an emoji: \\ud83d, NUL: \\u0000."')  # what a tool reading bad JSON returns
    if key == "render-fails":
        return "RENDER-FAILS"
    return f"found {key}"


def plan(ctx: str) -> TurnPlan:
    """Task `name`: call lookup(name) `calls` times in one turn (once if not given), then answer."""
    name, calls = re.search(r"Task (\S+) x(\d+)", ctx).groups()
    if "<tool_response>" in ctx:
        return TurnPlan(free=2, forced=" Done.")
    call = json.dumps({"name": "lookup", "arguments": {"key": name}})
    return TurnPlan(free=2, forced="".join(f"\n<tool_call>\n{call}\n</tool_call>" for _ in range(int(calls))))


@pytest.fixture(scope="module")
def tiny():
    path = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), tok


def make_engine(tiny, tm, **rollout):
    model, tok = tiny
    policy = ScriptedPolicy(tok, plan, tok.convert_tokens_to_ids("<|im_end|>"))
    gen = LocalGenerator(model, tok.pad_token_id or 0, tm.stop_token_ids(), tokenizer=tok, logits_processor=policy, seed=0)
    cfg = RolloutConfig(max_new_tokens=600, max_total_tokens=4096, max_observation_tokens=2048, **rollout)
    return RolloutEngine(gen, tm, ToolRunner([function_tool(lookup)]), PromptEnv(max_turns=3), cfg, SamplingConfig(seed=0))


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_bad_text_and_bad_rows_cost_only_their_own_trajectories(tiny, mode, tmp_path):
    _, tok = tiny
    real = make_tool_manager(tok, "qwen3")

    class FailsOnSomeText(type(real)):  # a tool manager whose rendering raises for one result
        def render_observation(self, results):
            if any(r.text == "RENDER-FAILS" for r in results):
                raise RuntimeError("the template choked")
            return super().render_observation(results)

    tm = FailsOnSomeText(tok)
    engine = make_engine(tiny, tm, mode=mode, max_calls_per_turn=3)
    rows = [
        {"id": "plain", "question": "Task plain x1."},
        {"id": "broken", "question": "Task broken x1, asked with half an emoji \ud83d in the row."},
        {"id": "render", "question": "Task render-fails x1."},
        {"id": "many", "question": "Task many x7."},
        {"id": "no-question", "text": "a row PromptEnv cannot read"},
    ]
    trajs = asyncio.run(engine.run(rows, n=2))
    by = {t.id: t for t in trajs}
    for k in range(2):
        plain, broken, render, many, bad = (by[f"{r['id']}-{k}"] for r in rows)
        assert plain.status == "ok" and plain.tool_calls[0].replaced_chars == 0

        # a lone surrogate in the row and in the tool result: U+FFFD in both, counted on the call
        assert broken.status == "ok", broken.error
        assert "half an emoji \ufffd in the row" in broken.segments[0].text
        assert "half an emoji: \ufffd, NUL: \x00." in broken.segments[2].text
        assert broken.tool_calls[0].status == "ok" and broken.tool_calls[0].replaced_chars == 1

        # a rendering error is that trajectory's status, with the reason
        assert render.status == "infra_error" and render.turns == 1
        assert render.error == "rendering the observation raised RuntimeError: the template choked"

        # 7 calls in one turn: 3 run, the model reads that 4 were not
        assert many.status == "ok", many.error
        assert [c.status for c in many.tool_calls] == ["ok"] * 3 + ["not_run"] and many.metrics["calls_not_run"] == 4
        assert many.segments[2].text.count("found many") == 3
        assert "4 more tool call(s) of this turn were not run: at most 3 run per turn" in many.segments[2].text

        # a row the env cannot make a prompt of: its own trajectories are over before they start
        assert bad.status == "infra_error" and bad.segments == [] and bad.turns == 0
        assert bad.error.startswith("the row could not be made into a prompt: ValueError: row has no `messages`")
    write_jsonl(tmp_path / "t.jsonl", trajs, mode="w")  # the row's lone surrogate is in info: still writes
    assert read_jsonl(tmp_path / "t.jsonl") == trajs
