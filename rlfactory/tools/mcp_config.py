"""MCP config files: the standard `{"mcpServers": {...}}` JSON/YAML and RL-Factory's `.pydata`.

A server is either a subprocess (`command`, `args`, `env`, `cwd`; stdio transport) or a URL
(`url`, `transport`: `streamable-http` (default) or `sse`). Per-server options of rlfactory:
`include` / `exclude` (tool names to select / hide), `timeout_s`, `max_concurrency`, `cache`,
`startup_timeout_s`, `processes`, `max_result_bytes`, `isolate_pids`. Every error names the file
and the key.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlfactory.config import ConfigError

# Keys other MCP clients write into their configs; accepted and ignored.
_FOREIGN_KEYS = ("autoApprove", "alwaysAllow", "description", "disabledTools")


class ServerConfig(BaseModel):
    """One MCP server of a config."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    command: str | None = None
    """Executable of a stdio server (`python`/`python3` mean this interpreter)."""
    args: list[str] = []
    env: dict[str, str] = {}
    """Extra environment variables, over the runner's own environment."""
    cwd: str | None = None
    """Working folder of a stdio server; relative paths (here, in `command` and in `args`) are taken
    from the MCP config file's folder, which is also the default `cwd`."""
    url: str | None = None
    """Endpoint of a remote server (streamable HTTP or SSE)."""
    transport: Literal["stdio", "streamable-http", "sse"] | None = Field(None, alias="type")
    headers: dict[str, str] = {}
    include: list[str] | None = None
    """Only these tools of the server are exposed."""
    exclude: list[str] = []
    """These tools of the server are hidden."""
    timeout_s: float | None = None
    """Per-call timeout for this server's tools (default: `tools.timeout_s`)."""
    max_concurrency: int | None = Field(None, ge=1)
    """At most this many calls to this server at once."""
    cache: bool | None = None
    """Cache this server's results (default: `tools.cache`); false for non-deterministic tools."""
    startup_timeout_s: float | None = None
    max_result_bytes: int | None = Field(None, ge=1)
    """Stdio: the longest answer taken from this server, in bytes (default: `tools.max_result_bytes`)."""
    isolate_pids: bool | None = None
    """Stdio: run this server in its own PID namespace (default: `tools.isolate_server_pids`)."""
    processes: int = Field(1, ge=1)
    """Stdio: run this many copies of the server, each call going to the least busy one. For
    CPU-bound, stateless tools; every copy is supervised (restarted, circuit) on its own."""
    disabled: bool = False

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k not in _FOREIGN_KEYS}
        t = data.get("type", data.get("transport"))
        if t in ("http", "streamableHttp", "streamable_http"):
            data.pop("transport", None)
            data["type"] = "streamable-http"
        if "transport" in data and "type" not in data:
            data["type"] = data.pop("transport")
        if isinstance(data.get("args"), (str, int, float)):
            data["args"] = [data["args"]]
        if isinstance(data.get("args"), list):
            data["args"] = [str(a) for a in data["args"]]
        if isinstance(data.get("env"), dict):
            data["env"] = {str(k): str(v) for k, v in data["env"].items()}
        return data

    @model_validator(mode="after")
    def _check(self) -> "ServerConfig":
        if (self.command is None) == (self.url is None):
            raise ValueError("a server needs exactly one of `command` (stdio) or `url` (HTTP/SSE)")
        if self.transport is None:
            self.transport = "stdio" if self.command else "streamable-http"
        if self.command and self.transport != "stdio":
            raise ValueError(f"transport {self.transport!r} needs a `url`, not a `command`")
        if self.url and self.transport == "stdio":
            raise ValueError("transport 'stdio' needs a `command`, not a `url`")
        if self.url and self.processes > 1:
            raise ValueError("`processes` starts copies of a stdio server; a `url` server runs elsewhere")
        return self

    def executable(self) -> str:
        """The command to spawn; a bare `python` runs under this interpreter, so its packages are there."""
        assert self.command is not None
        return sys.executable if self.command in ("python", "python3") else self.command

    def exposes(self, tool_name: str) -> bool:
        if self.include is not None and tool_name not in self.include:
            return False
        return tool_name not in self.exclude


def _read(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"MCP config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            return yaml.safe_load(text)
        if suffix in (".pydata", ".py", ".txt"):
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, yaml.YAMLError) as e:
        kind = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}.get(suffix, "a Python literal")
        raise ConfigError(f"{path}: cannot parse as {kind}: {e}") from None
    for parse in (json.loads, yaml.safe_load, ast.literal_eval):  # unknown suffix: try each form
        try:
            return parse(text)
        except Exception:
            continue
    raise ConfigError(f"{path}: not JSON, YAML or a Python literal")


