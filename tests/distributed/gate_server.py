"""MCP stdio server for the distributed tests: `wait(key)` answers once the file named by
$GATE_FILE exists, so a test decides exactly when the tool calls in flight return."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

from rlfactory.tools.servers._serve import serve

server = MCPServer("gate", log_level="WARNING")


@server.tool()
async def wait(key: str) -> str:
    """Wait until the gate opens, then answer with the key.

    Args:
        key: Any text.
    """
    gate = Path(os.environ["GATE_FILE"])
    while not gate.exists():
        await asyncio.sleep(0.01)
    return f"opened {key}"


if __name__ == "__main__":
    serve(server)
