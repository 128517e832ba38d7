"""An MCP client session over a stdio server's pipes: JSON-RPC 2.0, one message per line.

The mcp SDK's `ClientSession` passes every message through anyio memory streams, a dispatcher
task and several pydantic round trips; in a burst of concurrent tool calls that client-side work
is what the burst waits on. `StdioSession` does only what a tool-calling client needs: the
`initialize` handshake, `tools/list` (all pages), `tools/call`, answering the server's `ping`.

A request is a future keyed by its id, resolved by one reader task. When the server's output ends
or its process exits, every pending call fails at once with `ConnectionLost`, so the supervisor can
restart the server. A cancelled call (timeout, Ctrl-C) stops waiting at once, and the server is
told with `notifications/cancelled`. Remote servers (streamable HTTP, SSE) keep the SDK's session
(`mcp_remote.py`); both raise the errors defined here.

The reader reads the pipe in chunks and holds at most `max_result_bytes` of one message: the rest
of a longer line is read and dropped as it arrives, and the call it answers (its id is found at
either end of the line) fails with `ResultTooLarge`, so a flood never fills memory, never delays
the other calls' answers by more than reading it, and never holds the event loop to parse it. A
line nested deeper than `MAX_MESSAGE_DEPTH`, or not JSON at all, fails the call whose id it carries
at once (others are counted as garbage), and bytes that are not UTF-8 are read as U+FFFD: the
session reads on either way. A result whose content blocks include a kind this client does not
know keeps the blocks it does know, with a marker in place of each other one. Every message from
the server sets `last_heard`; `ping()` asks a silent server for a sign of life.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import time
from typing import Any, Protocol

import mcp_types
import pydantic
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from rlfactory import __version__
from rlfactory.text import nesting_depth
from rlfactory.tools.stdio import StdioProcess
from rlfactory.tools.validation import ArgumentValidator

log = logging.getLogger("rlfactory.tools.mcp")

METHOD_NOT_FOUND = -32601
CLIENT_INFO = {"name": "rlfactory", "version": __version__}


class ConnectionLost(ConnectionError):
    """The channel to the server broke (its process died, its output ended, the session closed)."""


class ServerError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class InvalidResult(RuntimeError):
    """A tool result that breaks the protocol or the tool's declared output schema."""


