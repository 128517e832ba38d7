"""Tool-pool actors: the MCP servers of a Ray run, shared by every rollout worker.

A `ToolPool` actor owns the supervised connections (rlfactory.tools.mcp_client: stdio
subprocesses with restarts and a circuit breaker, or remote endpoints) and runs the calls that
the workers send it. A worker's ToolRunner reaches them through `PoolConnection`, which answers
like a `ServerConnection` (the runner's `connect_server` hook), so naming, per-tool options,
argument validation, timeouts, retries and the cache all stay in the worker's runner, exactly
as in one process; only the transport to the server changes. So a 1,000-trajectory batch over
N workers starts each server once per pool, not once per trajectory or per worker.

Failures keep the tools contract: a server's transport failure comes back as data and is raised
in the worker as the same `TransportError`; a pool actor that died becomes a retryable
`TransportError` (status crashed). The runner turns both into error results, never exceptions.
Cancelling a call in the worker (its timeout) cancels it in the pool, which cancels the request
on the server.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlfactory.tools.base import CRASHED, ToolResult, TransportError
from rlfactory.tools.mcp_client import CallTrace, ServerConnection, ServerPool, SupervisionPolicy, connect
from rlfactory.tools.mcp_config import ServerConfig

if TYPE_CHECKING:
    import mcp_types
    from ray.actor import ActorHandle


@dataclass
class PoolFailure:
    """A call's transport failure, sent back from the pool as data (re-raised in the worker)."""

    message: str
    retryable: bool
    status: str
    unknown_server: bool = False
    """The pool does not hold this server (it was restarted by Ray): start it there again."""


def server_key(name: str, cfg: ServerConfig) -> str:
    """One connection per distinct (name, config): workers whose envs configure a server the
    same way share it; differently configured copies each get their own."""
    return f"{name}:{cfg.model_dump_json()}"


class ToolPool:
    """Ray actor body (see the module doc). Made remote by `start_pools`; methods are async, so one
    actor runs many calls at once on its event loop."""

    def __init__(self, index: int = 0, sys_path: list[str] | None = None) -> None:
        for entry in reversed(sys_path or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.index = index
        self._conns: dict[str, ServerConnection | ServerPool] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.calls_started = 0
        self.in_flight = 0

    async def start(self, name: str, cfg: ServerConfig, policy: SupervisionPolicy) -> list[mcp_types.Tool]:
        """Start server `name` (once per distinct config) and return its MCP tool list."""
        key = server_key(name, cfg)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self._conns.get(key)
            if conn is None:
                conn = self._conns[key] = connect(name, cfg, policy)
            return list(await conn.start())

    async def call(self, key: str, tool: str, arguments: dict[str, Any]) -> ToolResult | PoolFailure:
        conn = self._conns.get(key)
        if conn is None:
            return PoolFailure(f"tool pool {self.index} has no server {key.split(':', 1)[0]!r} (the pool "
                               "restarted)", retryable=True, status=CRASHED, unknown_server=True)
        self.calls_started += 1
        self.in_flight += 1
        try:
            if conn.limiter is None:
                return await conn.call(tool, arguments)
            async with conn.limiter:  # the server's max_concurrency, over every worker's calls
                return await conn.call(tool, arguments)
        except TransportError as e:
            return PoolFailure(str(e), e.retryable, e.status)
        finally:
            self.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        """{"pid", "calls_started", "in_flight", "servers": {name: pid}} for tests and logs."""
        pids = {k: v for c in self._conns.values() for k, v in c.pids().items()}
        return {"pid": os.getpid(), "calls_started": self.calls_started, "in_flight": self.in_flight, "servers": pids}

    async def close(self) -> None:
        """Stop every server (no subprocess outlives the pool)."""
        conns, self._conns = list(self._conns.values()), {}
        try:
            await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)
        finally:
            for c in conns:
                c.kill_now()


class PoolConnection:
    """A worker's connection to one MCP server that runs in a ToolPool actor (see the module doc).
    Has the members a ToolRunner uses of a `ServerConnection`."""

    def __init__(self, name: str, cfg: ServerConfig, policy: SupervisionPolicy,
                 pool: ActorHandle[ToolPool]) -> None:
        self.name, self.cfg, self.policy, self.pool = name, cfg, policy, pool
        self.key = server_key(name, cfg)
        self.tools: list[mcp_types.Tool] = []
        self.limiter = None  # the server's limit is kept by the pool, over all workers
        self.restarts = 0
        self.pid = None

    @property
    def available(self) -> bool:
        return True

    def pids(self) -> dict[str, int]:
        return {}  # the processes belong to the pool actor

    async def start(self) -> list[mcp_types.Tool]:
        from rlfactory.distributed.cluster import actor_died_errors

        try:
            self.tools = await self.pool.start.remote(self.name, self.cfg, self.policy)
        except actor_died_errors() as e:
            raise TransportError(f"the tool pool running MCP server {self.name!r} is unreachable: {e}") from e
        return self.tools

    async def call(self, tool: str, arguments: dict[str, Any], trace: CallTrace | None = None) -> ToolResult:
        """Call `tool` on the pool's server. `trace` (the runner's CallTrace) is left without a
        connection: the pool's own connection watches the server, so a call that outlives its
        timeout here is an ordinary `timeout`, not `unresponsive`."""
        out = await self._call(tool, arguments)
        if isinstance(out, PoolFailure) and out.unknown_server:
            await self.start()  # a pool that Ray restarted has lost its servers: start this one there again
            out = await self._call(tool, arguments)
        if isinstance(out, PoolFailure):
            raise TransportError(out.message, retryable=out.retryable, status=out.status)
        return out

    async def _call(self, tool: str, arguments: dict[str, Any]) -> ToolResult | PoolFailure:
        import ray

        from rlfactory.distributed.cluster import actor_died_errors

        ref = self.pool.call.remote(self.key, tool, arguments)
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # the pool cancels its call, and with it the request on the server
            raise
        except actor_died_errors() as e:
            raise TransportError(f"the tool pool running MCP server {self.name!r} died: {type(e).__name__}",
                                 retryable=True, status=CRASHED) from e

    async def aclose(self) -> None:
        pass  # the pool stops the servers

    def kill_now(self) -> None:
        pass


def pool_connector(pool: ActorHandle[ToolPool]) -> Callable[[str, ServerConfig, SupervisionPolicy], PoolConnection]:
    """A ToolRunner `connect_server` that reaches every MCP server through `pool`."""

    def connect_through_pool(name: str, cfg: ServerConfig, policy: SupervisionPolicy) -> PoolConnection:
        return PoolConnection(name, cfg, policy, pool)

    return connect_through_pool


def start_pools(count: int, sys_path: list[str]) -> list[ActorHandle[ToolPool]]:
    """`count` ToolPool actors (no CPU reserved: they wait on servers; restarted by Ray if they die)."""
    import ray

    actor = ray.remote(ToolPool).options(num_cpus=0, max_restarts=3, max_concurrency=100_000)
    return [actor.remote(i, sys_path) for i in range(count)]


async def close_pools(pools: list[ActorHandle[ToolPool]], timeout_s: float = 30.0) -> None:
    """Stop the pools' servers politely, then end the actors."""
    from rlfactory.distributed.cluster import end_actors

    try:
        await asyncio.wait_for(asyncio.gather(*(p.close.remote() for p in pools), return_exceptions=True), timeout_s)
    except TimeoutError:
        pass
    await end_actors(pools)
