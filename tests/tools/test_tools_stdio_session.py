"""The MCP client over stdio (`StdioSession`) against real server processes, and the SDK's client
against rlfactory's own stdio servers (which answer without the SDK's lowlevel server)."""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import server
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import ERROR, OK, TIMEOUT, ToolCall, ToolRunner
from rlfactory.tools.mcp_session import ConnectionLost, StdioSession
from rlfactory.tools.stdio import StdioProcess

WIRE = {"command": sys.executable, "args": [str(Path(__file__).with_name("wire_server.py"))]}


def run_wire(check, config=None):
    async def main():
        async with ToolRunner(config=config, mcp={"mcpServers": {"wire": WIRE}}) as r:
            await check(r)

    asyncio.run(main())


def test_handshake_and_a_paged_tool_list():
    async def check(r):
        names = [s.name for s in r.specs()]
        assert names == [
            "echo_back", "handshake", "ask_client", "rich", "bad_output", "rpc_error", "slow", "cancelled", "mixed", "flood",
            "deep", "bad_utf8", "garbled", "surrogate",
        ]
        said = json.loads((await r.call(ToolCall("handshake"))).text)
        assert said["initialized"] is True  # notifications/initialized came after the answer
        assert said["params"]["protocolVersion"] == LATEST_HANDSHAKE_VERSION
        assert said["params"]["capabilities"] == {} and said["params"]["clientInfo"]["name"] == "rlfactory"

    run_wire(check)


def test_server_requests_and_notifications_in_the_middle_of_a_call():
    async def check(r):
        res = await r.call(ToolCall("ask_client"))
        answers = json.loads(res.text)
        assert answers["ping"] == {"jsonrpc": "2.0", "id": "srv-1", "result": {}}
        assert answers["roots"]["id"] == "srv-2" and answers["roots"]["error"]["code"] == -32601
        assert (await r.call(ToolCall("echo_back", {"text": "still fine"}))).text == "still fine"

    run_wire(check)


def test_concurrent_calls_answered_out_of_order_reach_their_callers():
    async def check(r):
        t0 = time.monotonic()
        calls = [ToolCall("echo_back", {"text": f"call {i}", "delay": (50 - i) * 0.01}) for i in range(50)]
        results = await r.run(calls)
        assert [x.text for x in results] == [f"call {i}" for i in range(50)]
        assert time.monotonic() - t0 < 2.0  # 50 overlapping calls, not 12.75 s of sequential delays

    run_wire(check)


def test_content_kinds_json_rpc_errors_and_output_schema_violations():
    async def check(r):
        rich, bad, rpc = await r.run([ToolCall("rich"), ToolCall("bad_output"), ToolCall("rpc_error")])
        # the server's "image" is the three bytes b"img": not a picture, so a line says so in its place
        assert rich.status == OK and rich.data == {"n": 1} and rich.images == []
        blocks = ["first", "[image image/png not shown: 3 bytes (sent as image/png) are not an image Pillow can read]",
                  "inside", "[binary resource file:///b.bin]", "[resource file:///c.txt]"]
        assert rich.text.split("\n") == blocks
        assert bad.is_error and bad.status == ERROR and "returned an invalid result" in bad.text and "integer" in bad.text
        assert rpc.is_error and rpc.status == ERROR and rpc.text == "wire.rpc_error: bad things happened"

    run_wire(check)


def test_a_content_block_of_an_unknown_kind_keeps_the_valid_blocks():
    async def check(r):
        res = await r.call(ToolCall("mixed"))
        assert res.status == OK and not res.is_error
        assert res.text.split("\n") == ["the valid part", "[content block of unsupported type 'hologram' left out]", "after it"]

    run_wire(check)


def test_an_answer_over_max_result_bytes_with_its_id_last_fails_only_its_call():
    async def check(r):
        flood, small, echo = await r.run([
            ToolCall("flood", {"size": 5_000_000}),
            ToolCall("flood", {"size": 50_000}),
            ToolCall("echo_back", {"text": "meanwhile"}),
        ])
        assert flood.status == ERROR and flood.truncated and "(5,000,100 bytes)" in flood.text and "max_result_bytes=100,000" in flood.text
        assert small.status == OK and small.text == "y" * 8000 + "\n...[truncated: showing 8000 of 50000 characters]"
        assert echo.text == "meanwhile"
        assert r.connections["wire"].process.garbage_lines == 0

    run_wire(check, ToolsConfig(max_result_bytes=100_000))


