"""MCP servers behind the `Tool` protocol: one supervised connection per server.

`ServerConnection` owns one server (a stdio subprocess, or a streamable-HTTP / SSE endpoint) and
one session on it (`StdioSession`, or the SDK's `ClientSession` for remote servers); every call of
every trajectory shares that session, which multiplexes concurrent requests. When the connection
dies mid-call (the subprocess crashed, the socket dropped), it is re-established and the call
retried once; repeated crashes open a circuit for a cool-down, during which calls fail fast with a
clear message. `ServerPool` runs `processes: N` copies of a stdio server, each supervised on its
own, and sends each call to the copy with the fewest calls in flight. `MCPTool` is one tool of a
server.

A call can carry a `CallTrace`: the connection it went to notes itself there, and halfway through
the call's timeout, if the server has sent nothing since the call started, it is sent a `ping`.
When the call times out, `CallTrace.server_silent()` says whether the server sent anything at all
meanwhile (the runner's `unresponsive` versus `timeout`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import mcp_types

from rlfactory.images import Image, ImageError, image_from_base64
from rlfactory.tools.base import CIRCUIT_OPEN, CRASHED, ERROR, ToolResult, TransportError
from rlfactory.tools.mcp_config import ServerConfig
from rlfactory.tools.mcp_session import (
    DEFAULT_MAX_RESULT_BYTES,
    ConnectionLost,
    InvalidResult,
    ResultTooLarge,
    ServerError,
    Session,
    StdioSession,
)
from rlfactory.tools.stdio import StdioProcess

log = logging.getLogger("rlfactory.tools.mcp")


@dataclass
class SupervisionPolicy:
    """When a server counts as broken, and for how long calls then fail fast."""

    startup_timeout_s: float = 30.0
    crash_limit: int = 3
    crash_window_s: float = 60.0
    cooldown_s: float = 30.0
    stop_grace_s: float = 2.0
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    isolate_pids: bool = True


@dataclass
class CallTrace:
    """One call's dealings with its server: when it started (`time.monotonic()`), its timeout,
    and the connection that took it (None until one did, and for tools that are not MCP)."""

    started: float
    timeout_s: float
    connection: "ServerConnection | None" = None

    def server_silent(self) -> bool:
        """True when the call reached a server that has sent no message at all since it started."""
        return self.connection is not None and self.connection.last_heard < self.started


class ServerConnection:
    """One MCP server: start/connect, list tools, call, restart after a crash, shut down."""

    def __init__(self, name: str, cfg: ServerConfig, policy: SupervisionPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.policy = policy or SupervisionPolicy()
        self.tools: list[mcp_types.Tool] = []
        self.process: StdioProcess | None = None
        self.restarts = 0
        self._session: Session | None = None  # the session calls go to; None while down
        self._open: Session | None = None  # the session that holds resources (up, dead or half-open)
        self._generation = 0
        self._starting: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._crashes: collections.deque[float] = collections.deque()
        self._open_until = 0.0
        self._closed = False
        self._heard = 0.0  # last message of the sessions before the current one
        self.limiter = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def pids(self) -> dict[str, int]:
        return {self.name: self.pid} if self.pid is not None else {}

    @property
    def last_heard(self) -> float:
        """`time.monotonic()` when the server last sent any message, over all its restarts (0.0: never)."""
        session = self._open
        return max(self._heard, session.last_heard) if session is not None else self._heard

    def probe(self, since: float) -> None:
        """Ping the server if it has sent nothing since `since` (its answer sets `last_heard`)."""
        session = self._session
        if session is not None and self.last_heard < since:
            session.ping()

    @property
    def available(self) -> bool:
        """False while shut down or while its circuit is open."""
        return not self._closed and time.monotonic() >= self._open_until

    async def start(self) -> list[mcp_types.Tool]:
        """Connect (spawning the process for stdio) and list the server's tools."""
        await self._ensure()
        return self.tools

    async def aclose(self) -> None:
        self._closed = True
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
        async with self._lock:
            await self._teardown()

    def kill_now(self) -> None:
        """Synchronous last resort for interpreter shutdown: SIGKILL the process group."""
        if self.process is not None:
            self.process.kill_now()

    async def _ensure(self) -> tuple[Session, int]:
        session = self._session
        if session is not None and self._healthy(session):
            return session, self._generation
        if self._closed:
            raise TransportError(f"MCP server {self.name!r} is shut down", retryable=False)
        self._check_circuit()
        # One (re)start at a time, in its own task: a caller that times out or is cancelled while
        # waiting must not abort a start that the next caller needs (a slow server would never come up).
        if self._starting is None or self._starting.done():
            self._starting = asyncio.create_task(self._restart(), name=f"mcp-start-{self.name}")
            self._starting.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(self._starting)
        if self._session is None:
            raise TransportError(f"MCP server {self.name!r} is shut down", retryable=False)
        return self._session, self._generation

    async def _restart(self) -> None:
        async with self._lock:
            if self._session is not None and self._healthy(self._session):
                return
            self._check_circuit()
            if self._open is not None:
                await self._teardown()
                self.restarts += 1
            if self._closed:
                return
            try:
                await self._connect()
            except Exception as e:
                if self.process is not None and not isinstance(e, TimeoutError):
                    await self.process.settle()
                detail = self.process.describe_exit() if self.process is not None else ""
                self._record_crash()
                self.kill_now()  # a server that failed to start gets no grace period
                await self._teardown()
                while isinstance(e, BaseExceptionGroup) and e.exceptions:  # anyio task groups wrap the cause
                    e = e.exceptions[0]
                raise TransportError(
                    f"could not start MCP server {self.name!r}: {type(e).__name__}: {e}" + (f" ({detail})" if detail else "")
                ) from e

    def _healthy(self, session: Session) -> bool:
        return not session.closed and (self.process is None or self.process.alive)

    def _check_circuit(self) -> None:
        now = time.monotonic()
        if now < self._open_until:
            raise TransportError(
                f"MCP server {self.name!r} is unavailable: it crashed {len(self._crashes)} times in "
                f"{self.policy.crash_window_s:g}s; calls fail fast for another {self._open_until - now:.1f}s",
                retryable=False,
                status=CIRCUIT_OPEN,
            )

    def _record_crash(self) -> None:
        now = time.monotonic()
        self._crashes.append(now)
        while self._crashes and now - self._crashes[0] > self.policy.crash_window_s:
            self._crashes.popleft()
        if len(self._crashes) >= self.policy.crash_limit:
            self._open_until = now + self.policy.cooldown_s
            log.warning("MCP server %r crashed %d times; circuit open for %.1fs", self.name, len(self._crashes), self.policy.cooldown_s)

    def _mark_dead(self, generation: int) -> None:
        """Note a broken connection once per generation (many in-flight calls see the same crash)."""
        if generation == self._generation and self._session is not None:
            self._session = None
            self._record_crash()

    async def _connect(self) -> None:
        timeout = self.cfg.startup_timeout_s or self.policy.startup_timeout_s
        cfg, policy = self.cfg, self.policy
        try:
            async with asyncio.timeout(timeout):
                if cfg.transport == "stdio":
                    isolate = policy.isolate_pids if cfg.isolate_pids is None else cfg.isolate_pids
                    self.process = await StdioProcess.spawn(self.name, cfg.executable(), cfg.args, cfg.env, cfg.cwd, isolate)
                    session: Session = StdioSession(self.name, self.process, cfg.max_result_bytes or policy.max_result_bytes)
                else:
                    from rlfactory.tools.mcp_remote import RemoteSession  # the SDK and httpx: only when used

                    session = RemoteSession(self.name, cfg, self.policy.stop_grace_s)
                self._open = session
                tools = await session.start()
        except TimeoutError:
            raise TimeoutError(f"no answer within the start-up timeout of {timeout:g}s") from None
        self._generation += 1
        self._session, self.tools = session, tools

    async def _teardown(self) -> None:
        session, process = self._open, self.process
        self._session = self._open = None
        if session is None:
            return
        self._heard = max(self._heard, session.last_heard)
        try:
            await session.aclose()
            if process is not None and process.alive:
                await process.stop(self.policy.stop_grace_s)
        finally:
            if process is not None:
                process.kill_now()  # no-op when it already exited; a must when the stop was cut short

    # ---- calls -----------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], trace: CallTrace | None = None) -> ToolResult:
        """Call `tool`; a connection that breaks is re-established and the call retried once."""
        probe = None
        if trace is not None:
            trace.connection = self
            probe = asyncio.get_running_loop().call_later(trace.timeout_s / 2, self.probe, trace.started)
        try:
            for attempt in (0, 1):
                session, generation = await self._ensure()
                try:
                    result = await session.call_tool(tool, arguments)
                except ServerError as e:
                    return ToolResult.error(f"{self.name}.{tool}: {e.message}", ERROR)
                except (ConnectionLost, OSError) as e:
                    self._mark_dead(generation)
                    if attempt == 0:
                        continue
                    raise await self._crashed(tool) from e
                except InvalidResult as e:
                    return ToolResult.error(f"{self.name}.{tool} returned an invalid result: {e}", ERROR)
                except ResultTooLarge as e:
                    res = ToolResult.error(f"{self.name}.{tool}: {e} (raise `max_result_bytes` for server {self.name!r} to receive it)", ERROR)
                    res.truncated = True
                    return res
                return convert_result(result)
            raise AssertionError("unreachable")
        finally:
            if probe is not None:
                probe.cancel()

    async def _crashed(self, tool: str) -> TransportError:
        if self.process is not None:
            await self.process.settle()
        detail = f" ({self.process.describe_exit()})" if self.process is not None else ""
        return TransportError(
            f"MCP server {self.name!r} crashed while running {tool!r}; it was restarted and the call retried once{detail}",
            retryable=False,
            status=CRASHED,
        )


