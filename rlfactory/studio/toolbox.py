"""The Tools page: load a tool config, list its tools, call one, as `rlfactory tools` does.

A config is an MCP config (JSON, YAML with `mcpServers`, RL-Factory `.pydata`), a run config
(its `tools:` section), or a list of Python `module:function` names. Loading starts a ToolRunner
(MCP servers in subprocesses) that stays up for calls until it is replaced, closed, or the studio
stops.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict

from rlfactory.config import ConfigError, ToolsConfig, read_yaml, validate

if TYPE_CHECKING:
    from rlfactory.tools.runner import ToolRunner


class _ToolsView(BaseModel):
    """A run config seen by the Tools page: only `tools:` is read (and validated)."""

    model_config = ConfigDict(extra="ignore")
    tools: ToolsConfig = ToolsConfig()


def tools_config(path: Path | None, python: list[str], timeout_s: float | None = None) -> ToolsConfig:
    """The ToolsConfig for a config file and/or Python function names (ConfigError if invalid)."""
    data: dict[str, Any] = {"tools": {}}
    base_dir = None
    if path is not None:
        base_dir = str(path.parent)
        bare = path.suffix.lower() in (".json", ".pydata", ".py", ".txt")
        if not bare:
            raw = read_yaml(path)
            bare = "mcpServers" in raw
            if not bare:
                data = raw
        if bare:
            data = {"tools": {"mcp": str(path)}}
    tools = data.setdefault("tools", {}) or {}
    data["tools"] = tools
    if python:
        tools["python"] = [*tools.get("python", []), *python]
    if timeout_s:
        tools["timeout_s"] = timeout_s
    return validate(_ToolsView, data, str(path or "<python tools>"), base_dir).tools


@dataclass
class ToolSession:
    """One open ToolRunner of the studio's toolbox, by its id."""

    id: str
    source: str
    """Where its tools came from, as the page shows it."""
    runner: ToolRunner
    started: float

    def listing(self) -> list[dict[str, Any]]:
        return [{"name": s.name, "server": self.runner.server_of(s.name), "description": s.description,
                 "parameters": s.parameters} for s in self.runner.specs()]


class ToolSessions:
    """Open ToolRunners by session id (a few at most: the oldest is closed past `limit`)."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self.sessions: dict[str, ToolSession] = {}

    async def open(self, cfg: ToolsConfig, source: str, import_from: list[Path] | None = None) -> ToolSession:
        """Start the tools of `cfg`; `module:function` names import from the folders `import_from`
        (first first: a config's own folder, then the work folder)."""
        import sys

        from rlfactory.tools.runner import ToolRunner

        for folder in reversed(import_from or []):
            if str(folder) in sys.path:
                sys.path.remove(str(folder))
            sys.path.insert(0, str(folder))
        runner = ToolRunner.from_config(cfg)
        await runner.start()
        session = ToolSession(uuid.uuid4().hex[:12], source, runner, time.time())
        self.sessions[session.id] = session
        while len(self.sessions) > self.limit:
            await self.close(next(iter(self.sessions)))
        return session

    def get(self, sid: str) -> ToolSession:
        s = self.sessions.get(sid)
        if s is None:
            raise KeyError(f"no open tool session {sid!r} (it was closed; load the config again)")
        return s

    async def call(self, sid: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from rlfactory.tools.base import ToolCall

        s = self.get(sid)
        t0 = time.perf_counter()
        r = await s.runner.call(ToolCall(name, arguments))
        return {"name": name, "status": r.status, "is_error": r.is_error, "text": r.text, "data": _jsonable(r.data),
                "cached": r.cached, "truncated": r.truncated, "latency_s": r.latency_s,
                "wall_s": time.perf_counter() - t0, "has_image": bool(r.images)}

    async def close(self, sid: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is not None:
            await s.runner.aclose()

    async def close_all(self) -> None:
        await asyncio.gather(*(self.close(sid) for sid in list(self.sessions)), return_exceptions=True)


def _jsonable(x: Any) -> Any:
    try:
        import json

        json.dumps(x)
        return x
    except (TypeError, ValueError):
        return repr(x)


def python_names(text: str) -> list[str]:
    """`module:function` names from a text box (one per line or comma-separated)."""
    names = [n.strip() for n in text.replace(",", "\n").splitlines() if n.strip()]
    bad = [n for n in names if ":" not in n]
    if bad:
        raise ConfigError(f"tools.python: {bad[0]!r} is not module:function")
    return names


def parse_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        value = yaml.safe_load(raw) if raw.strip() else {}
        if isinstance(value, dict):
            return value
    raise ConfigError("arguments must be a JSON object")
