"""ToolRunner against real MCP servers (rlfactory's examples and PyPI's mcp-server-time)."""

import asyncio
import json

from conftest import server, time_server

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import (
    CRASHED,
    ERROR,
    INVALID_ARGUMENTS,
    OK,
    TIMEOUT,
    UNKNOWN_TOOL,
    ToolCall,
    ToolRunner,
    TransportError,
)


def py_concat(a: str, b: str = "!") -> str:
    """Join two strings.

    Args:
        a: The start.
        b: The end.
    """
    return a + b


def test_mcp_and_python_tools_side_by_side():
    mcp = {
        "mcpServers": {
            "calc": server("calculator"),
            "e1": server("echo", exclude=["pid"]),
            "e2": server("echo", include=["echo", "sleep"]),
            "time": time_server(),
        }
    }

    async def main():
        async with ToolRunner([py_concat], ToolsConfig(timeout_s=10), mcp=mcp) as r:
            names = [s.name for s in r.specs()]
            # two servers expose echo and sleep: both become server.tool; unique names stay bare
            assert {"py_concat", "add", "divide", "evaluate", "e1.echo", "e2.echo", "e1.sleep", "e2.sleep"} <= set(names)
            assert "get_current_time" in names and "convert_time" in names
            assert "pid" not in names and "e1.pid" not in names and "e2.pid" not in names  # exclude / include
            assert r.server_of("e2.echo") == "e2" and r.server_of("py_concat") is None
            assert list(r.tools()) == names and r.tools()["e2.echo"].server == "e2"
            add = next(s for s in r.specs() if s.name == "add")
            assert add.parameters["required"] == ["a", "b"] and add.openai_schema()["function"]["name"] == "add"
            assert len(set(r.server_pids().values())) == 4

            results = await r.run(
                [
                    ToolCall("add", {"a": 2, "b": 3}, id="c1"),
                    ToolCall("calc.add", {"a": 1, "b": 1}),  # the qualified name always works
                    ToolCall("e1.echo", {"text": "one"}),
                    ToolCall("e2.echo", {"text": "two"}),
                    ToolCall("py_concat", {"a": "x"}),
                    ToolCall("get_current_time", {"timezone": "UTC"}),
                    ToolCall("evaluate", {"expression": "(3 + 4) * 2"}),
                    ToolCall("divide", {"a": 1, "b": 0}),
                    ToolCall("echo", {"text": "ambiguous"}),
                    ToolCall("add", {"a": "two", "b": 3}),
                    ToolCall("add", {"a": 1}),
                    ToolCall("py_concat", '{"a": "json", "b": " string"}'),
                    ToolCall("py_concat", "not json"),
                ]
            )
            texts = [x.text for x in results]
            assert texts[:5] == ["5.0", "2.0", "one", "two", "x!"]
            assert results[0].status == OK and results[0].data == {"result": 5.0} and results[0].latency_s > 0
            assert json.loads(texts[5])["timezone"] == "UTC"
            assert texts[6] == "14"
            assert results[7].is_error and results[7].status == ERROR and "division by zero" in texts[7]
            assert results[8].status == UNKNOWN_TOOL and "e1.echo" in texts[8] and "e2.echo" in texts[8]
            assert results[9].status == INVALID_ARGUMENTS and "'two' is not of type 'number'" in texts[9]
            assert results[10].status == INVALID_ARGUMENTS and "'b' is a required property" in texts[10]
            assert texts[11] == "json string"
            assert results[12].status == INVALID_ARGUMENTS and "not valid JSON" in texts[12]
            m = r.metrics()
            assert m["add"].calls == 4 and m["add"].errors == 2 and m["divide"].errors == 1
            assert m["<unknown>"].calls == 1

    asyncio.run(main())


def test_many_concurrent_calls_from_many_trajectories_share_one_session():
    async def main():
        async with ToolRunner(mcp={"mcpServers": {"echo": server("echo")}}) as r:
            pid = r.server_pids()["echo"]

            async def trajectory(i: int) -> list[str]:
                out = []
                for turn in range(3):
                    res = await r.run([ToolCall("echo", {"text": f"{i}-{turn}-{k}"}) for k in range(4)])
                    out += [x.text for x in res]
                return out

            outs = await asyncio.gather(*(trajectory(i) for i in range(40)))
            assert outs[7][5] == "7-1-1" and all(len(o) == 12 for o in outs)
            # calls overlap: many sleeping calls are in flight on the server at the same time
            sleeps = await r.run([ToolCall("sleep", {"seconds": 0.3})] * 50)
            assert all(x.text == "slept 0.3s" for x in sleeps)
            assert r.server_pids()["echo"] == pid  # one server process served everything
            assert r.metrics()["echo"].calls == 480

    asyncio.run(main())


