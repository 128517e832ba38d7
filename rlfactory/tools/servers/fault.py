"""Fault MCP server: every way a tool server can misbehave, for supervision tests.

`hang` never returns, `freeze` blocks the whole server (it answers nothing, not even a ping),
`crash` kills the process mid-call, `garbage` writes non-JSON-RPC bytes onto the protocol stream,
`huge` returns a very large text, `wait` answers after a delay. Environment: `FAULT_STARTUP_DELAY_S`
delays start; `FAULT_GRANDCHILD=TOKEN` first starts a grandchild that calls setsid() (so it leaves
the server's process group), keeps the server's stdout open, and has TOKEN on its command line.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

from mcp.server.mcpserver import MCPServer

from rlfactory.tools.servers._serve import serve

server = MCPServer("fault", log_level="WARNING")

# The SDK moves fd 1 aside while serving stdio (so stray prints cannot corrupt the stream); keep our
# own handle on the real protocol pipe so `garbage` can corrupt it on purpose.
_WIRE = os.dup(1)
_INSTANCE = uuid.uuid4().hex


@server.tool()
async def ok(text: str = "fine") -> str:
    """A well-behaved tool: returns `text` unchanged."""
    return text


@server.tool()
async def hang() -> str:
    """Never returns."""
    await asyncio.sleep(3600)
    return "unreachable"


@server.tool()
async def wait(seconds: float, text: str = "waited") -> str:
    """Return `text` after `seconds` (the server keeps answering other calls meanwhile)."""
    await asyncio.sleep(seconds)
    return text


@server.tool()
async def freeze(seconds: float = 3600.0) -> str:
    """Block the whole server for `seconds`: no answer to anything (pings included) meanwhile."""
    time.sleep(seconds)
    return "thawed"


@server.tool()
async def crash(code: int = 3) -> str:
    """Kill the server process (exit status `code`) in the middle of the call."""
    sys.stderr.write("fault server: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(code)


@server.tool()
async def garbage() -> str:
    """Write junk (not JSON-RPC, invalid UTF-8) onto stdout, then answer normally."""
    os.write(_WIRE, b"this is not json\n{\"half\": \n\xff\xfe\x00 binary junk\n")
    return "after garbage"


@server.tool()
async def huge(chars: int = 2_000_000) -> str:
    """Return a text of `chars` characters."""
    return "x" * chars


@server.tool()
async def pid() -> int:
    """The server's process id (as the server sees it: in a PID namespace of its own, a small one)."""
    return os.getpid()


@server.tool()
async def instance() -> str:
    """A token that names this server process (distinct for every copy and every restart)."""
    return _INSTANCE


def _start_grandchild(token: str) -> None:
    code = "import os, sys, time; os.setsid(); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", code, token], stdin=subprocess.DEVNULL)  # inherits stdout


if __name__ == "__main__":
    if os.environ.get("FAULT_GRANDCHILD"):
        _start_grandchild(os.environ["FAULT_GRANDCHILD"])
    delay = float(os.environ.get("FAULT_STARTUP_DELAY_S", "0"))
    if delay > 0:
        time.sleep(delay)
    serve(server)
