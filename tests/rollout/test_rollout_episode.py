"""The per-turn rules (statuses, limits, observations), driven by a scripted generator so that
every branch is reached on purpose; both schedulers must apply them identically."""

from __future__ import annotations

import asyncio

import pytest
from rollout_fakes import EOT, CharToolManager, FakeRunner, RowsEnv, ScriptedGenerator

from rlfactory.protocols import GenResult

from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.tools.base import CRASHED, TIMEOUT, ToolCall, ToolResult

MODES = [("async", "concurrent"), ("lockstep", "concurrent"), ("lockstep", "sequential")]


def run(script, rows, n=1, runner=None, mode=("async", "concurrent"), **limits):
    gen = ScriptedGenerator(script)
    runner = runner or FakeRunner()
    rollout = RolloutConfig(mode=mode[0], lockstep_tools=mode[1], **limits)
    engine = RolloutEngine(gen, CharToolManager(), runner, RowsEnv(), rollout, SamplingConfig(temperature=0.7))
    return asyncio.run(engine.run(rows, n, policy_version=3)), gen, runner


def turns_seen(ctx: str) -> int:
    return ctx.count("\nT:")


@pytest.mark.parametrize("mode", MODES)
def test_tool_then_answer_builds_exact_segments_and_mask(mode):
    def script(ctx):
        return 'CALL echo {"text": "hi"}<eot>' if turns_seen(ctx) == 0 else "the answer<eot>"

    (t,), gen, runner = run(script, [{"id": "q7", "question": "say hi"}], mode=mode)
    assert t.status == "ok" and t.turns == 2 and t.group == "q7" and t.id == "q7-0"
    assert [s.role for s in t.segments] == ["prompt", "model", "observation", "model"]
    assert t.segments[1].token_ids[-1] == EOT and t.segments[1].policy_version == 3
    assert t.segments[2].text == "\nT:echo:hi\nA:"
    assert t.loss_mask == [0] * len(t.segments[0].token_ids) + [1] * len(t.segments[1].token_ids) + [0] * len(
        t.segments[2].token_ids
    ) + [1] * len(t.segments[3].token_ids)
    # The second request continues the exact token context; nothing was re-tokenized.
    assert gen.requests[1].prompt_ids == t.input_ids[: len(gen.requests[1].prompt_ids)]
    assert len(gen.requests[1].prompt_ids) == sum(len(s.token_ids) for s in t.segments[:3])
    assert [(c.name, c.arguments, c.status, c.turn) for c in t.tool_calls] == [("echo", {"text": "hi"}, "ok", 1)]
    assert t.reward is None and t.info == {"id": "q7", "question": "say hi"}
    assert all(req.sampling.temperature == 0.7 for req in gen.requests)


@pytest.mark.parametrize("mode", MODES)
def test_malformed_call_gets_reason_and_model_may_recover(mode):
    def script(ctx):
        return ["CALL echo {oops}<eot>", "fine<eot>"][turns_seen(ctx)]

    (t,), _, runner = run(script, [{"question": "q"}], mode=mode)
    assert t.status == "ok" and t.turns == 2 and runner.calls == []
    assert t.tool_calls[0].status == "malformed" and "bad json" in t.tool_calls[0].error
    assert t.segments[2].role == "observation" and "bad json" in t.segments[2].text


def test_malformed_on_last_turn_ends_malformed():
    (t,), _, _ = run(lambda ctx: "CALL echo {oops}<eot>", [{"question": "q"}], max_turns=2)
    assert t.status == "malformed" and t.turns == 2
    assert [s.role for s in t.segments] == ["prompt", "model", "observation", "model"]


def test_tool_call_on_last_turn_is_not_run_and_truncates():
    (t,), _, runner = run(lambda ctx: 'CALL echo {"text": "x"}<eot>', [{"question": "q"}], max_turns=3)
    assert t.status == "truncated" and t.turns == 3 and len(runner.calls) == 2


def test_env_max_turns_is_the_default():
    (t,), _, _ = run(lambda ctx: 'CALL echo {"text": "x"}<eot>', [{"question": "q"}])
    assert t.turns == RowsEnv.max_turns