def test_timeouts_default_and_per_tool():
    cfg = ToolsConfig(timeout_s=0.5, per_tool={"e.sleep": ToolOptions(timeout_s=5)})

    async def slow(seconds: float) -> str:
        """Sleep in-process."""
        await asyncio.sleep(seconds)
        return "done"

    async def main():
        async with ToolRunner([slow], cfg, mcp={"mcpServers": {"e": server("echo")}}) as r:
            res = await r.run(
                [
                    ToolCall("slow", {"seconds": 5}),
                    ToolCall("sleep", {"seconds": 1.0}),  # per-tool timeout 5 s (named server.tool)
                    ToolCall("slow", {"seconds": 0}),
                ]
            )
            assert res[0].status == TIMEOUT and res[0].is_error and "timed out after 0.5s" in res[0].text
            assert res[1].status == OK and res[2].text == "done"
            assert r.metrics()["slow"].timeouts == 1
            # the session is still healthy after an abandoned call
            assert (await r.call(ToolCall("echo", {"text": "alive"}))).text == "alive"

    asyncio.run(main())


def test_transport_failures_are_retried_and_tool_errors_are_not():
    attempts = {"flaky": 0, "broken": 0, "gone": 0}

    async def flaky() -> str:
        """Fails twice at the transport, then answers."""
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise TransportError("connection reset")
        return "finally"

    async def broken() -> str:
        """The tool's own error."""
        attempts["broken"] += 1
        raise ValueError("bad input")

    async def gone() -> str:
        """Transport keeps failing."""
        attempts["gone"] += 1
        raise TransportError("no route to host")

    async def main():
        r = ToolRunner([flaky, broken, gone], ToolsConfig(retries=2, retry_backoff_s=0.01))
        a, b, c = await r.run([ToolCall("flaky"), ToolCall("broken"), ToolCall("gone")])
        assert a.text == "finally" and attempts["flaky"] == 3
        assert b.status == ERROR and "bad input" in b.text and attempts["broken"] == 1
        assert c.status == CRASHED and "no route to host" in c.text and attempts["gone"] == 3

    asyncio.run(main())


def test_global_and_per_tool_concurrency_limits():
    live = {"a": 0, "b": 0, "all": 0}
    peak = {"a": 0, "b": 0, "all": 0}
    done = {"a": 0, "b": 0}
    a_done_at_first_b: list[int] = []

    def counting(key):
        async def tool() -> str:
            """Counts overlapping calls."""
            if key == "b" and not a_done_at_first_b:
                a_done_at_first_b.append(done["a"])
            for k in (key, "all"):
                live[k] += 1
                peak[k] = max(peak[k], live[k])
            await asyncio.sleep(0.02)
            for k in (key, "all"):
                live[k] -= 1
            done[key] += 1
            return key

        tool.__name__ = key
        return tool

    async def main():
        cfg = ToolsConfig(max_concurrency=5, per_tool={"a": ToolOptions(max_concurrency=2)})
        r = ToolRunner([counting("a"), counting("b")], cfg)
        res = await r.run([ToolCall("a")] * 20 + [ToolCall("b")] * 20)
        assert all(not x.is_error for x in res)
        assert peak["a"] == 2 and peak["all"] == 5
        # calls of `a` queued behind their own limit hold no global slot: `b` runs from the start
        assert a_done_at_first_b == [0] and peak["b"] >= 3

    asyncio.run(main())


def test_long_outputs_are_cut_with_a_marker():
    def long_text(n: int) -> str:
        """n characters."""
        return "y" * n

    async def main():
        cfg = ToolsConfig(max_output_chars=100, per_tool={"long_text": ToolOptions()})
        r = ToolRunner([long_text], cfg)
        short, cut = await r.run([ToolCall("long_text", {"n": 100}), ToolCall("long_text", {"n": 5000})])
        assert short.text == "y" * 100 and not short.truncated
        assert cut.truncated and cut.text.startswith("y" * 100) and "[truncated: showing 100 of 5000 characters]" in cut.text
        assert len(cut.text) < 200

    asyncio.run(main())