class ServerPool:
    """`cfg.processes` copies of one stdio server, for CPU-bound stateless tools.

    A single server process runs one call's Python at a time; copies spread that work over cores.
    Each copy is a `ServerConnection` with its own restarts and circuit; a call goes to the copy,
    among those whose circuit is closed, with the fewest calls in flight.
    """

    def __init__(self, name: str, cfg: ServerConfig, policy: SupervisionPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.members = [ServerConnection(name if i == 0 else f"{name}#{i}", cfg, policy) for i in range(cfg.processes)]
        self._in_flight = [0] * len(self.members)
        self.limiter = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None  # for the pool as a whole

    @property
    def tools(self) -> list[mcp_types.Tool]:
        return self.members[0].tools

    @property
    def process(self) -> StdioProcess | None:
        return self.members[0].process

    @property
    def pid(self) -> int | None:
        return self.members[0].pid

    @property
    def restarts(self) -> int:
        return sum(m.restarts for m in self.members)

    def pids(self) -> dict[str, int]:
        return {k: v for m in self.members for k, v in m.pids().items()}

    async def start(self) -> list[mcp_types.Tool]:
        outcomes = await asyncio.gather(*(m.start() for m in self.members), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return self.tools

    async def call(self, tool: str, arguments: dict[str, Any], trace: CallTrace | None = None) -> ToolResult:
        load = self._in_flight
        i = min(range(len(load)), key=lambda k: (not self.members[k].available, load[k]))
        load[i] += 1
        try:
            return await self.members[i].call(tool, arguments, trace)
        finally:
            load[i] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(m.aclose() for m in self.members), return_exceptions=True)

    def kill_now(self) -> None:
        for m in self.members:
            m.kill_now()


def connect(name: str, cfg: ServerConfig, policy: SupervisionPolicy | None = None) -> ServerConnection | ServerPool:
    """The supervised connection for one config entry: a pool when it asks for several processes."""
    return ServerPool(name, cfg, policy) if cfg.processes > 1 else ServerConnection(name, cfg, policy)


def convert_result(result: Any) -> ToolResult:
    """An MCP `CallToolResult` as a `ToolResult`: text blocks joined, every image kept in order (an
    image that cannot be read becomes a line saying why), structure kept."""
    if not isinstance(result, mcp_types.CallToolResult):
        return ToolResult.error(f"unexpected result type {type(result).__name__}", ERROR)
    parts: list[str] = []
    images: list[Image] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            try:
                images.append(image_from_base64(block.data, block.mime_type))
                parts.append(images[-1].note())
            except ImageError as e:
                parts.append(f"[image {block.mime_type} not shown: {e}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            parts.append(res.text if isinstance(res, mcp_types.TextResourceContents) else f"[binary resource {res.uri}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    text = "\n".join(parts)
    is_error = bool(result.is_error)
    return ToolResult(text=text, is_error=is_error, status=ERROR if is_error else "ok", data=result.structured_content,
                      images=images)


@dataclass
class MCPTool:
    """One tool of an MCP server, behind the `Tool` protocol."""

    name: str
    description: str
    parameters: dict[str, Any]
    server: str
    remote_name: str
    connection: ServerConnection | ServerPool
    timeout_s: float | None = None
    cache: bool | None = None
    max_concurrency: int | None = None

    @property
    def cache_id(self) -> str:
        """Stable across runs and renames: the on-disk cache keys on it."""
        return f"{self.server}.{self.remote_name}"

    @property
    def limiter(self) -> asyncio.Semaphore | None:
        """Shared by all tools of the server (the server's `max_concurrency`)."""
        return self.connection.limiter

    async def call(self, arguments: dict[str, Any], trace: CallTrace | None = None) -> ToolResult:
        return await self.connection.call(self.remote_name, arguments, trace)


def include_problem(conn: ServerConnection | ServerPool) -> str | None:
    """For a started server whose config's `include` names tools it does not have: one line naming
    them (with the closest name) and what the server offers; else None."""
    from rlfactory.config import did_you_mean

    offered = [t.name for t in conn.tools]
    missing = [n for n in conn.cfg.include or () if n not in offered]
    if not missing:
        return None
    also = f" (nor {', '.join(map(repr, missing[1:]))})" if missing[1:] else ""
    return (f"mcpServers.{conn.name}.include: the server has no tool {missing[0]!r}{also}"
            f"{did_you_mean(missing[0], offered)} (it offers: {', '.join(offered) or 'no tools'})")


def tools_of(conn: ServerConnection | ServerPool) -> list[MCPTool]:
    """The exposed tools of a started server (its config's include/exclude applied), remote names."""
    out = []
    for t in conn.tools:
        if not conn.cfg.exposes(t.name):
            continue
        schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"}
        out.append(
            MCPTool(
                name=t.name,
                description=t.description or "",
                parameters=schema,
                server=conn.name,
                remote_name=t.name,
                connection=conn,
                timeout_s=conn.cfg.timeout_s,
                cache=conn.cfg.cache,
            )
        )
    return out
