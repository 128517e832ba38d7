"""benchmarks/rollout.py's BenchPolicy reads the workload's script from token ids (the task number
once per trajectory, tool responses counted by id) instead of decoding the whole context each turn:
it must force exactly what ScriptedPolicy with the text plan forces, turn after turn."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import AutoTokenizer

from rlfactory.chat import make_tool_manager
from rlfactory.protocols import GenRequest
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.rollout.scripted import ScriptedPolicy
from rlfactory.tiny import resolve_model
from rlfactory.tools.base import ToolResult, ToolSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import rollout as bench  # noqa: E402

LOOKUP = ToolSpec("lookup", "Look something up.", {"type": "object", "properties": {"query": {"type": "string"}}})


def test_bench_policy_forces_what_the_text_plan_forces():
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    tm = make_tool_manager(tok, "qwen3")
    text = ScriptedPolicy(tok, bench.plan, tok.convert_tokens_to_ids("<|im_end|>"))
    ids = bench.BenchPolicy(tok)
    for i in (0, 7, 211, 1234):
        context = tm.render_prompt(PromptEnv().reset({"question": f"Task {i}: look up what you need, then answer."}),
                                   [LOOKUP])
        for turn in range(4):
            req = GenRequest(list(context), 64, session=f"t{i}")
            want = text._turn(req)
            assert ids._turn(req) == want, (i, turn)
            context += tok.encode(" free words", add_special_tokens=False)[:want[0]] + want[1]
            context += tm.render_observation([ToolResult(f"result {i}-{turn}")])
    assert len(ids.tasks) == 4  # each trajectory's question decoded once


def test_ceiling_is_the_latest_first_turn_end_plus_own_tools():
    from types import SimpleNamespace

    trajs = [SimpleNamespace(id="t0-0", metrics={"tool_s": 5.0}), SimpleNamespace(id="t1-0", metrics={"tool_s": 1.0}),
             SimpleNamespace(id="t2-0", metrics={"tool_s": 4.5})]
    secs, t = bench.ceiling(trajs, {"t0-0": 1.0, "t1-0": 2.0, "t2-0": 2.0})
    assert (secs, t.id) == (6.5, "t2-0")  # 2.0 + 4.5 beats 1.0 + 5.0
    assert bench.ceiling(trajs, {}) is None  # the text policy names no sessions
