"""The tool layer: the `Tool` protocol, Python-function tools, MCP servers from config, model and
agent tools, and `ToolRunner`, which runs every call asynchronously with timeouts, retries,
limits, a cache and supervision. Imports nothing of rlfactory but `rlfactory.config`.

Names are imported lazily, so `import rlfactory.tools.base` stays cheap (no mcp, no httpx).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AgentTool": "agent_tool",
    "ToolHandle": "agent_tool",
    "ResultCache": "cache",
    "FunctionTool": "function",
    "function_tool": "function",
    "MCPTool": "mcp_client",
    "ServerConnection": "mcp_client",
    "ServerPool": "mcp_client",
    "ServerConfig": "mcp_config",
    "load_mcp_config": "mcp_config",
    "ToolMetrics": "metrics",
    "ModelTool": "model_tool",
    "ToolRunner": "runner",
    "ToolStartError": "runner",
}
_BASE = [
    "CIRCUIT_OPEN",
    "CRASHED",
    "ERROR",
    "INVALID_ARGUMENTS",
    "MALFORMED",
    "OK",
    "TIMEOUT",
    "UNKNOWN_TOOL",
    "UNRESPONSIVE",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "TransportError",
    "spec_of",
]
for _name in _BASE:
    _WHERE[_name] = "base"

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rlfactory.tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlfactory.tools.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
