"""Command line shared by the example servers: pick a transport, then run.

Over stdio pipes the servers skip the SDK's lowlevel server: its dispatcher, anyio memory streams,
per-request middleware and thread hand-offs cost about 0.4 ms of CPU per call, and a burst of
concurrent calls queues on that. `_PipeServer` answers what a tools-only `MCPServer` needs
(`initialize`, `ping`, the `*/list` methods, `tools/call`, `notifications/cancelled`) with the
server's own `call_tool` and `list_*` and the SDK's per-version result shaping, so the wire is
the same as `server.run("stdio")`. HTTP and SSE, and stdio that is not a pipe, use the SDK.
Stray reads and prints are diverted off the wire as the SDK does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import stat
from typing import Any

import mcp_types
from mcp.shared.exceptions import MCPError
from mcp_types import methods as wire
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

log = logging.getLogger("rlfactory.tools.servers")

_LISTS = {  # method -> (MCPServer method, result key)
    "tools/list": ("list_tools", "tools"),
    "prompts/list": ("list_prompts", "prompts"),
    "resources/list": ("list_resources", "resources"),
    "resources/templates/list": ("list_resource_templates", "resourceTemplates"),
}


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


class _PipeServer:
    """One client on stdin/stdout: each request runs in its own task, answered when it is done."""

    def __init__(self, server: Any, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.writer = writer
        self.version = LATEST_HANDSHAKE_VERSION
        self.running: dict[Any, asyncio.Task[None]] = {}

    async def run(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    self._send_error(mcp_types.PARSE_ERROR, "Parse error")
                    continue
                if isinstance(msg, dict):
                    self._receive(msg)
                elif line.strip():
                    self._send_error(mcp_types.INVALID_REQUEST, "Invalid request")
        finally:  # stdin closed: the client is gone
            for task in list(self.running.values()):
                task.cancel()
            await asyncio.gather(*self.running.values(), return_exceptions=True)

    def _receive(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        if not isinstance(method, str):
            return  # a response: this server sends no requests
        if "id" not in msg:  # a notification
            params = msg.get("params")
            if method == "notifications/cancelled" and isinstance(params, dict):
                task = self.running.get(params.get("requestId"))
                if task is not None:
                    task.cancel()  # a cancelled request gets no answer
            return
        rid = msg["id"]
        task = asyncio.create_task(self._answer(rid, method, msg.get("params")))
        if isinstance(rid, (int, str)):
            self.running[rid] = task
            task.add_done_callback(lambda _: self.running.pop(rid, None))

    async def _answer(self, rid: Any, method: str, params: Any) -> None:
        try:
            result = await self._handle(method, params if isinstance(params, dict) else {})
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "result": result}
        except MCPError as e:
            reply = {"jsonrpc": "2.0", "id": rid, "error": _dump(e.error)}
        except Exception as e:
            log.exception("request %r failed", method)
            reply = {"jsonrpc": "2.0", "id": rid, "error": {"code": mcp_types.INTERNAL_ERROR, "message": str(e)}}
        try:
            self._send(reply)
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass  # the client is gone; stdin ends next and the server with it

    async def _handle(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        server = self.server
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise MCPError(mcp_types.INVALID_PARAMS, "tools/call needs a `name` and an `arguments` object")
            try:
                result = await server.call_tool(name, arguments)
            except MCPError:
                raise
            except Exception as e:  # the tool's own failure: a result the model reads, as the SDK does
                log.info("tool %r failed: %r", name, str(e))
                result = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=str(e))], is_error=True)
            return wire.serialize_server_result(method, self.version, _dump(result))
        if method == "ping":
            return {}
        if method in _LISTS:
            fn, key = _LISTS[method]
            items = await getattr(server, fn)()
            return wire.serialize_server_result(method, self.version, {key: [_dump(x) for x in items]})
        if method == "initialize":
            requested = params.get("protocolVersion")
            self.version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
            opts = server._lowlevel_server.create_initialization_options()
            result = mcp_types.InitializeResult(
                protocol_version=self.version,
                capabilities=opts.capabilities,
                server_info=mcp_types.Implementation(
                    name=opts.server_name,
                    title=opts.title,
                    description=opts.description,
                    version=opts.server_version,
                    website_url=opts.website_url,
                    icons=opts.icons,
                ),
                instructions=opts.instructions,
            )
            return wire.serialize_server_result(method, self.version, _dump(result))
        raise MCPError(mcp_types.METHOD_NOT_FOUND, "Method not found", method)

    def _send(self, msg: dict[str, Any]) -> None:
        self.writer.write(json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")

    def _send_error(self, code: int, message: str) -> None:
        self._send({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


async def _serve_pipes(server: Any) -> None:
    wire_in, wire_out = os.dup(0), os.dup(1)
    # Like the SDK: while serving, fd 0 reads EOF and fd 1 goes to stderr, so stray I/O misses the wire.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(), os.fdopen(wire_out, "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    await _PipeServer(server, writer).run(reader)


def serve(server: Any, argv: list[str] | None = None) -> None:
    """Run an `MCPServer` on the transport named on the command line."""
    p = argparse.ArgumentParser(description=f"rlfactory example MCP server {server.name!r}")
    p.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    logging.getLogger("mcp").setLevel(logging.WARNING)
    if args.transport != "stdio":
        server.settings.log_level = "WARNING"
        server.run(args.transport, host=args.host, port=args.port)
    elif _is_pipe(0) and _is_pipe(1) and hasattr(server, "_lowlevel_server"):
        asyncio.run(_serve_pipes(server))
    else:
        server.run("stdio")
