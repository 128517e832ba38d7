"""The engine end to end with real parts: rlfactory's tiny Qwen3 model and tokenizer, the qwen3
ToolManager, a real ToolRunner with Python tools, PromptEnv. The untrained model is steered by
ScriptedPolicy (forced tool-call markup after a few freely sampled tokens)."""

from __future__ import annotations

import asyncio
import re

import pytest
from rollout_fakes import one_torch_thread
from rollout_tiny import scripted_engine, tiny_parts

from rlfactory.rollout.scripted import TurnPlan
from rlfactory.tools.base import ToolResult

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)
tiny = pytest.fixture(scope="module")(tiny_parts)


def task_plan(calls_for):
    """Task N makes calls_for(N) tool calls `add(a=N, b=turn)`, then answers."""

    def plan(ctx: str) -> TurnPlan:
        n = int(re.search(r"Task (-?\d+)", ctx).group(1))
        turn = ctx.count("<tool_response>")
        if turn < calls_for(n):
            call = f'{{"name": "{"add" if n >= 0 else "gate"}", "arguments": {{"a": {n}, "b": {turn}}}}}'
            return TurnPlan(free=2 + (n + turn) % 4, forced=f"\n<tool_call>\n{call}\n</tool_call>")
        return TurnPlan(free=3, forced=f" The answer is {n}.")

    return plan


def make_engine(tiny, tools, plan, **rollout):
    return scripted_engine(tiny, tools, plan, **rollout), tiny[2]


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return str(a + b)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_multi_turn_rollout_with_tiny_model_and_real_tools(tiny, mode, tmp_path):
    engine, tm = make_engine(tiny, [add], task_plan(lambda n: n % 3), mode=mode)
    rows = [{"id": f"r{n}", "question": f"Task {n}: add things."} for n in range(4)]
    trajs = asyncio.run(engine.run(rows, n=2, policy_version=5))
    assert engine.generator.stats["reused_tokens"] > 0  # later turns extended the kept cache
    assert engine.generator.kept_sessions == 0  # and it was released when the trajectories ended
    assert [t.group for t in trajs] == ["r0", "r0", "r1", "r1", "r2", "r2", "r3", "r3"]
    for t in trajs:
        n = int(t.group[1:])
        assert t.status == "ok", (t.status, t.error, t.completion_text())
        assert t.turns == n % 3 + 1 and t.info["question"].startswith(f"Task {n}")
        assert [(c.name, c.arguments, c.status) for c in t.tool_calls] == [
            ("add", {"a": n, "b": k}, "ok") for k in range(n % 3)
        ]
        roles = [s.role for s in t.segments]
        assert roles == ["prompt"] + ["model", "observation"] * (n % 3) + ["model"]
        for k, seg in enumerate(s for s in t.segments if s.role == "observation"):
            # The observation is exactly the ToolManager's rendering of the real tool result.
            assert seg.token_ids == tm.render_observation([ToolResult(str(n + k))])
        for seg in (s for s in t.segments if s.role == "model"):
            assert seg.policy_version == 5 and len(seg.logprobs) == len(seg.token_ids)
            assert seg.token_ids[-1] in tm.stop_token_ids()
            assert all(lp <= 0 for lp in seg.logprobs) and seg.logprobs[-1] == 0.0  # forced end of turn
        assert t.segments[-1].text.endswith(f"The answer is {n}.<|im_end|>")
        assert sum(t.loss_mask) == sum(len(s.token_ids) for s in t.segments if s.role == "model")
    from rlfactory.trajectory import read_jsonl, write_jsonl

    write_jsonl(tmp_path / "t.jsonl", trajs, mode="w")
    assert read_jsonl(tmp_path / "t.jsonl") == trajs


def test_a_trajectory_waiting_for_a_tool_does_not_hold_the_others_back(tiny):
    """Task -1 calls `gate`, which returns only once task 5 has made its *second* tool call. The
    async engine gets there; lock-step cannot (task 5's second turn waits for the gate)."""
    opened = {}

    def run(mode):
        released = asyncio.Event()

        async def gate(a: int, b: int) -> str:
            """Wait for the other trajectory.

            Args:
                a: unused
                b: unused
            """
            try:
                await asyncio.wait_for(released.wait(), timeout=3.0)
                return "opened"
            except TimeoutError:
                return "gave up"

        async def add_and_release(a: int, b: int) -> str:
            """Add two integers.

            Args:
                a: first
                b: second
            """
            if b == 1:
                released.set()
            return str(a + b)

        add_and_release.__name__ = "add"
        plan = task_plan(lambda n: 1 if n < 0 else 2)
        engine, _ = make_engine(tiny, [gate, add_and_release], plan, mode=mode)
        rows = [{"question": "Task -1: wait."}, {"question": "Task 5: add."}]
        trajs = asyncio.run(engine.run(rows, n=1))
        assert [t.status for t in trajs] == ["ok", "ok"]
        opened[mode] = trajs[0].segments[2].text

    run("async")
    run("lockstep")
    assert "opened" in opened["async"]
    assert "gave up" in opened["lockstep"]


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_seeded_rows_sample_the_same_tokens_whatever_else_is_in_the_batch(tiny, mode):
    engine, _ = make_engine(tiny, [add], task_plan(lambda n: n % 3), mode=mode)
    rows = [{"id": f"r{n}", "question": f"Task {n}: add things."} for n in range(4)]
    seeds = [5, 6, 7, 8]
    together = asyncio.run(engine.run(rows, n=2, seeds=seeds))
    halves = asyncio.run(engine.run(rows[2:], n=2, seeds=seeds[2:])) + asyncio.run(engine.run(rows[:2], n=2, seeds=seeds[:2]))
    halves = halves[4:] + halves[:4]
    assert [t.input_ids for t in together] == [t.input_ids for t in halves]
    assert together[0].input_ids != together[1].input_ids  # a group's samples still differ
    assert all(t.status == "ok" for t in together)
    # Without seeds the shared generator's draws depend on what shares the batch.
    unseeded = asyncio.run(engine.run(rows[:2], n=2))
    assert [t.input_ids for t in unseeded] != [t.input_ids for t in together[:4]]
    with pytest.raises(ValueError, match="3 seeds for 4 rows"):
        asyncio.run(engine.run(rows, n=2, seeds=seeds[:3]))