def test_nothing_a_tool_does_raises_into_the_caller():
    class Weird:
        name = "weird"
        description = "returns a non-result, then raises odd things"
        parameters = {"type": "object", "properties": {"mode": {"type": "string"}}}

        async def call(self, arguments):
            mode = arguments.get("mode")
            if mode == "value":
                return {"plain": "dict"}
            if mode == "cancel":
                raise asyncio.CancelledError()
            if mode == "timeout":
                raise TimeoutError("upstream timed out")
            raise KeyError("boom")

    async def main():
        r = ToolRunner([Weird()])
        res = await r.run([ToolCall("weird", {"mode": m}) for m in ("value", "cancel", "timeout", "raise")])
        assert res[0].text == '{"plain": "dict"}' and not res[0].is_error
        assert all(x.is_error for x in res[1:])
        assert "cancelled" in res[1].text and "upstream timed out" in res[2].text and "KeyError" in res[3].text
        # the caller's own cancellation still propagates
        task = asyncio.ensure_future(r.call(ToolCall("weird", {"mode": "value"})))
        task.cancel()
        try:
            await task
            raised = False
        except asyncio.CancelledError:
            raised = True
        assert raised

    asyncio.run(main())


def test_from_config_merges_config_tools_with_env_tools(tmp_path):
    mcp_file = tmp_path / "mcp.json"
    mcp_file.write_text(json.dumps({"mcpServers": {"calc": server("calculator", include=["add"])}}))
    cfg = ToolsConfig(mcp=str(mcp_file), python=["json:dumps"])

    async def main():
        env_mcp = {"mcpServers": {"echo": server("echo", include=["echo"])}}
        async with ToolRunner.from_config(cfg, python_tools=[py_concat], mcp=env_mcp) as r:
            assert sorted(s.name for s in r.specs()) == ["add", "dumps", "echo", "py_concat"]
            out = await r.run([ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", {"text": "e"}), ToolCall("py_concat", {"a": "p"})])
            assert [x.text for x in out] == ["3.0", "e", "p!"]

    asyncio.run(main())


class _Plain:
    """A Tool with nothing but the protocol's members: the `tools:` section's defaults apply."""

    name, description = "plain", "Sleep."
    parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}}

    def __init__(self) -> None:
        self.closed = 0

    async def call(self, arguments):
        from rlfactory.tools import ToolResult

        await asyncio.sleep(arguments["seconds"])
        return ToolResult("slept")

    async def aclose(self) -> None:
        self.closed += 1


def test_a_tools_own_call_options_apply_unless_per_tool_overrides_them():
    from rlfactory.tools import AgentTool, ModelTool, function_tool
    from rlfactory.tools.base import CallOptions, ClosesAsync, UsesRunner

    async def slow(seconds: float) -> str:
        """Sleep in-process."""
        await asyncio.sleep(seconds)
        return "done"

    async def main():
        own = function_tool(slow, name="own", timeout_s=0.2, cache=False)
        overridden = function_tool(slow, name="overridden", timeout_s=0.2)
        plain = _Plain()
        cfg = ToolsConfig(timeout_s=0.6, per_tool={"overridden": ToolOptions(timeout_s=5)})
        async with ToolRunner([own, overridden, plain], cfg) as r:
            a, b, c, d = await r.run([ToolCall("own", {"seconds": 0.4}), ToolCall("overridden", {"seconds": 0.4}),
                                      ToolCall("plain", {"seconds": 0.4}), ToolCall("plain", {"seconds": 1.0})])
            assert a.status == TIMEOUT and "timed out after 0.2s" in a.text  # its own 0.2 s, not the section's
            assert b.status == OK and c.status == OK  # per_tool's 5 s; the section's 0.6 s
            assert d.status == TIMEOUT and "timed out after 0.6s" in d.text
        assert plain.closed == 1  # ClosesAsync: the runner closed it

    asyncio.run(main())
    agent = AgentTool("agent", "An agent.", lambda args, handle, model: "x", timeout_s=3)
    model = ModelTool("m", "A model.", base_url="http://127.0.0.1:9", model="m", timeout_s=3)
    assert isinstance(agent, CallOptions) and isinstance(model, CallOptions) and isinstance(agent, UsesRunner)
    assert isinstance(model, ClosesAsync) and not isinstance(_Plain(), CallOptions)
    runner = ToolRunner([agent], ToolsConfig(timeout_s=9))
    assert runner._entries["agent"].timeout_s == 3 and agent._handle is not None  # bound to its runner
