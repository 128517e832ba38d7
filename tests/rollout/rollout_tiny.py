"""Real parts for the rollout engine's end-to-end tests: rlfactory's tiny Qwen3 model and tokenizer,
the qwen3 ToolManager, a real ToolRunner with Python tools and PromptEnv; the untrained model is
steered by ScriptedPolicy (a plan forces tool-call markup after a few freely sampled tokens)."""

from __future__ import annotations

from typing import Callable

from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.chat import make_tool_manager
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
from rlfactory.tiny import resolve_model
from rlfactory.tools import ToolRunner, function_tool


def tiny_parts():
    """Module fixture body: (the tiny:1m model in eval mode, its tokenizer, the qwen3 ToolManager)."""
    path = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tok, make_tool_manager(tok, "qwen3")


def scripted_engine(tiny, tools: list[Callable], plan: Callable[[str], TurnPlan], max_turns: int = 4,
                    **rollout) -> RolloutEngine:
    """A RolloutEngine on `tiny` (tiny_parts()) whose turns follow `plan`, with `tools` as Python
    tools, PromptEnv(max_turns), 64 new tokens a turn, and `rollout` options (e.g. mode=lockstep)."""
    model, tok, tm = tiny
    policy = ScriptedPolicy(tok, plan, tok.convert_tokens_to_ids("<|im_end|>"))
    gen = LocalGenerator(model, tok.pad_token_id or 0, tm.stop_token_ids(), tokenizer=tok, logits_processor=policy, seed=0)
    runner = ToolRunner([function_tool(f) for f in tools])
    cfg = RolloutConfig(max_new_tokens=64, max_total_tokens=2048, **rollout)
    return RolloutEngine(gen, tm, runner, PromptEnv(max_turns=max_turns), cfg, SamplingConfig(temperature=1.0, seed=0))


def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: first
        b: second
    """
    return str(a * b)
