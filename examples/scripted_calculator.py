"""A scripted policy for the servers example: makes the untrained tiny model call the calculator.

`rlfactory serve tiny:1m --logits-processor scripted_calculator:policy` (run from this folder, or
with it on PYTHONPATH) serves the tiny model with this LocalGenerator logits processor: on its
first turn the model samples two tokens of its own, then the `evaluate` call for the question's
expression is forced; on its second turn it answers `<answer>N</answer>` with the number the
tool returned. Every token is still one forward pass of the real model (see
rlfactory/rollout/scripted.py); only the forced tokens are chosen by the script.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan


def plan(context: str) -> TurnPlan:
    results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", context, re.S)
    if results:
        return TurnPlan(free=0, forced=f"<answer>{results[-1].strip()}</answer>")
    question = re.findall(r"What is (.+?)\? Use", context)
    call = {"name": "evaluate", "arguments": {"expression": question[-1] if question else "1 + 1"}}
    return TurnPlan(free=2, forced=f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>")


def policy(tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))
