"""Supervision: a server that hangs, crashes, writes garbage, floods output or starts slowly."""

import asyncio
import collections
import time

import pytest
from conftest import pid_alive, server, wait_gone

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import CIRCUIT_OPEN, CRASHED, ERROR, OK, TIMEOUT, UNRESPONSIVE, ToolCall, ToolRunner
from rlfactory.tools.runner import ToolStartError


def test_all_faults_are_survived():
    cfg = ToolsConfig(
        timeout_s=10,
        max_output_chars=1000,
        crash_limit=2,
        circuit_cooldown_s=1.0,
        per_tool={"hang": ToolOptions(timeout_s=0.5)},
    )
    mcp = {"mcpServers": {"fault": server("fault"), "echo": server("echo", include=["echo"])}}

    async def main():
        async with ToolRunner(config=cfg, mcp=mcp) as r:
            first_pid = r.server_pids()["fault"]
            echo_pid = r.server_pids()["echo"]

            # hang: the call times out, the server and the session stay usable
            hang, ok = await r.run([ToolCall("hang"), ToolCall("ok", {"text": "alongside"})])
            assert hang.status == TIMEOUT and "timed out after 0.5s" in hang.text
            assert ok.text == "alongside"
            assert (await r.call(ToolCall("ok", {"text": "after hang"}))).text == "after hang"

            # garbage on the protocol stream: skipped, the call still answers
            g = await r.call(ToolCall("garbage"))
            assert g.status == OK and g.text == "after garbage"
            assert r.connections["fault"].process.garbage_lines >= 2

            # huge output (a 2 MB message, under max_result_bytes): delivered, then cut for the model
            h = await r.call(ToolCall("huge", {"chars": 1_000_000}))
            assert h.status == OK and h.truncated and "showing 1000 of 1000000 characters" in h.text

            # crash: restarted and retried once; the retry crashes too -> a readable CRASHED result
            c = await r.call(ToolCall("crash"))
            assert c.is_error and c.status == CRASHED and "restarted and the call retried once" in c.text
            assert "exit code 3" in c.text and "crashing on purpose" in c.text  # the exit status and stderr tail
            assert wait_gone([first_pid]) == []
            # two crashes within the window opened the circuit: calls fail fast, other servers unaffected
            t0 = time.monotonic()
            fast = await r.call(ToolCall("ok"))
            assert fast.status == CIRCUIT_OPEN and "fails fast" in fast.text or "fail fast" in fast.text
            assert time.monotonic() - t0 < 0.5
            assert (await r.call(ToolCall("echo", {"text": "independent"}))).text == "independent"
            assert r.server_pids()["echo"] == echo_pid
            # after the cool-down the server is started afresh and answers again
            await asyncio.sleep(1.1)
            again = await r.call(ToolCall("ok", {"text": "back"}))
            assert again.text == "back"
            new_pid = r.server_pids()["fault"]
            assert new_pid != first_pid and pid_alive(new_pid)
            m = r.metrics()
            assert m["hang"].timeouts == 1 and m["crash"].errors == 1 and m["ok"].errors == 1

    asyncio.run(main())


def test_a_server_that_crashes_once_is_restarted_and_the_call_succeeds():
    async def main():
        async with ToolRunner(mcp={"mcpServers": {"fault": server("fault")}}) as r:
            pid = r.server_pids()["fault"]
            # kill the server from outside, between calls: the next call restarts it transparently
            r.connections["fault"].process.kill_now()
            assert wait_gone([pid]) == []
            res = await r.call(ToolCall("ok", {"text": "recovered"}))
            assert res.text == "recovered" and r.server_pids()["fault"] != pid

            # killed while calls are in flight: each is retried once, on the restarted server
            pid2 = r.server_pids()["fault"]
            session = r.connections["fault"]._session
            pending = asyncio.ensure_future(r.run([ToolCall("wait", {"seconds": 0.5, "text": str(i)}) for i in range(5)]))
            while session.pending < 5:  # all five sent and not answered yet
                await asyncio.sleep(0.01)
            r.connections["fault"].process.kill_now()
            results = await pending
            assert [(x.status, x.text) for x in results] == [(OK, str(i)) for i in range(5)]
            assert r.connections["fault"].restarts == 2 and r.server_pids()["fault"] != pid2
            assert session.closed and r.connections["fault"]._session is not session

    asyncio.run(main())


