"""A scripted policy for the visual env (tests of images over `rlfactory serve`): the untrained
tiny-vl samples two tokens of its own, then a `zoom` call on the question's picture is forced;
after the zoomed picture it samples one token and answers. Every token is still a forward pass of
the real model over the real pixels (rlfactory/rollout/scripted.py); only forced tokens are chosen.
`rlfactory serve tiny-vl:1m --logits-processor scripted_visual:policy` (run from this folder)."""

from __future__ import annotations

import json
import re
from typing import Any

from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan


def plan(context: str) -> TurnPlan:
    if "<tool_response>" in context:
        return TurnPlan(free=1, forced="<answer>3</answer>")
    picture = re.findall(r"Picture (\S+) is", context)
    call = {"name": "zoom", "arguments": {"picture": picture[-1] if picture else "train-0", "x": 40, "y": 40, "size": 32}}
    return TurnPlan(free=2, forced=f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>")


def policy(tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))


def low_ids(trajectory: Any) -> float:
    """A reward term with signal even for an untrained model: share of model tokens with id < 500
    (so a GRPO step has nonzero advantages and moves the weights)."""
    ids = [t for s in trajectory.segments if s.role == "model" for t in s.token_ids]
    return sum(1 for t in ids if t < 500) / len(ids) if ids else 0.0
