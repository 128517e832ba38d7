"""Helpers for env tests: a demonstration (chat messages) as a Trajectory, scored by an env."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory


def demo_to_trajectory(env: Any, row: dict[str, Any], messages: list[dict[str, Any]]) -> Trajectory:
    """Model turns as Hermes-style text (`<tool_call>{json}</tool_call>`), tool turns as observations."""
    opening = env.reset(row)
    assert messages[: len(opening)] == opening, "a demonstration starts with the env's opening messages"
    segments = [Segment("prompt", [], text="\n".join(m["content"] for m in opening))]
    calls: list[ToolCallRecord] = []
    turn = 0
    for m in messages[len(opening):]:
        if m["role"] == "assistant":
            turn += 1
            text = m.get("content") or ""
            if getattr(env, "family", None) == "searchr1" and not m.get("tool_calls"):
                text = f"<answer> {text} </answer>"  # what the searchr1 ToolManager renders
            for c in m.get("tool_calls") or []:
                f = c["function"]
                text += "<tool_call>" + json.dumps({"name": f["name"], "arguments": f["arguments"]}) + "</tool_call>"
                calls.append(ToolCallRecord(f["name"], f["arguments"], "ok", 0.0, turn=turn))
            segments.append(Segment("model", [], text=text))
        else:
            assert m["role"] == "tool"
            segments.append(Segment("observation", [], text=m["content"]))
    return Trajectory(id="demo", group="g", segments=segments, tool_calls=calls, turns=turn, info=env.info(row))


def score(env: Any, trajectory: Trajectory):
    return asyncio.run(env.reward().score(trajectory))


def with_final_answer(messages: list[dict[str, Any]], answer: str, env: Any = None) -> list[dict[str, Any]]:
    if getattr(env, "family", None) == "searchr1":
        return messages[:-1] + [{"role": "assistant", "content": answer}]
    return messages[:-1] + [{"role": "assistant", "content": f"<answer>{answer}</answer>"}]