def test_slow_start_is_waited_for_and_too_slow_start_is_a_clear_error():
    slow = server("fault", env={"FAULT_STARTUP_DELAY_S": "1.0"})

    async def main():
        cfg = ToolsConfig(startup_timeout_s=20, timeout_s=0.4)
        async with ToolRunner(config=cfg, mcp={"mcpServers": {"slow": slow}}) as r:
            assert (await r.call(ToolCall("ok", {"text": "late"}))).text == "late"
            # killed: the restart takes longer than a call's timeout; calls that time out while
            # waiting must not abort the restart, so a later call gets through
            pid = r.server_pids()["slow"]
            r.connections["slow"].process.kill_now()
            statuses = []
            for _ in range(30):
                res = await r.call(ToolCall("ok", {"text": "back"}))
                statuses.append(res.status)
                if res.status == OK:
                    break
            # the restarting server says nothing until it is up: the first calls are unresponsive
            assert statuses[0] == UNRESPONSIVE and statuses[-1] == OK and res.text == "back"
            assert r.server_pids()["slow"] != pid
        r = ToolRunner(config=ToolsConfig(startup_timeout_s=0.3), mcp={"mcpServers": {"slow": slow}})
        with pytest.raises(ToolStartError, match=r"slow.*start-up timeout of 0.3s"):
            await r.start()
        await r.aclose()

    asyncio.run(main())


def test_a_server_that_cannot_start_is_named_with_its_reason():
    dies = {"command": "python", "args": ["-c", "import sys; sys.stderr.write('missing API key\\n'); sys.exit(2)"]}

    async def main():
        r = ToolRunner(mcp={"mcpServers": {"dies": dies, "absent": {"command": "/nonexistent/server"}}})
        with pytest.raises(ToolStartError) as e:
            await r.start()
        msg = str(e.value)
        assert "dies" in msg and "exit code 2" in msg and "missing API key" in msg
        assert "absent" in msg and "No such file" in msg
        # calls made anyway are error results, and do not respawn the servers on every call
        res = await r.call(ToolCall("anything"))
        assert res.is_error and res.status == CRASHED and "missing API key" in res.text
        assert res.latency_s > 0
        await r.aclose()

    asyncio.run(main())


def test_a_pool_of_server_processes_spreads_calls_and_routes_around_a_broken_copy():
    cfg = ToolsConfig(crash_limit=2, circuit_cooldown_s=60)

    async def main():
        async with ToolRunner(config=cfg, mcp={"mcpServers": {"fault": server("fault", processes=3)}}) as r:
            pids = r.server_pids()
            assert sorted(pids) == ["fault", "fault#1", "fault#2"] and len(set(pids.values())) == 3
            answered = collections.Counter(x.text for x in await r.run([ToolCall("instance")] * 30))
            assert sorted(answered.values()) == [10, 10, 10]

            # a copy killed from outside: its calls are retried on its restart, the others are untouched
            pool = r.connections["fault"]
            pool.members[1].process.kill_now()
            results = await r.run([ToolCall("ok", {"text": str(i)}) for i in range(30)])
            assert [x.text for x in results] == [str(i) for i in range(30)]
            assert r.server_pids()["fault#1"] != pids["fault#1"] and r.server_pids()["fault#2"] == pids["fault#2"]

            # a copy that crashes twice opens its own circuit; calls go to the other copies meanwhile
            crash = await r.call(ToolCall("crash"))
            assert crash.status == CRASHED
            broken = [m for m in pool.members if not m.available]
            assert len(broken) == 1
            after = await r.run([ToolCall("ok", {"text": "fine"})] * 20)
            assert all(x.status == OK for x in after)

    asyncio.run(main())


def test_a_result_over_max_result_bytes_is_dropped_and_the_other_calls_are_answered():
    # `huge` answers with its text twice (content and structured content): 2 bytes per character
    cfg = ToolsConfig(max_result_bytes=1_000_000, timeout_s=30)
    big = {"mcpServers": {"fault": server("fault"), "roomy": server("fault", max_result_bytes=8_000_000)}}

    async def main():
        async with ToolRunner(config=cfg, mcp=big) as r:
            floods = [ToolCall("fault.huge", {"chars": 3_000_000})] * 2
            results = await r.run(floods + [ToolCall("fault.ok", {"text": str(i)}) for i in range(5)])
            for flood in results[:2]:
                assert flood.status == ERROR and flood.is_error and flood.truncated
                assert "over the limit of max_result_bytes=1,000,000" in flood.text and "raise `max_result_bytes`" in flood.text
            assert [(x.status, x.text) for x in results[2:]] == [(OK, str(i)) for i in range(5)]
            assert r.connections["fault"].process.garbage_lines == 0  # both attributed to their calls
            # the per-server limit: the same answer from `roomy` is taken, then cut for the model
            roomy = await r.call(ToolCall("roomy.huge", {"chars": 3_000_000}))
            assert roomy.status == OK and roomy.truncated and "showing 8000 of 3000000 characters" in roomy.text

    asyncio.run(main())
