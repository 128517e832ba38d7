"""`unresponsive` (the server sent nothing at all while the call waited) versus `timeout` (the
server kept talking; this call was slow), on real server processes."""

import asyncio

from conftest import server

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import OK, TIMEOUT, UNRESPONSIVE, ToolCall, ToolRunner


def test_a_frozen_server_is_unresponsive_and_a_slow_call_on_a_live_server_is_a_timeout():
    cfg = ToolsConfig(per_tool={n: ToolOptions(timeout_s=1.0) for n in ("freeze", "hang", "wait")})

    async def main():
        async with ToolRunner(config=cfg, mcp={"mcpServers": {"fault": server("fault")}}) as r:
            # alone on an idle server, the call never answers, but the server answers the ping
            # sent halfway through the timeout: alive, so an ordinary timeout
            hang = await r.call(ToolCall("hang"))
            assert hang.status == TIMEOUT and "sent nothing" not in hang.text
            # a slow call while other calls keep being answered: a timeout too
            slow, *others = await r.run([ToolCall("wait", {"seconds": 30})] + [ToolCall("ok", {"text": "x"})] * 3)
            assert slow.status == TIMEOUT and all(o.status == OK for o in others)
            # the whole server blocked: no answer, no ping reply -> unresponsive
            frozen = await r.call(ToolCall("freeze", {"seconds": 3}))
            assert frozen.status == UNRESPONSIVE and frozen.is_error
            assert "timed out after 1s" in frozen.text and "sent nothing at all" in frozen.text
            # the same server, thawed, answers again
            for _ in range(50):
                back = await r.call(ToolCall("ok", {"text": "thawed"}))
                if back.status == OK:
                    break
            assert back.text == "thawed"
            assert r.metrics()["freeze"].timeouts == 1

    asyncio.run(main())


def test_a_python_tool_that_times_out_is_a_timeout():
    async def stuck() -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return "never"

    async def main():
        async with ToolRunner([stuck], ToolsConfig(timeout_s=0.2)) as r:
            assert (await r.call(ToolCall("stuck"))).status == TIMEOUT

    asyncio.run(main())
