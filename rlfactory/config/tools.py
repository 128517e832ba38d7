"""Config section `tools:` (read by the tool layer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from rlfactory.config.base import ConfigPath, Section


class ToolOptions(Section):
    """Per-tool overrides (keys of `tools.per_tool` are exposed tool names)."""

    timeout_s: float | None = Field(None, gt=0)
    max_concurrency: int | None = Field(None, ge=1)
    cache: bool | None = None
    """False for a non-deterministic tool; true to cache it even when `tools.cache` is off."""
    max_output_chars: int | None = Field(None, ge=1)


class ToolsConfig(Section):
    """How tools are found and run."""

    mcp: Any = None
    """An MCP config: a path (JSON, YAML or RL-Factory `.pydata`; relative to the config file) or an
    inline `{mcpServers: ...}`. A stdio server runs in the folder of the file that defines it
    (unless its `cwd` says otherwise), so relative paths in its `args` are taken from there."""
    python: list[str] = []
    """Python-function tools as `module:function` (sync or async, typed)."""
    timeout_s: float = Field(30.0, gt=0)
    """Default per-call timeout in seconds (retries included). A call to an MCP server that runs
    out of it is `unresponsive` when the server sent no message at all since the call started (not
    even an answer to the ping sent halfway), otherwise `timeout`."""
    max_concurrency: int = Field(512, ge=1)
    """Calls running at once over all tools and trajectories."""
    retries: int = Field(2, ge=0)
    """Retries of a call whose transport failed (never of a tool's own error)."""
    retry_backoff_s: float = Field(0.05, ge=0)
    """First retry delay; doubles on each retry."""
    max_output_chars: int = Field(8000, ge=1)
    """Longer tool outputs are cut to this many characters, with a visible marker."""
    max_result_bytes: int = Field(4 << 20, ge=1)
    """The longest answer (one JSON-RPC message, in bytes) taken from a stdio MCP server; a longer
    one is read and dropped as it arrives, and its call gets an error result marked `truncated`
    (per server: `max_result_bytes` in the MCP config). Parsing an answer holds the event loop
    about 4 ms per MB, so this also bounds how long one answer can hold it."""
    isolate_server_pids: bool = True
    """Run each stdio MCP server in a PID namespace of its own (`unshare`, where the kernel lets
    this user), so that stopping it kills every process it started, setsid() daemons too; where
    that is refused, or when false, its process group, descendants and pipe holders are killed."""
    cache: bool = False
    """Cache results of deterministic tools (per tool/server `cache:` overrides this)."""
    cache_size: int = Field(4096, ge=1)
    """Results kept in memory (LRU)."""
    cache_path: ConfigPath | None = None
    """A sqlite file that keeps cached results across runs (none: memory only)."""
    cache_ttl_s: float | None = Field(None, gt=0)
    """Cached results older than this are ignored (none: no expiry)."""
    qualify_names: bool = False
    """Always name MCP tools `server.tool` (otherwise only when two servers share a name)."""
    startup_timeout_s: float = Field(30.0, gt=0)
    """Time an MCP server has to start and list its tools."""
    crash_limit: int = Field(3, ge=1)
    """Crashes of a server within `crash_window_s` that open its circuit."""
    crash_window_s: float = Field(60.0, gt=0)
    circuit_cooldown_s: float = Field(30.0, ge=0)
    """While a circuit is open, calls to that server fail fast; a server that failed to start is
    not tried again before this has passed (the other servers serve as usual meanwhile)."""
    per_tool: dict[str, ToolOptions] = {}
    """Overrides by tool name, e.g. `{search: {timeout_s: 60, cache: false}}`."""

    @field_validator("mcp")
    @classmethod
    def _mcp_source(cls, value: Any, info: ValidationInfo) -> Any:
        base = (info.context or {}).get("base_dir")
        if isinstance(value, dict) and base is not None and isinstance(value.get("mcpServers"), dict):
            return {**value, "mcpServers": {n: _in_folder(spec, base) for n, spec in value["mcpServers"].items()}}
        if value is None or isinstance(value, (dict, list)):
            return value
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"expected a path or an inline {{mcpServers: ...}} mapping, got {type(value).__name__}")
        p = Path(os.path.expanduser(str(value)))
        if not p.is_absolute() and base is not None and ((Path(base) / p).exists() or not p.exists()):
            p = Path(base) / p
        if not p.is_file():
            raise ValueError(f"MCP config file not found: {value} (looked for {p})")
        return str(p)


def _in_folder(spec: Any, base: str) -> Any:
    """An inline stdio server runs in the run config's folder, as one from an MCP config file does."""
    if not isinstance(spec, dict) or "command" not in spec:
        return spec
    cwd = spec.get("cwd")
    return {**spec, "cwd": str(Path(base) / cwd) if cwd else base}