def _servers_of(data: Any, source: str) -> dict[str, Any]:
    """Merge the `mcpServers` maps of a config (a dict, or RL-Factory's list of dicts)."""
    blocks = data if isinstance(data, list) else [data]
    merged: dict[str, Any] = {}
    for i, block in enumerate(blocks):
        where = f"[{i}]." if isinstance(data, list) else ""
        if not isinstance(block, dict):
            raise ConfigError(f"{source}: {where or 'top level'} must be a mapping with `mcpServers`")
        unknown = [k for k in block if k != "mcpServers"]
        if unknown:
            raise ConfigError(f"{source}: {where}{unknown[0]}: unknown key (expected `mcpServers`)")
        servers = block.get("mcpServers")
        if not isinstance(servers, dict):
            raise ConfigError(f"{source}: {where}mcpServers: must be a mapping of server name to server")
        for name, spec in servers.items():
            if name in merged:
                raise ConfigError(f"{source}: {where}mcpServers.{name}: server defined twice")
            merged[str(name)] = spec
    return merged


def load_mcp_config(src: str | os.PathLike | Mapping[str, Any] | list | None) -> dict[str, "ServerConfig"]:
    """Read an MCP config (path to JSON/YAML/.pydata, or the parsed dict/list) into server configs.

    Disabled servers are left out. Raises `ConfigError` naming the file and the key.
    """
    if src is None:
        return {}
    if isinstance(src, Mapping) and src and all(isinstance(v, ServerConfig) for v in src.values()):
        return dict(src)  # already loaded
    base: Path | None = None
    if isinstance(src, (str, os.PathLike)):
        path = Path(os.path.expanduser(str(src)))
        data, source, base = _read(path), str(path), path.resolve().parent
    else:
        data, source = src, "<inline MCP config>"
    if isinstance(data, dict) and "mcpServers" not in data and "mcp_servers" in data:
        data = {"mcpServers": data["mcp_servers"]}
    out: dict[str, ServerConfig] = {}
    for name, spec in _servers_of(data, source).items():
        try:
            cfg = ServerConfig.model_validate(spec)
        except ValidationError as e:
            first = e.errors()[0]
            key = ".".join(str(p) for p in first["loc"])
            msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
            raise ConfigError(f"{source}: mcpServers.{name}{'.' + key if key else ''}: {msg}") from None
        if "." in name:
            raise ConfigError(f"{source}: mcpServers.{name}: a server name cannot contain '.'")
        if base is not None and cfg.command is not None:
            # A stdio server runs in its config file's folder (or in `cwd`, taken from there), so
            # relative paths in `command` and `args` are relative to the config file.
            cfg.cwd = str(base / cfg.cwd) if cfg.cwd else str(base)
        if not cfg.disabled:
            out[name] = cfg
    return out


def _source(src: Any) -> str:
    return str(src) if isinstance(src, (str, os.PathLike)) else "<inline MCP config>"


def check_commands(src: Any) -> None:
    """Raise a ConfigError (one line, naming the file and `mcpServers.NAME.command`, with the closest
    executable on PATH) for every stdio server whose command cannot be found, before any starts."""
    for name, cfg in load_mcp_config(src).items():
        if cfg.command is None:
            continue
        exe = cfg.executable()
        search_path = cfg.env.get("PATH", os.environ.get("PATH", ""))
        if os.sep in exe:
            target = Path(cfg.cwd or os.getcwd(), exe)
            found = target.is_file() and os.access(target, os.X_OK)
        else:
            found = shutil.which(exe, path=search_path) is not None
        if found:
            continue
        from rlfactory.config import closest, did_you_mean

        key = f"{_source(src)}: mcpServers.{name}.command: {cfg.command!r}"
        if os.path.isabs(exe):  # no search: the file itself is missing (or cannot run)
            target = Path(exe)
            if target.is_file():
                raise ConfigError(f"{key} is not executable")
            siblings = [f.name for f in target.parent.iterdir()] if target.parent.is_dir() else []
            close = closest(target.name, siblings)
            hint = f"; did you mean {str(target.parent / close)!r}?" if close else ""
            raise ConfigError(f"{key} does not exist{hint}")
        on_path = [f for d in search_path.split(os.pathsep) if os.path.isdir(d) for f in os.listdir(d)]
        hint = did_you_mean(cfg.command, on_path) if os.sep not in exe else ""
        where = f"{cfg.cwd} (the server's cwd)" if os.sep in exe else "PATH"
        raise ConfigError(f"{key} not found in {where}{hint}")


def merge_mcp_configs(*sources: Any) -> dict[str, ServerConfig]:
    """Servers of several configs together; the same name twice must be the same server."""
    merged: dict[str, ServerConfig] = {}
    for src in sources:
        for name, cfg in load_mcp_config(src).items():
            if name in merged and merged[name] != cfg:
                raise ConfigError(f"MCP server {name!r} is defined twice with different settings")
            merged[name] = cfg
    return merged
