"""Streamable HTTP and SSE servers on 127.0.0.1, next to a stdio one."""

import asyncio

from rlfactory.config import ToolsConfig
from rlfactory.tools import CIRCUIT_OPEN, CRASHED, UNKNOWN_TOOL, ToolCall, ToolRunner


def test_streamable_http_and_sse_servers(http_server):
    http_url, http_proc = http_server("echo", "streamable-http")
    sse_url, _ = http_server("calculator", "sse")
    mcp = {
        "mcpServers": {
            "web": {"url": http_url},
            "events": {"url": sse_url, "transport": "sse"},
        }
    }

    async def main():
        async with ToolRunner(config=ToolsConfig(timeout_s=10, retry_backoff_s=0.01, circuit_cooldown_s=60), mcp=mcp) as r:
            names = {s.name for s in r.specs()}
            assert {"echo", "sleep", "pid", "add", "evaluate"} <= names
            assert r.server_pids() == {}  # remote servers have no process of ours
            res = await r.run(
                [ToolCall("echo", {"text": f"h{i}"}) for i in range(10)]
                + [ToolCall("add", {"a": i, "b": 1}) for i in range(10)]
                + [ToolCall("sleep", {"seconds": 0.2})] * 10
                + [ToolCall("web.evaluate", {"expression": "1"}), ToolCall("events.evaluate", {"expression": "2"})]
            )
            assert [x.text for x in res[:10]] == [f"h{i}" for i in range(10)]
            assert [x.text for x in res[10:20]] == [f"{float(i + 1)}" for i in range(10)]
            assert all(x.text == "slept 0.2s" for x in res[20:30])
            assert res[30].status == UNKNOWN_TOOL and res[31].text == "2"  # web has no evaluate
            assert all(r.connections[n].cfg.transport == t for n, t in [("web", "streamable-http"), ("events", "sse")])

            # the HTTP server goes away: an error result naming it, then fail-fast, others unaffected
            http_proc.kill()
            http_proc.wait()
            res = await r.call(ToolCall("echo", {"text": "down"}))
            assert res.is_error and res.status in (CRASHED, CIRCUIT_OPEN) and "'web'" in res.text
            again = await r.call(ToolCall("echo", {"text": "down"}))
            assert again.status == CIRCUIT_OPEN and "fail fast" in again.text
            assert (await r.call(ToolCall("add", {"a": 1, "b": 1}))).text == "2.0"

    asyncio.run(main())
