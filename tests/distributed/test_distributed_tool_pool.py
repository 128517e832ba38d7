"""Tool-pool actors: real MCP stdio servers in a Ray actor, called by ToolRunners elsewhere."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from rlfactory.tools import ToolRunner
from rlfactory.tools.base import CRASHED, INVALID_ARGUMENTS, OK, TIMEOUT, UNKNOWN_TOOL, ToolCall
from rlfactory.config import ToolsConfig

pytestmark = pytest.mark.slow

SERVERS = {"mcpServers": {
    "calc": {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.calculator"]},
    "fault": {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.fault"]},
}}


def runner_through(pool, **options) -> ToolRunner:
    from rlfactory.distributed.tool_pool import pool_connector

    return ToolRunner.from_config(ToolsConfig(mcp=SERVERS, **options), connect_server=pool_connector(pool))


async def stats(pool) -> dict:
    return await pool.stats.remote()


async def until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Poll `await condition()` until true; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_two_runners_share_each_server_through_one_pool_and_failures_stay_results(ray_cluster):
    from rlfactory.distributed.tool_pool import close_pools, start_pools

    async def go():
        (pool,) = start_pools(1, list(sys.path))
        try:
            async with runner_through(pool) as a, runner_through(pool) as b:
                assert [s.name for s in a.specs()] == [s.name for s in b.specs()]
                assert {"add", "evaluate", "hang", "crash", "ok"} <= {s.name for s in a.specs()}
                r1, r2 = await asyncio.gather(a.call(ToolCall("add", {"a": 2, "b": 3})),
                                              b.call(ToolCall("multiply", {"a": 4, "b": 5})))
                assert (r1.status, r1.text, r2.status, r2.text) == (OK, "5.0", OK, "20.0")
                s = await stats(pool)
                assert set(s["servers"]) == {"calc", "fault"}  # one process per server for both runners
                assert a.server_pids() == {} and s["calls_started"] == 2
                # Validation and unknown names stay in the caller's runner; they never reach the pool.
                bad = await a.call(ToolCall("add", {"a": "two"}))
                unknown = await a.call(ToolCall("nope", {}))
                assert (bad.status, unknown.status) == (INVALID_ARGUMENTS, UNKNOWN_TOOL)
                assert (await stats(pool))["calls_started"] == 2
                # A server that dies mid-call: an error result (the pool restarts the server).
                crashed = await a.call(ToolCall("crash", {}))
                assert crashed.is_error and crashed.status == CRASHED, crashed
                again = await b.call(ToolCall("ok", {"text": "back"}))
                assert (again.status, again.text) == (OK, "back")
                assert (await stats(pool))["servers"]["fault"] != s["servers"]["fault"]
        finally:
            await close_pools([pool])

    asyncio.run(go())


def test_a_timed_out_call_is_cancelled_in_the_pool(ray_cluster):
    from rlfactory.distributed.tool_pool import close_pools, start_pools

    async def go():
        (pool,) = start_pools(1, list(sys.path))
        try:
            async with runner_through(pool, per_tool={"hang": {"timeout_s": 0.5}}) as runner:
                res = await runner.call(ToolCall("hang", {}))
                assert res.status == TIMEOUT
                async def idle() -> bool:
                    return (await stats(pool))["in_flight"] == 0

                await until(idle, "the pool to cancel the timed-out call")  # not left hanging there
        finally:
            await close_pools([pool])

    asyncio.run(go())


def test_a_killed_pool_actor_gives_error_results_and_comes_back(ray_cluster):
    from rlfactory.distributed.tool_pool import close_pools, start_pools

    async def go():
        (pool,) = start_pools(1, list(sys.path))
        try:
            async with runner_through(pool, retries=0) as runner:
                first = await stats(pool)
                call = asyncio.ensure_future(runner.call(ToolCall("hang", {})))
                async def busy() -> bool:
                    return (await stats(pool))["in_flight"] > 0

                async def restarted() -> bool:  # Ray restarts the actor (max_restarts)
                    try:
                        return (await stats(pool))["pid"] != first["pid"]
                    except Exception:  # still restarting
                        return False

                await until(busy, "the call to reach the pool")
                os.kill(first["pid"], signal.SIGKILL)
                res = await call
                assert res.is_error and res.status == CRASHED and "died" in res.text, res
                await until(restarted, "Ray to restart the pool actor")
                # The restarted pool has no servers: the call starts its server there again and goes through.
                ok = await runner.call(ToolCall("add", {"a": 1, "b": 1}))
                assert (ok.status, ok.text) == (OK, "2.0")
                assert set((await stats(pool))["servers"]) == {"calc"}
        finally:
            await close_pools([pool])

    asyncio.run(go())
