"""The gateway on rlfactory's tiny:1m model, steered by ScriptedPolicy: the untrained model writes
the tool call an add task needs, then an answer with the tool's result (after `free` sampled
tokens), so real agents can run their loops against it."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import AsyncIterator

from rlfactory.chat import make_tool_manager
from rlfactory.generation.local import LocalGenerator
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
from rlfactory.serve.gateway import Gateway

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "gateway"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


def add_plan(free_answer: int = 0):
    """Call add(a, b) for "Add A and B" once, then answer with the tool's result. A context that
    holds "Summary: ... N" (a rewritten history) answers N at once."""

    def plan(ctx: str) -> TurnPlan:
        summary = re.findall(r"Summary: add gave (-?\d+)", ctx)
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", ctx, re.S)
        if summary or results:
            return TurnPlan(free=free_answer, forced=f"The answer is {(summary or results)[-1]}.")
        a, b = re.findall(r"Add (-?\d+) and (-?\d+)", ctx)[-1]
        call = f'{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}'
        return TurnPlan(free=0, forced=f"<tool_call>\n{call}\n</tool_call>")

    return plan


def tool_manager(tokenizer):
    return make_tool_manager(tokenizer, "qwen3")


def scripted_generator(model, tokenizer, plan, seed: int = 0) -> LocalGenerator:
    tm = tool_manager(tokenizer)
    policy = ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return LocalGenerator(model, tokenizer.pad_token_id or 0, tm.stop_token_ids(), tokenizer=tokenizer,
                          logits_processor=policy, seed=seed)


@contextlib.asynccontextmanager
async def serving(model, tokenizer, plan=None, **kwargs) -> AsyncIterator[Gateway]:
    """A started Gateway (loopback, free port) over the scripted tiny model."""
    generator = scripted_generator(model, tokenizer, plan or add_plan())
    gateway = Gateway(generator, tool_manager(tokenizer), tokenizer, model_name="tiny", max_new_tokens=64, **kwargs)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()
        generator.close()


def scripted_add(tokenizer):
    """`rlfactory gateway --logits-processor gateway_fixtures:scripted_add` (run from tests/)."""
    return ScriptedPolicy(tokenizer, add_plan(), tokenizer.convert_tokens_to_ids("<|im_end|>"))
