"""No server subprocess outlives its runner: normal exit, an exception, Ctrl-C (SIGINT), and a
grandchild that left the server's process group with setsid()."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from conftest import pid_alive, server, time_server, wait_gone

from rlfactory.config import ToolsConfig
from rlfactory.tools import CRASHED, OK, ToolCall, ToolRunner

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


def _as_in_a_terminal() -> None:
    # A process started in the background of a shell without job control (as a CI runner may
    # start the test suite) inherits SIGINT *ignored*, and so would the script below: Ctrl-C would
    # never reach it. A terminal's foreground process has the default disposition; give it that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_to_a_process_running_a_runner_stops_its_servers():
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(MCP)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_as_in_a_terminal,
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


def processes_marked(token: str) -> list[int]:
    """Living processes with `token` on their command line (found by the host's /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if token.encode() in f.read() and pid_alive(int(entry.name)):
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("isolate", [True, False], ids=["pid_namespace", "process_group_and_proc_sweep"])
def test_a_setsid_grandchild_does_not_outlive_the_runner(isolate):
    token = f"grandchild-{uuid.uuid4().hex}"
    mcp = {"mcpServers": {"fault": server("fault", env={"FAULT_GRANDCHILD": token})}}

    async def main():
        async with ToolRunner(config=ToolsConfig(isolate_server_pids=isolate), mcp=mcp) as r:
            assert (await r.call(ToolCall("ok", {"text": "up"}))).text == "up"
            grandchildren = [p for p in processes_marked(token) if p not in r.server_pids().values()]
            assert grandchildren  # it is running, in a session of its own
            assert r.connections["fault"].process.isolated is isolate

    asyncio.run(main())
    assert wait_gone(processes_marked(token), timeout=2.0) == []


@pytest.mark.parametrize("isolate", [True, False], ids=["pid_namespace", "process_group_and_proc_sweep"])
def test_a_server_that_exits_while_a_grandchild_holds_its_stdout_is_noticed_at_once(isolate):
    # The grandchild keeps the server's stdout open: EOF never comes. Without watching the process
    # itself, the crashed call would wait for its 120 s timeout (and the test for it).
    token = f"grandchild-{uuid.uuid4().hex}"
    mcp = {"mcpServers": {"fault": server("fault", env={"FAULT_GRANDCHILD": token})}}

    async def main():
        async with ToolRunner(config=ToolsConfig(timeout_s=120, isolate_server_pids=isolate), mcp=mcp) as r:
            first, its_grandchild = r.server_pids()["fault"], processes_marked(token)
            assert len(its_grandchild) == 1
            crash = await r.call(ToolCall("crash"))  # crashes, is restarted, crashes again
            assert crash.status == CRASHED and "exit code 3" in crash.text
            # and the grandchild that held the crashed server's stdout went with it
            assert wait_gone([first, *its_grandchild]) == []
            assert (await r.call(ToolCall("ok", {"text": "again"}))).status == OK

    asyncio.run(main())
    assert wait_gone(processes_marked(token), timeout=2.0) == []


def test_the_proc_sweep_spares_a_worker_this_process_forked():
    # A worker forked by the trainer after a server started (a DataLoader worker, say) holds copies
    # of the server's pipes too; it is this process's, not the server's, and must survive the sweep.
    async def main():
        async with ToolRunner(config=ToolsConfig(isolate_server_pids=False), mcp={"mcpServers": {"echo": server("echo")}}) as r:
            server_pid = r.server_pids()["echo"]
            worker = os.fork()
            if worker == 0:  # the worker: holds what it inherited, does nothing
                time.sleep(60)
                os._exit(0)
        return server_pid, worker

    server_pid, worker = asyncio.run(main())
    try:
        assert wait_gone([server_pid]) == []
        assert pid_alive(worker)
    finally:
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
