"""Step rewards during the rollout: an env's step() and a tool's own result can score a turn
(`ToolResult.reward`); the rollout records the turn's sum on its model segment as the `step` term,
the JSON line keeps it, and a score that is not a number ends only that trajectory, named."""

from __future__ import annotations

import asyncio
import math

import pytest
from rollout_fakes import CharToolManager, FakeRunner, RowsEnv, ScriptedGenerator

from rlfactory.config import RolloutConfig, SamplingConfig, ToolsConfig
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.tools.base import ToolResult
from rlfactory.tools.runner import ToolRunner
from rlfactory.trajectory import Trajectory


class StepRewardEnv(RowsEnv):
    """RL-Factory's step-reward shape: step() scores each call of the turn (0.5 per echo of 'good')."""

    async def step(self, calls, runner):
        results = await runner.run(calls)
        for call, r in zip(calls, results):
            r.reward = 0.5 if call.arguments.get("text") == "good" else 0.0
        return results


def script(ctx):
    turn = ctx.count("\nT:")
    return ['CALL echo {"text": "good"}<eot>', 'CALL echo {"text": "bad"}<eot>', "done<eot>"][turn]


def run(env, runner, rows=({"question": "q"},)):
    engine = RolloutEngine(ScriptedGenerator(script), CharToolManager(), runner, env, RolloutConfig(), SamplingConfig())
    return asyncio.run(engine.run(list(rows), 1))


def test_env_step_rewards_are_recorded_on_each_turns_model_segment_and_survive_json():
    (t,) = run(StepRewardEnv(), FakeRunner())
    assert t.status == "ok" and t.turns == 3
    turns = t.turn_segments()
    assert [s.reward for s in turns] == [0.5, 0.0, None]
    assert [s.reward_terms for s in turns] == [{"step": 0.5}, {"step": 0.0}, None]
    assert t.turn_rewards() == [0.5, 0.0, 0.0]
    assert t.reward is None  # the outcome reward is the reward's business, untouched
    back = Trajectory.from_json(t.to_json())
    assert back == t and [s.reward_terms for s in back.turn_segments()] == [{"step": 0.5}, {"step": 0.0}, None]


def test_a_json_line_written_before_turn_rewards_existed_still_loads():
    (t,) = run(RowsEnv(), FakeRunner())
    d = t.to_dict()
    for seg in d["segments"]:
        del seg["reward"], seg["reward_terms"]
    back = Trajectory.from_dict(d)
    assert all(s.reward is None and s.reward_terms is None for s in back.segments) and back.turn_rewards() == [0.0] * t.turns


def test_a_real_python_tool_returns_a_score_with_its_result_cached_or_not():
    async def lookup(text: str) -> ToolResult:
        """Look a text up.

        Args:
            text: what to look up.
        """
        return ToolResult(f"found {text}", reward=1.0 if text == "good" else -0.25)

    async def go():
        async with ToolRunner([lookup], ToolsConfig(cache=True)) as runner:
            def script2(ctx):
                return ['CALL lookup {"text": "good"}<eot>', 'CALL lookup {"text": "good"}<eot>',
                        'CALL lookup {"text": "x"}<eot>', "done<eot>"][ctx.count("\nT:")]

            engine = RolloutEngine(ScriptedGenerator(script2), CharToolManager(), runner, RowsEnv(),
                                   RolloutConfig(max_turns=5), SamplingConfig())
            return await engine.run([{"question": "q"}], 1)

    (t,) = asyncio.run(go())
    assert [c.cached for c in t.tool_calls] == [False, True, False]  # the second "good" is a cache hit
    assert [s.reward for s in t.turn_segments()] == [1.0, 1.0, -0.25, None]


@pytest.mark.parametrize("bad", ["high", math.nan, True])
def test_a_step_reward_that_is_not_a_number_ends_that_trajectory_with_its_cause(bad):
    class Hostile(RowsEnv):
        async def step(self, calls, runner):
            results = await runner.run(calls)
            if "bad" in calls[0].arguments.get("text", ""):
                results[0].reward = bad
            return results

    def script3(ctx):
        return "done<eot>" if ctx.count("\nT:") else ('CALL echo {"text": "bad"}<eot>' if "evil" in ctx else 'CALL echo {"text": "x"}<eot>')

    engine = RolloutEngine(ScriptedGenerator(script3), CharToolManager(), FakeRunner(), Hostile(), RolloutConfig(), SamplingConfig())
    evil, fine = asyncio.run(engine.run([{"question": "evil"}, {"question": "fine"}], 1))
    assert evil.status == "infra_error" and "reward" in evil.error and "not a finite number" in evil.error
    assert "\n" not in evil.error
    assert fine.status == "ok" and fine.turn_segments()[0].reward is None
