"""An MCP session with a remote server (streamable HTTP or SSE), on the mcp SDK's `ClientSession`.

The SDK's transports and session are anyio context managers that must be entered and left in one
task, so one owner task holds them for the session's life. Errors come out as the types of
`mcp_session` (`ServerError`, `ConnectionLost`, `InvalidResult`), like a stdio session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import anyio
import mcp_types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from rlfactory.tools.mcp_config import ServerConfig
from rlfactory.tools.mcp_session import ConnectionLost, InvalidResult, ServerError

log = logging.getLogger("rlfactory.tools.mcp")

# Errors that mean "the channel broke", not "the tool failed".
_CHANNEL_ERRORS: tuple[type[BaseException], ...] = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    ConnectionError,
    OSError,
)
try:  # the mcp HTTP transports run on httpx2
    import httpx2

    _CHANNEL_ERRORS += (httpx2.TransportError,)
except ImportError:  # pragma: no cover
    pass


class RemoteSession:
    """One `ClientSession` on a streamable-HTTP or SSE endpoint, held by an owner task."""

    def __init__(self, name: str, cfg: ServerConfig, stop_grace_s: float = 2.0) -> None:
        self.name = name
        self.cfg = cfg
        self._stop_grace_s = stop_grace_s
        self._session: ClientSession | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.last_heard = 0.0
        self._ping: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # After a start-up timeout nobody awaits `ready` any more: mark its outcome as seen.
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    @property
    def closed(self) -> bool:
        return self._owner is not None and self._owner.done()

    async def start(self) -> list[mcp_types.Tool]:
        """Connect, handshake and list every tool."""
        self._owner = asyncio.create_task(self._own(), name=f"mcp-server-{self.name}")
        session, tools = await asyncio.shield(self._ready)
        self._session = session
        self.last_heard = time.monotonic()
        return tools

    def ping(self) -> None:
        """Send a `ping` unless one is on its way already; an answer sets `last_heard`."""
        if self._session is None or self.closed or (self._ping is not None and not self._ping.done()):
            return
        self._ping = asyncio.create_task(self._send_ping(self._session))

    async def _send_ping(self, session: ClientSession) -> None:
        with contextlib.suppress(Exception):
            await session.send_ping()
            self.last_heard = time.monotonic()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        session = self._session
        if session is None or self.closed:
            raise ConnectionLost(f"the session with MCP server {self.name!r} is closed")
        try:
            result = await session.call_tool(name, arguments)
        except MCPError as e:
            if e.code == mcp_types.CONNECTION_CLOSED:
                raise ConnectionLost(e.message) from e
            self.last_heard = time.monotonic()
            raise ServerError(e.code, e.message, e.data) from e
        except _CHANNEL_ERRORS as e:
            raise ConnectionLost(f"{type(e).__name__}: {e}") from e
        except RuntimeError as e:  # e.g. structured content that violates the tool's output schema
            raise InvalidResult(str(e)) from e
        self.last_heard = time.monotonic()
        if not isinstance(result, mcp_types.CallToolResult):
            raise InvalidResult(f"unexpected result type {type(result).__name__}")
        return result

    async def _own(self) -> None:
        """Holds the transport and session contexts; they are entered and left in this one task."""
        ready = self._ready
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open_transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                while True:
                    params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                if not ready.done():
                    ready.set_result((session, tools))
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported through `ready`, never raised
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(f"cancelled: {e!r}"))
            elif not isinstance(e, asyncio.CancelledError):
                log.debug("MCP server %r connection ended: %r", self.name, e)

    async def _open_transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        cfg = self.cfg
        if cfg.transport == "sse":
            from mcp.client.sse import sse_client

            return await stack.enter_async_context(sse_client(cfg.url, headers=cfg.headers or None))
        from mcp.client.streamable_http import streamable_http_client

        client = None
        if cfg.headers:
            import httpx2

            client = await stack.enter_async_context(httpx2.AsyncClient(headers=cfg.headers, timeout=30.0))
        return await stack.enter_async_context(streamable_http_client(cfg.url, http_client=client))

    async def aclose(self) -> None:
        owner = self._owner
        self._session = None
        if self._ping is not None:
            self._ping.cancel()
        if owner is None:
            return
        self._stop.set()
        if not self._ready.done():
            owner.cancel()  # never came up: nothing to shut down politely
        try:
            async with asyncio.timeout(self._stop_grace_s + 5.0):
                await asyncio.shield(owner)
        except (TimeoutError, Exception):
            owner.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(owner, 3.0)