def test_turn_cut_at_max_new_tokens_is_truncated():
    (t,), gen, _ = run(lambda ctx: "x" * 50 + "<eot>", [{"question": "q"}], max_new_tokens=10)
    assert t.status == "truncated" and t.turns == 1 and len(t.segments[1].token_ids) == 10


def test_total_budget_caps_generation_and_observations():
    rows = [{"question": "q"}]
    (t,), gen, _ = run(lambda ctx: 'CALL echo {"text": "x"}<eot>', rows, max_total_tokens=60, max_turns=9)
    assert t.status == "truncated" and len(t.input_ids) <= 60
    assert all(len(r.prompt_ids) + r.max_new_tokens <= 60 for r in gen.requests)


def test_long_observation_is_cut_and_marked():
    runner = FakeRunner({"big": ToolResult("y" * 500)})

    def script(ctx):
        return 'CALL echo {"text": "big"}<eot>' if turns_seen(ctx) == 0 else "done<eot>"

    (t,), _, _ = run(script, [{"question": "q"}], runner=runner, max_observation_tokens=40)
    obs = t.segments[2]
    assert len(obs.token_ids) <= 40 and obs.text.endswith("[truncated]\nA:") and obs.text.startswith("\nT:yyy")
    assert t.tool_calls[0].truncated and t.status == "ok"


def test_tool_error_and_timeout_are_observations():
    runner = FakeRunner({"a": ToolResult.error("no such city"), "b": ToolResult.error("timed out", status=TIMEOUT)})

    def script(ctx):
        return ['CALL echo {"text": "a"}<eot>', 'CALL echo {"text": "b"}<eot>', "ok<eot>"][turns_seen(ctx)]

    (t,), _, _ = run(script, [{"question": "q"}], runner=runner)
    assert t.status == "ok" and [c.status for c in t.tool_calls] == ["error", TIMEOUT]
    assert "no such city" in t.segments[2].text and "timed out" in t.segments[4].text


def test_infra_failure_of_a_whole_turn_is_infra_error():
    runner = FakeRunner({"a": ToolResult.error("server died", status=CRASHED)})
    (t,), _, _ = run(lambda ctx: 'CALL echo {"text": "a"}<eot>', [{"question": "q"}], runner=runner)
    assert t.status == "infra_error" and "server died" in t.error and t.turns == 1
    assert [s.role for s in t.segments] == ["prompt", "model"]


def test_env_step_raising_is_infra_error_for_that_trajectory_only():
    class Boom(FakeRunner):
        async def run(self, calls):
            if calls[0].arguments["text"] == "boom":
                raise RuntimeError("env broke")
            return await super().run(calls)

    def script(ctx):
        if turns_seen(ctx):
            return "ok<eot>"
        return 'CALL echo {"text": "boom"}<eot>' if "bad" in ctx else 'CALL echo {"text": "x"}<eot>'

    trajs, _, _ = run(script, [{"question": "bad"}, {"question": "good"}], runner=Boom())
    assert [t.status for t in trajs] == ["infra_error", "ok"] and "env broke" in trajs[0].error


def test_n_per_row_groups_and_order():
    trajs, _, _ = run(lambda ctx: "a<eot>", [{"question": "x"}, {"question": "y", "id": 42}], n=3)
    assert [t.id for t in trajs] == ["0-0", "0-1", "0-2", "42-0", "42-1", "42-2"]
    assert [t.group for t in trajs] == ["0"] * 3 + ["42"] * 3


def test_a_generator_failure_stops_the_run_and_every_trajectory():
    started = []

    class Failing(ScriptedGenerator):
        async def submit(self, req):
            started.append(req)
            if len(started) == 2:
                raise RuntimeError("generator died")
            await asyncio.sleep(0.05)
            return await super().submit(req)

    engine = RolloutEngine(Failing(lambda ctx: "x<eot>"), CharToolManager(), FakeRunner(), RowsEnv(),
                           RolloutConfig(), SamplingConfig())

    async def go():
        with pytest.raises(RuntimeError, match="generator died"):
            await engine.run([{"question": "a"}, {"question": "b"}, {"question": "c"}], n=1)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return pending

    assert asyncio.run(go()) == []