class ResultTooLarge(RuntimeError):
    """The server's answer to a call was longer than `max_result_bytes`; it was read and dropped."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the result ({size:,} bytes) is over the limit of max_result_bytes={limit:,} and was dropped")
        self.size, self.limit = size, limit


DEFAULT_MAX_RESULT_BYTES = 4 << 20
MAX_MESSAGE_DEPTH = 100
"""Nested arrays/objects a server's message may have: a deeper answer fails its call at once, and
the session reads on (Python's own JSON decoder gives up near 1,000 levels with a RecursionError)."""
_CHUNK = 1 << 18
_ENDS = 4096  # bytes kept of each end of an oversized line, to find its id
_ID = r'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
_ID_AT_START = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID.encode())
_ID_AT_END = re.compile(_ID.encode() + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')
_BLOCK: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(mcp_types.ContentBlock)


def _max_brackets(text: str) -> int:
    """An upper bound on the nesting depth of `text` (cheap: two C-level counts)."""
    return text.count("[") + text.count("{")


class _Oversized:
    """An over-long line being read: its length, and the two ends where its id can be."""

    def __init__(self, head: bytes) -> None:
        self.head, self.tail, self.size = head[:_ENDS], head[-_ENDS:], len(head)

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = (self.tail + piece[-_ENDS:])[-_ENDS:]

    def request_id(self) -> Any:
        m = _ID_AT_START.match(self.head) or _ID_AT_END.search(self.tail)
        if m is None:
            return None
        try:
            return json.loads(m.group(1))
        except ValueError:
            return None


class Session(Protocol):
    """An MCP session, as `ServerConnection` uses it: `start()` once, then calls until closed."""

    @property
    def closed(self) -> bool: ...

    @property
    def last_heard(self) -> float:
        """`time.monotonic()` when the server last sent a message (0.0: never)."""
        ...

    def ping(self) -> None:
        """Ask the server for a sign of life, without waiting; an answer updates `last_heard`."""
        ...

    async def start(self) -> list[mcp_types.Tool]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult: ...

    async def aclose(self) -> None: ...


class StdioSession:
    """The client side of MCP over a `StdioProcess`'s stdin/stdout."""

    def __init__(self, name: str, process: StdioProcess, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> None:
        self.name = name
        self.process = process
        self.max_result_bytes = max_result_bytes
        self.protocol_version: str | None = None
        self.server_info: dict[str, Any] = {}
        self.last_heard = 0.0
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ping_id: int | None = None  # our unanswered ping, if any
        self._lost: str | None = None  # why the session is unusable, once it is
        self._output_checks: dict[str, ArgumentValidator | None] = {}
        self._reader = asyncio.create_task(self._read_loop(), name=f"mcp-read-{name}")

    @property
    def closed(self) -> bool:
        return self._lost is not None

    @property
    def pending(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    # ---- protocol ----------------------------------------------------------------------------
    async def start(self) -> list[mcp_types.Tool]:
        """Handshake, then list every tool (following `nextCursor`)."""
        params = {"protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        init = await self.request("initialize", params)
        version = init.get("protocolVersion") if isinstance(init, dict) else None
        if version not in HANDSHAKE_PROTOCOL_VERSIONS:
            raise InvalidResult(f"unsupported protocol version from the server: {version!r}")
        self.protocol_version, self.server_info = version, init.get("serverInfo") or {}
        self.notify("notifications/initialized")
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = mcp_types.ListToolsResult.model_validate(
                await self.request("tools/list", {"cursor": cursor} if cursor else None), by_name=False
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        for t in tools:
            self._output_checks[t.name] = ArgumentValidator.for_schema(t.name, t.output_schema) if t.output_schema else None
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """One `tools/call`. Raises `ServerError`, `ConnectionLost` or `InvalidResult`."""
        raw = await self.request("tools/call", {"name": name, "arguments": arguments})
        try:
            result = mcp_types.CallToolResult.model_validate(raw, by_name=False)
        except pydantic.ValidationError:
            result = _known_blocks_only(raw)
        check = self._output_checks.get(name)
        if check is not None and not result.is_error:
            # As the SDK's client does: structured content must match the declared output schema.
            if result.structured_content is None and "structuredContent" not in raw:
                raise InvalidResult(f"tool {name} has an output schema but did not return structured content")
            problem = check.error(result.structured_content) if isinstance(result.structured_content, dict) else None
            if problem is not None:
                raise InvalidResult(f"invalid structured content returned by tool {name}: {problem}")
        return result

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and wait for its result; cancelling the wait cancels it on the server."""
        if self._lost is not None:
            raise ConnectionLost(self._lost)
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            await self._send(msg)
            return await fut
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None and method != "initialize" and self._lost is None:
                with contextlib.suppress(ConnectionLost):
                    self.notify("notifications/cancelled", {"requestId": rid, "reason": "cancelled by the client"})
            if fut.done() and not fut.cancelled():
                fut.exception()  # seen: the caller left before reading it
            raise
        finally:
            self._pending.pop(rid, None)

    def ping(self) -> None:
        """Send a `ping` unless one is unanswered already; its answer, like any message, sets `last_heard`."""
        if self._lost is not None or self._ping_id is not None:
            return
        self._ping_id = next(self._ids)
        try:
            self._write({"jsonrpc": "2.0", "id": self._ping_id, "method": "ping"})
        except ConnectionLost:
            self._ping_id = None

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._write(msg)

    # ---- wire --------------------------------------------------------------------------------
    def _write(self, msg: dict[str, Any]) -> None:
        """Queue a message on stdin without waiting; a write to a dead server is `ConnectionLost`."""
        stdin = self.process.process.stdin
        assert stdin is not None
        try:
            data = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        except UnicodeEncodeError:  # a lone surrogate: ASCII JSON escapes it
            data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        try:
            if stdin.is_closing():
                raise ConnectionLost(f"the stdin of MCP server {self.name!r} is closed")
            stdin.write(data)
        except (OSError, RuntimeError) as e:
            if isinstance(e, ConnectionLost):
                raise
            raise ConnectionLost(f"cannot write to MCP server {self.name!r}: {e}") from e

    async def _send(self, msg: dict[str, Any]) -> None:
        self._write(msg)
        stdin = self.process.process.stdin
        assert stdin is not None
        try:
            await stdin.drain()  # returns at once unless the pipe is full
        except (OSError, RuntimeError) as e:
            raise ConnectionLost(f"cannot write to MCP server {self.name!r}: {e}") from e

    async def _read_loop(self) -> None:
        stdout = self.process.process.stdout
        assert stdout is not None
        why = f"MCP server {self.name!r} closed its output"
        limit = self.max_result_bytes
        buf = bytearray()  # the start of a line not complete yet
        over: _Oversized | None = None  # the line being dropped, when it is too long
        try:
            while chunk := await stdout.read(_CHUNK):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    piece, start = chunk[start:end], end + 1
                    if over is not None:
                        over.add(piece)
                        self._drop(over)
                        over = None
                        continue
                    if buf:
                        buf += piece
                        piece = bytes(buf)
                        buf.clear()
                    if len(piece) > limit:
                        self._drop(_Oversized(piece))
                    else:
                        self._receive(piece)
                rest = chunk[start:]
                if over is not None:
                    over.add(rest)
                    self.last_heard = time.monotonic()  # a long answer on its way is a sign of life
                elif rest:
                    buf += rest
                    if len(buf) > limit:
                        over = _Oversized(bytes(buf))
                        buf.clear()
            if buf.strip() or over is not None:
                self.process.garbage_lines += 1
            if self.process.exit_noticed:
                why = f"MCP server {self.name!r} exited"
        except (ConnectionError, OSError) as e:
            why = f"reading from MCP server {self.name!r} failed: {e}"
        except asyncio.CancelledError:
            why = f"the session with MCP server {self.name!r} was closed"
            raise
        finally:
            self._fail_all(why)

    def _receive(self, line: bytes) -> None:
        # Bytes that are not UTF-8 (inside a result's text, say) become U+FFFD instead of making
        # the whole answer garbage that its call would wait its full timeout for.
        text = line.decode("utf-8", "replace")
        try:
            msg = json.loads(text)
        except RecursionError:  # nested past what Python's stack allows
            return self._refuse(line, f"is nested deeper than {MAX_MESSAGE_DEPTH} levels")
        except ValueError:
            if text.strip():
                self._refuse(line, "is not valid JSON")
            return
        if _max_brackets(text) > MAX_MESSAGE_DEPTH and nesting_depth(msg) > MAX_MESSAGE_DEPTH:
            return self._refuse(line, f"is nested deeper than {MAX_MESSAGE_DEPTH} levels")
        if isinstance(msg, list):  # a JSON-RPC batch (protocol 2025-03-26)
            for m in msg:
                self._dispatch(m, line)
        else:
            self._dispatch(msg, line)

    def _refuse(self, line: bytes, why: str) -> None:
        """A line that cannot be taken: fail the call it answers at once, when its id is at either
        end of the line as JSON-RPC writes it; otherwise it is garbage (a stray print)."""
        rid = _Oversized(line).request_id()
        fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if fut is None:
            self.process.garbage_lines += 1
            log.debug("MCP server %s wrote a line that %s: %.200r", self.name, why, line)
            return
        self.last_heard = time.monotonic()
        if not fut.done():
            fut.set_exception(InvalidResult(f"the server's answer {why}"))

    def _drop(self, over: _Oversized) -> None:
        """An answer too long to take: fail the call it answers (when its id can be found)."""
        self.last_heard = time.monotonic()
        rid = over.request_id()
        fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if fut is None:
            self.process.garbage_lines += 1
            log.warning("MCP server %s sent a %d-byte message over max_result_bytes=%d; dropped", self.name, over.size, self.max_result_bytes)
        elif not fut.done():
            fut.set_exception(ResultTooLarge(over.size, self.max_result_bytes))

    def _dispatch(self, msg: Any, line: bytes) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            self.process.garbage_lines += 1
            log.debug("MCP server %s wrote a non-JSON-RPC line: %.200r", self.name, line)
            return
        self.last_heard = time.monotonic()
        method = msg.get("method")
        if method is None:  # a response
            rid = msg.get("id")
            if rid is not None and rid == self._ping_id:
                self._ping_id = None
                return
            fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if fut is None or fut.done():
                return  # a call that was cancelled or timed out meanwhile
            if "result" in msg:
                fut.set_result(msg["result"])
            else:
                err = msg.get("error")
                if isinstance(err, dict):
                    code = err.get("code") if isinstance(err.get("code"), int) else 0
                    fut.set_exception(ServerError(code, str(err.get("message", "")), err.get("data")))
                else:
                    fut.set_exception(InvalidResult(f"malformed response: {line[:200]!r}"))
        elif "id" in msg:  # a request from the server: we answer ping, and decline the rest
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
            if method == "ping":
                reply["result"] = {}
            else:
                reply["error"] = {"code": METHOD_NOT_FOUND, "message": f"Method not found: {method}"}
            try:
                self._write(reply)
            except ConnectionLost:
                pass
        else:  # a notification (log message, progress, list changed): nothing a tool call waits on
            log.debug("MCP server %s: %s %.300s", self.name, method, msg.get("params"))

    def _fail_all(self, why: str) -> None:
        if self._lost is None:
            self._lost = why
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(why))

    async def aclose(self) -> None:
        """Fail the pending calls and stop reading; the process is the caller's to stop."""
        self._fail_all(f"the session with MCP server {self.name!r} was closed")
        self._reader.cancel()
        await asyncio.wait([self._reader])  # raises only when the caller itself is cancelled


def _known_blocks_only(raw: Any) -> mcp_types.CallToolResult:
    """A result that failed validation: keep the content blocks this client knows, put a marker in
    place of each other one, and validate the rest. Raises `InvalidResult` with a short reason."""
    if isinstance(raw, dict) and isinstance(raw.get("content"), list):
        blocks: list[Any] = []
        for block in raw["content"]:
            try:
                blocks.append(_BLOCK.validate_python(block, by_name=False))
            except pydantic.ValidationError:
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                blocks.append(mcp_types.TextContent(type="text", text=f"[content block of unsupported type {kind!r} left out]"))
        raw = {**raw, "content": []}
    else:
        blocks = []
    try:
        result = mcp_types.CallToolResult.model_validate(raw, by_name=False)
    except pydantic.ValidationError as e:
        raise InvalidResult(f"not a tool result: {_brief(e)}") from None
    result.content = blocks
    return result


def _brief(e: pydantic.ValidationError) -> str:
    """The first few problems of a validation error, one line each, not pydantic's full dump."""
    problems = [f"{'.'.join(str(p) for p in err['loc']) or 'result'}: {err['msg']}" for err in e.errors()[:3]]
    more = e.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
