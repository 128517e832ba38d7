"""The calculator env: disjoint seeded splits, demonstrations whose tool results are exactly what the
real calculator MCP server returns, guesses that are never right, and its reward."""

from __future__ import annotations

import asyncio

import pytest

from rlfactory.envs.calculator import CalculatorEnv, guess
from rlfactory.envs.registry import make_env
from rlfactory.tools import ToolRunner
from rlfactory.tools.base import ToolCall
from rlfactory.config import ToolsConfig


def test_splits_are_seeded_and_disjoint():
    env = make_env("calculator", n_train=300, n_test=50)
    train, test = env.load_split("train"), env.load_split("test")
    assert len(train) == 300 and len(test) == 50
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert [r["question"] for r in CalculatorEnv(n_train=300, n_test=50).load_split("test")] == [r["question"] for r in test]
    with pytest.raises(TypeError, match="unknown option"):
        CalculatorEnv(digits=3)


def test_demonstrations_match_the_real_mcp_tool_and_guesses_are_wrong():
    env = CalculatorEnv(n_train=40, n_test=5, guess_rate=0.5)
    rows = env.load_split("train")
    demos = [env.solve(r) for r in rows]
    with_tool = [d for d in demos if any(m.get("tool_calls") for m in d)]
    assert 0 < len(with_tool) < len(demos)  # about half call the tool

    async def run_all():
        async with ToolRunner.from_config(ToolsConfig(), mcp=env.tools().mcp) as runner:
            assert [s.name for s in runner.specs()] == ["evaluate"]
            calls = [ToolCall("evaluate", d[2]["tool_calls"][0]["function"]["arguments"]) for d in with_tool]
            return await runner.run(calls)

    results = asyncio.run(run_all())
    for demo, result in zip(with_tool, results):
        assert not result.is_error and result.text == demo[3]["content"]
        assert demo[4]["content"] == f"<answer>{result.text}</answer>"
    for row, demo in zip(rows, demos):
        if demo not in with_tool:
            assert demo[-1]["content"] != f"<answer>{row['golden_answers'][0]}</answer>"
    assert all(guess(a) != a for a in ("4517277", "45000", "100", "99"))
