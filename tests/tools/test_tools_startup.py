"""Start-up: a server that never answers `initialize` costs its own calls only, each within its timeout."""

import asyncio
import sys
from pathlib import Path

from conftest import server

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import CRASHED, OK, UNKNOWN_TOOL, UNRESPONSIVE, ToolCall, ToolRunner
from rlfactory.tools.runner import ToolStartError

MUTE = str(Path(__file__).with_name("mute_server.py"))


def mute(starts: Path, startup_timeout_s: float) -> dict:
    return {"command": sys.executable, "args": [MUTE, str(starts)], "startup_timeout_s": startup_timeout_s}


def test_a_mute_server_costs_only_its_own_calls_each_within_its_timeout(tmp_path):
    starts = tmp_path / "starts"
    cfg = ToolsConfig(circuit_cooldown_s=60, per_tool={"mute_tool": ToolOptions(timeout_s=0.5)})
    mcp = {"mcpServers": {"mute": mute(starts, 2.0), "echo": server("echo")}}

    async def main():
        r = ToolRunner(config=cfg, mcp=mcp)  # no start(): the first calls start the servers
        try:
            # 20 calls of the healthy server's tool, and calls of a name only the mute server could have
            echo_calls = [ToolCall("echo", {"text": str(i)}) for i in range(20)]
            results = await r.run(echo_calls + [ToolCall("mute_tool")] * 3)
            assert [x.text for x in results[:20]] == [str(i) for i in range(20)]
            assert all(x.status == OK and x.latency_s > 0 for x in results[:20])
            # the mute server is still starting when their 0.5 s run out: not a model mistake
            for x in results[20:]:
                assert x.status == UNRESPONSIVE and "mute" in x.text and "did not finish starting" in x.text
                assert x.latency_s >= 0.5
            # however many calls asked, one start attempt at a time
            if r._servers.attempts():
                await asyncio.wait(r._servers.attempts())
            assert starts.read_text().count("started") == 1
            assert "mute" in r._servers.errors and "start-up timeout of 2s" in r._servers.errors["mute"]

            # during the cool-down the healthy server serves as before; the mute one is not respawned
            assert (await r.call(ToolCall("echo", {"text": "still"}))).text == "still"
            gone = await r.call(ToolCall("mute_tool"))
            assert gone.status == CRASHED and "failed to start" in gone.text and "next attempt in" in gone.text
            assert gone.latency_s > 0  # the real time it took, not 0
            assert starts.read_text().count("started") == 1
        finally:
            await r.aclose()

    asyncio.run(main())


def test_start_names_the_mute_server_and_calls_made_anyway_still_reach_the_healthy_one(tmp_path):
    starts = tmp_path / "starts"
    mcp = {"mcpServers": {"mute": mute(starts, 1.0), "echo": server("echo")}}

    async def main():
        r = ToolRunner(config=ToolsConfig(circuit_cooldown_s=60), mcp=mcp)
        try:
            try:
                await r.start()
                raise AssertionError("start() should have failed")
            except ToolStartError as e:
                assert "mute" in str(e) and "start-up timeout of 1s" in str(e) and "echo" not in str(e)
            assert r.server_pids() == {}  # a failed start leaves nothing running
            # calls made anyway start the healthy server again; the mute one waits out its cool-down
            assert (await r.call(ToolCall("echo", {"text": "served"}))).text == "served"
            assert [s.name for s in r.specs()] == ["echo", "sleep", "pid"]
            unknown = await r.call(ToolCall("nope"))
            assert unknown.status == CRASHED and "mute" in unknown.text  # it might be the mute server's
            assert starts.read_text().count("started") == 1
        finally:
            await r.aclose()

    asyncio.run(main())


def test_an_unknown_name_is_an_ordinary_unknown_tool_once_every_server_is_up():
    async def main():
        async with ToolRunner(mcp={"mcpServers": {"echo": server("echo")}}) as r:
            res = await r.call(ToolCall("ecko"))
            assert res.status == UNKNOWN_TOOL and "Did you mean echo" in res.text

    asyncio.run(main())
