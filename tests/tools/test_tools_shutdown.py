"""No server subprocess outlives its runner: normal exit, an exception, Ctrl-C (SIGINT)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import pid_alive, server, time_server, wait_gone

from rlfactory.tools import ToolCall, ToolRunner

MCP = {"mcpServers": {"fault": server("fault"), "time": time_server()}}


def test_servers_are_gone_after_normal_exit_and_after_an_exception():
    seen: list[int] = []

    async def main():
        async with ToolRunner(mcp=MCP) as r:
            pids = list(r.server_pids().values())
            seen.extend(pids)
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
            # a hanging call is in flight when the exception unwinds the runner
            asyncio.ensure_future(r.call(ToolCall("hang")))
            await asyncio.sleep(0.1)
            raise RuntimeError("the training loop failed")

    with pytest.raises(RuntimeError, match="training loop failed"):
        asyncio.run(main())
    assert wait_gone(seen, timeout=0.5) == []

    async def normal():
        async with ToolRunner(mcp={"mcpServers": {"echo": server("echo")}}) as r:
            pid = r.server_pids()["echo"]
            assert (await r.call(ToolCall("echo", {"text": "x"}))).text == "x"
        return pid

    assert wait_gone([asyncio.run(normal())], timeout=0.5) == []


SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from rlfactory.tools import ToolCall, ToolRunner

    async def main():
        async with ToolRunner(mcp=json.loads(sys.argv[1])) as r:
            print(json.dumps(r.server_pids()), flush=True)
            await r.run([ToolCall("hang"), ToolCall("hang")])

    asyncio.run(main())
    """
)


def test_sigint_to_a_process_running_a_runner_stops_its_servers():
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(MCP)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()
        pids = list(json.loads(line).values())
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        # Ctrl-C ends it in about half a second. The wait stays under the hanging calls' 30 s tool
        # timeout on purpose: a cancellation swallowed on the way down (as once inside the mcp SDK's
        # session) would let the calls run into that timeout, and fail here.
        _, err = proc.communicate(timeout=15)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        # the runner stopped its servers before the process ended
        assert wait_gone(pids, timeout=0.5) == []
    finally:
        proc.kill()
