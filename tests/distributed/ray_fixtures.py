"""Configs and a scripted policy for the distributed tests (importable by Ray workers: the
driver's sys.path goes to them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan

HERE = Path(__file__).resolve().parent


def plan(context: str) -> TurnPlan:
    """First turn: two free tokens, then a `wait` call named after the question; then answer."""
    if "<tool_response>" in context:
        return TurnPlan(free=1, forced="<answer>done</answer>")
    question = context.rsplit("Question ", 1)[-1].split(".", 1)[0]
    call = {"name": "wait", "arguments": {"key": f"q{question}"}}
    return TurnPlan(free=2, forced=f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>")


def policy(tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))


def gate_config(gate_file: Path, ray_temp: Path | None = None, **ray: Any) -> Any:
    """A RunConfig: PromptEnv, tiny:1m, the gate MCP server (one tool, `wait`), lock-step rollouts."""
    from rlfactory.config import RunConfig

    server = {"command": sys.executable, "args": [str(HERE / "gate_server.py")], "env": {"GATE_FILE": str(gate_file)}}
    return RunConfig.model_validate({
        "model": {"path": "tiny:1m", "family": "qwen3", "device": "cpu"},
        "env": {"name": "rlfactory.rollout.prompt_env:PromptEnv", "options": {"max_turns": 3}},
        "tools": {"mcp": {"mcpServers": {"gate": server}}, "timeout_s": 120, "retries": 0},
        "rollout": {"mode": "lockstep", "max_new_tokens": 40, "max_total_tokens": 1024},
        "sampling": {"temperature": 1.0},
        "trainer": {"backend": "ray"},
        "ray": {"rollout_workers": 2, "tool_pools": 1, **ray},
    })


def question_rows(count: int) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", "question": f"Question {i}. Wait for the gate, then answer."} for i in range(count)]
