"""The tool layer: the `Tool` protocol, Python-function tools, MCP servers from config, model and
agent tools, and `ToolRunner`, which runs every call asynchronously with timeouts, retries,
limits, a cache and supervision. Imports nothing of rlfactory but `rlfactory.config`.

Names are imported lazily, so `import rlfactory.tools.base` stays cheap (no mcp, no httpx).
"""

from __future__ import annotations

from rlfactory.lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _WHERE, globals())
