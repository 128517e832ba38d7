"""The rollout's observer hook (rlfactory/rollout/observer.py) on real rollouts: rlfactory's tiny
Qwen3 model and tokenizer, the qwen3 ToolManager, a real ToolRunner with a Python tool, steered by
ScriptedPolicy (forced tool-call markup after a few freely sampled tokens)."""

from __future__ import annotations

import asyncio
import re

import pytest
from rollout_fakes import one_torch_thread
from rollout_tiny import multiply, scripted_engine, tiny_parts

from rlfactory.rollout.engine import RolloutEngine
from rlfactory.rollout.observer import RolloutObserver
from rlfactory.rollout.scripted import TurnPlan

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)
tiny = pytest.fixture(scope="module")(tiny_parts)


def plan(ctx: str) -> TurnPlan:
    """Task N calls multiply(N, turn) N times, then answers."""
    n = int(re.search(r"Task (\d+)", ctx).group(1))
    turn = ctx.count("<tool_response>")
    if turn < n:
        call = f'{{"name": "multiply", "arguments": {{"a": {n}, "b": {turn + 2}}}}}'
        return TurnPlan(free=2, forced=f"\n<tool_call>\n{call}\n</tool_call>")
    return TurnPlan(free=2, forced=f" The answer is {n}.")


def engine_for(tiny, max_turns: int = 4) -> RolloutEngine:
    return scripted_engine(tiny, [multiply], plan, max_turns)


def recorder() -> tuple[RolloutObserver, dict[str, list[tuple]]]:
    """An observer writing each trajectory's events, with what each one saw, under its id."""
    seen: dict[str, list[tuple]] = {}

    def note(traj, *event):
        seen.setdefault(traj.id, []).append(event)

    return RolloutObserver(
        turn_started=lambda t, req: note(t, "turn_started", t.turns, t.segments[-1].role, len(req.prompt_ids),
                                         sum(len(s.token_ids) for s in t.segments)),
        tokens_generated=lambda t, res: note(t, "tokens_generated", t.turns, list(res.token_ids) == t.segments[-1].token_ids),
        tools_started=lambda t, calls: note(t, "tools_started", [(c.name, c.arguments) for c in calls]),
        tool_results=lambda t, calls, results: note(t, "tool_results", [r.text for r in results]),
        turn_ended=lambda t: note(t, "turn_ended", t.segments[-1].role, t.status),
    ), seen


def test_the_observer_sees_every_turn_of_a_real_multi_turn_rollout_in_order(tiny):
    observer, seen = recorder()
    rows = [{"id": f"r{n}", "question": f"Task {n}: multiply."} for n in (2, 0)]
    trajs = asyncio.run(engine_for(tiny).run(rows, n=2, seeds=[7, 8], observer=observer))
    assert sorted(seen) == sorted(t.id for t in trajs)
    for t in trajs:
        n = int(t.group[1:])
        assert t.status == "ok" and t.turns == n + 1, (t.status, t.error)
        want = []
        for k in range(n):  # a tool turn: its call, the real tool's result, then its observation
            role = "prompt" if k == 0 else "observation"
            want += [("turn_started", k, role), ("tokens_generated", k + 1, True),
                     ("tools_started", [("multiply", {"a": n, "b": k + 2})]), ("tool_results", [str(n * (k + 2))]),
                     ("turn_ended", "observation", "ok")]
        want += [("turn_started", n, "prompt" if n == 0 else "observation"), ("tokens_generated", n + 1, True),
                 ("turn_ended", "model", "ok")]  # the answer: the trajectory ends during its turn
        events = seen[t.id]
        assert [e[:3] if e[0] == "turn_started" else e for e in events] == want
        for e in events:
            if e[0] == "turn_started":  # the request continues the whole trajectory so far
                assert e[3] == e[4]


def test_a_turn_that_ends_the_trajectory_is_ended_once_with_its_final_status(tiny):
    observer, seen = recorder()
    # Task 3 wants three tool turns; with max_turns 1 its first turn's calls are not run (truncated)
    (traj,) = asyncio.run(engine_for(tiny, max_turns=1).run([{"id": "x", "question": "Task 3: multiply."}], n=1,
                                                             observer=observer))
    assert traj.status == "truncated"
    assert seen[traj.id] == [("turn_started", 0, "prompt", seen[traj.id][0][3], seen[traj.id][0][3]),
                             ("tokens_generated", 1, True), ("turn_ended", "model", "truncated")]


def test_an_observer_changes_nothing_in_the_trajectories(tiny):
    rows = [{"id": f"r{n}", "question": f"Task {n}: multiply."} for n in (1, 2)]
    plain = asyncio.run(engine_for(tiny).run(rows, n=2, seeds=[3, 4]))
    watched = asyncio.run(engine_for(tiny).run(rows, n=2, seeds=[3, 4], observer=recorder()[0]))
    def record(t):  # what was sampled and run (timings and latencies differ run to run)
        return (t.id, t.status, t.turns, [(s.role, s.token_ids) for s in t.segments],
                [(c.name, c.arguments, c.status) for c in t.tool_calls])

    assert [record(t) for t in watched] == [record(t) for t in plain]
    assert all(t.status == "ok" for t in plain)


def test_an_error_raised_by_the_observer_propagates_and_still_ends_the_turn(tiny):
    ended = []

    def boom(traj, result):
        raise RuntimeError("observer broke")

    observer = RolloutObserver(tokens_generated=boom, turn_ended=lambda t: ended.append(t.id))
    with pytest.raises(RuntimeError, match="observer broke"):
        asyncio.run(engine_for(tiny).run([{"id": "y", "question": "Task 1: multiply."}], n=1, observer=observer))
    assert ended == ["y-0"]