def test_only_the_long_result_of_a_turn_is_cut():
    class TwoCalls(CharToolManager):
        def parse(self, text):
            parsed = super().parse(text)
            if hasattr(parsed, "calls"):
                parsed.calls = [ToolCall("echo", {"text": "short"}), ToolCall("echo", {"text": "big"})]
            return parsed

    runner = FakeRunner({"big": ToolResult("z" * 400)})
    script = lambda ctx: 'CALL echo {"text": "x"}<eot>' if turns_seen(ctx) == 0 else "done<eot>"  # noqa: E731
    engine = RolloutEngine(ScriptedGenerator(script), TwoCalls(), runner, RowsEnv(),
                           RolloutConfig(max_observation_tokens=60), SamplingConfig())
    (t,) = asyncio.run(engine.run([{"question": "q"}], 1))
    assert [c.truncated for c in t.tool_calls] == [False, True]
    assert "echo:short" in t.segments[2].text and "[truncated]" in t.segments[2].text
    assert len(t.segments[2].token_ids) <= 60


# ---- one loop: decode once, parsing, hooks, infra statuses, groups, the lock-step barrier --------


def test_the_turn_is_decoded_once_by_the_generator():
    """The engine records and parses the generator's text; it never decodes the sampled ids again
    (here they decode to 'z's, so any second decode would read an answer instead of a call)."""

    class Relabelling(ScriptedGenerator):
        async def submit(self, req):
            res = await super().submit(req)
            z = [ord("z") if i != EOT else i for i in res.token_ids]
            return GenResult(z, res.logprobs, res.finish_reason, res.text, res.stop_token)

    script = lambda ctx: 'CALL echo {"text": "hi"}<eot>' if turns_seen(ctx) == 0 else "done<eot>"  # noqa: E731
    engine = RolloutEngine(Relabelling(script), CharToolManager(), FakeRunner(), RowsEnv(), RolloutConfig(),
                           SamplingConfig())
    (t,) = asyncio.run(engine.run([{"question": "q"}], 1))
    assert t.status == "ok" and [c.name for c in t.tool_calls] == ["echo"]
    assert t.segments[1].text == 'CALL echo {"text": "hi"}<eot>' and set(t.segments[1].token_ids) == {ord("z"), EOT}


def test_a_parser_that_raises_ends_only_its_trajectory_as_malformed():
    class Raising(CharToolManager):
        def parse(self, text):
            if "boom" in text:
                raise RecursionError("maximum recursion depth exceeded")
            return super().parse(text)

    script = lambda ctx: "boom<eot>" if "bad" in ctx else "fine<eot>"  # noqa: E731
    engine = RolloutEngine(ScriptedGenerator(script), Raising(), FakeRunner(), RowsEnv(), RolloutConfig(),
                           SamplingConfig())
    bad, good = asyncio.run(engine.run([{"question": "bad"}, {"question": "good"}], 1))
    assert bad.status == "malformed" and "RecursionError" in bad.error and bad.tool_calls[0].status == "malformed"
    assert good.status == "ok"


def test_a_long_turn_is_parsed_off_the_event_loop_and_a_short_one_inline():
    import threading

    from rlfactory.chat.turns import PARSE_INLINE_CHARS

    seen = {}

    class Recording(CharToolManager):
        def parse(self, text):
            seen[len(text) > PARSE_INLINE_CHARS] = threading.current_thread() is threading.main_thread()
            return super().parse(text)

    script = lambda ctx: ("x" * (PARSE_INLINE_CHARS + 1) if "long" in ctx else "short") + "<eot>"  # noqa: E731
    engine = RolloutEngine(ScriptedGenerator(script), Recording(), FakeRunner(), RowsEnv(),
                           RolloutConfig(max_new_tokens=4000, max_total_tokens=8000), SamplingConfig())
    trajs = asyncio.run(engine.run([{"question": "long"}, {"question": "short"}], 1))
    assert [t.status for t in trajs] == ["ok", "ok"]
    assert seen == {True: False, False: True}