def test_hostile_answers_fail_their_own_call_at_once_and_the_session_lives_on():
    async def check(r):
        pid = r.server_pids()["wire"]
        t0 = time.monotonic()
        deep, deeper, bad, garbled, surrogate, echo = await r.run([
            ToolCall("deep", {"depth": 100_000}),  # 200 KB: past Python's own recursion limit
            ToolCall("deep", {"depth": 150}),  # parses, but past MAX_MESSAGE_DEPTH
            ToolCall("bad_utf8"),
            ToolCall("garbled"),
            ToolCall("surrogate"),
            ToolCall("echo_back", {"text": "meanwhile"}),
        ])
        assert time.monotonic() - t0 < 2.0  # none waited for its 5 s timeout
        for res in (deep, deeper):
            assert res.status == ERROR and "the server's answer is nested deeper than 100 levels" in res.text
        assert bad.status == OK and bad.text == "caf\u00e9 \ufffd\ufffd \ufffd end"
        assert garbled.status == ERROR and "the server's answer is not valid JSON" in garbled.text
        assert surrogate.status == OK and surrogate.text == "half \ufffd here" and surrogate.replaced_chars == 1
        assert echo.text == "meanwhile"
        # the same process and session still answer: nothing was restarted
        assert (await r.call(ToolCall("deep", {"depth": 20}))).status == OK
        assert (await r.call(ToolCall("echo_back", {"text": "after"}))).text == "after"
        assert r.server_pids()["wire"] == pid and r.connections["wire"].process.garbage_lines == 0

    run_wire(check, ToolsConfig(timeout_s=5))


def test_a_call_that_times_out_is_cancelled_on_the_server():
    async def check(r):
        t0 = time.monotonic()
        res = await r.call(ToolCall("slow"))
        assert res.status == TIMEOUT and time.monotonic() - t0 < 1.5
        cancelled = json.loads((await r.call(ToolCall("cancelled"))).text)
        assert len(cancelled) == 1 and isinstance(cancelled[0], int)

    run_wire(check, ToolsConfig(per_tool={"slow": ToolOptions(timeout_s=0.3)}))


def test_a_cancelled_call_stops_waiting_at_once_and_the_server_is_told():
    async def check(r):
        task = asyncio.create_task(r.call(ToolCall("slow")))  # the default timeout is 30 s
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 0.5
        cancelled = json.loads((await r.call(ToolCall("cancelled"))).text)
        assert len(cancelled) == 1 and isinstance(cancelled[0], int)

    run_wire(check)


def test_a_dying_server_fails_its_pending_calls_at_once():
    cfg = server("fault")

    async def main():
        process = await StdioProcess.spawn("fault", sys.executable, cfg["args"], dict(os.environ))
        session = StdioSession("fault", process)
        try:
            tools = await session.start()
            assert "hang" in {t.name for t in tools}
            hangs = [asyncio.create_task(session.call_tool("hang", {})) for _ in range(3)]
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            process.kill_now()
            for h in hangs:
                with pytest.raises(ConnectionLost, match="'fault' (exited|closed its output)"):
                    await h
            assert time.monotonic() - t0 < 2.0 and session.closed
            with pytest.raises(ConnectionLost):
                await session.call_tool("ok", {})
        finally:
            await session.aclose()
            await process.stop(0.1)

    asyncio.run(main())


def test_the_sdk_client_talks_to_rlfactory_stdio_servers():
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "rlfactory.tools.servers.echo"], env=dict(os.environ))

    async def main():
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "echo" and init.capabilities.tools is not None
                assert [t.name for t in (await session.list_tools()).tools] == ["echo", "sleep", "pid"]
                res = await session.call_tool("echo", {"text": "hi"})
                assert res.content[0].text == "hi" and res.structured_content == {"result": "hi"} and not res.is_error
                bad = await session.call_tool("echo", {"text": 5})
                assert bad.is_error and "validation error" in bad.content[0].text
                unknown = await session.call_tool("nope", {})
                assert unknown.is_error and "Unknown tool" in unknown.content[0].text
                t0 = time.monotonic()
                sleeps = await asyncio.gather(*(session.call_tool("sleep", {"seconds": 0.3}) for _ in range(20)))
                assert all(s.content[0].text == "slept 0.3s" for s in sleeps) and time.monotonic() - t0 < 2.0
                await session.send_ping()

    asyncio.run(main())