def test_the_env_hook_can_end_an_episode():
    class StopOnCalls(RowsEnv):
        def end_episode(self, trajectory, turn):
            return "truncated" if "forbidden" in trajectory.segments[-1].text else None

    script = lambda ctx: 'CALL echo {"text": "forbidden"}<eot>' if turns_seen(ctx) == 0 else "ok<eot>"  # noqa: E731
    runner = FakeRunner()
    engine = RolloutEngine(ScriptedGenerator(script), CharToolManager(), runner, StopOnCalls(), RolloutConfig(),
                           SamplingConfig())
    (t,) = asyncio.run(engine.run([{"question": "q"}], 1))
    assert t.status == "truncated" and t.turns == 1 and runner.calls == []


@pytest.mark.parametrize("infra, expected", [(None, "infra_error"), (["crashed"], "ok")])
def test_which_tool_statuses_count_as_infra_failures_is_configurable(infra, expected):
    runner = FakeRunner({"a": ToolResult.error("the server answers nothing", status="unresponsive")})
    script = lambda ctx: 'CALL echo {"text": "a"}<eot>' if turns_seen(ctx) == 0 else "ok<eot>"  # noqa: E731
    limits = {} if infra is None else {"infra_statuses": infra}
    (t,), _, _ = run(script, [{"question": "q"}], runner=runner, **limits)
    assert t.status == expected and t.tool_calls[0].status == "unresponsive"
    if expected == "infra_error":
        assert "unresponsive" in t.error and len(t.segments) == 2
    else:
        assert "answers nothing" in t.segments[2].text  # an observation the model reads


def test_infra_statuses_must_be_tool_failure_statuses():
    with pytest.raises(ValueError, match="rollout.infra_statuses: 'crashd'.*known: error, timeout"):
        RolloutConfig(infra_statuses=["crashd"])
    with pytest.raises(ValueError, match="'ok'"):
        RolloutConfig(infra_statuses=["ok"])


def test_a_row_met_twice_in_one_call_is_two_groups():
    trajs, _, _ = run(lambda ctx: "a<eot>", [{"id": 7, "question": "x"}, {"id": 7, "question": "y"},
                                              {"id": "7#2", "question": "z"}], n=2)
    assert [t.group for t in trajs] == ["7", "7", "7#2", "7#2", "7#2#2", "7#2#2"]
    assert len({t.id for t in trajs}) == 6
    assert [t.info["question"] for t in trajs[2:4]] == ["y", "y"]


def test_lockstep_batches_every_turn_and_releases_in_row_order_whatever_the_tool_timing():
    class Slow(FakeRunner):
        async def run(self, calls):
            await asyncio.sleep(0.05 / (1 + int(calls[0].arguments["text"])))  # row 0's tools finish last
            return await super().run(calls)

    def script(ctx):
        return 'CALL echo {"text": "%s"}<eot>' % ctx.split("U:")[1][0] if turns_seen(ctx) < 2 else "done<eot>"

    rows = [{"question": str(i)} for i in range(4)]
    trajs, gen, runner = run(script, rows, runner=Slow(), mode=("lockstep", "concurrent"))
    assert [t.status for t in trajs] == ["ok"] * 4
    rounds = [[r.prompt_ids[len("[echo]U:")] for r in gen.requests[k:k + 4]] for k in range(0, 12, 4)]
    assert rounds == [[ord(str(i)) for i in range(4)]] * 3


def test_an_env_missing_members_is_refused_by_name():
    class Bare:
        max_turns = 2

        def reset(self, row):
            return [{"role": "user", "content": "x"}]

    with pytest.raises(TypeError, match="Bare does not implement load_split, tools, step, reward, info, end_episode"):
        RolloutEngine(ScriptedGenerator(lambda ctx: "a<eot>"), CharToolManager(), FakeRunner(), Bare(),
                      RolloutConfig(), SamplingConfig())


def test_every_turn_carries_the_runs_priority():
    def script(ctx):
        return 'CALL echo {"text": "hi"}<eot>' if turns_seen(ctx) == 0 else "done<eot>"

    gen = ScriptedGenerator(script)
    engine = RolloutEngine(gen, CharToolManager(), FakeRunner(), RowsEnv(), RolloutConfig(), SamplingConfig())
    asyncio.run(engine.run([{"question": "q"}], 2, priority=5))
    asyncio.run(engine.run([{"question": "q"}], 1))
    assert [r.priority for r in gen.requests] == [5] * 4 + [0] * 2
