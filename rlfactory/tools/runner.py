"""ToolRunner: every tool call of every trajectory, concurrently, on one asyncio loop.

A call goes: resolve the name -> cache lookup -> validate the arguments against the schema ->
wait for a slot (global limit, per-tool limit, per-server limit) -> run under the per-call
timeout, retrying transport failures with backoff -> cut long output -> cache -> metrics.
Whatever goes wrong becomes a `ToolResult` with `is_error=True` and a message the model can read;
only the caller's own cancellation propagates.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from rlfactory.tools.base import (
    CRASHED,
    ERROR,
    INVALID_ARGUMENTS,
    TIMEOUT,
    UNKNOWN_TOOL,
    Tool,
    ToolCall,
    ToolResult,
    ToolSpec,
    TransportError,
)
from rlfactory.tools.cache import ResultCache, canonical_arguments
from rlfactory.tools.config import ToolOptions, ToolsConfig
from rlfactory.tools.function import function_tool, result_from_value
from rlfactory.tools.mcp_client import MCPTool, ServerConnection, ServerPool, SupervisionPolicy, connect, tools_of
from rlfactory.tools.mcp_config import ServerConfig, merge_mcp_configs
from rlfactory.tools.metrics import MetricsRecorder, ToolMetrics
from rlfactory.tools.validation import ArgumentValidator

log = logging.getLogger("rlfactory.tools")


class ToolStartError(RuntimeError):
    """An MCP server of the config could not be started; the message names it and says why."""


@dataclass(eq=False)
class _Entry:
    """A tool as the runner runs it: resolved options, compiled validator, counters."""

    name: str
    tool: Tool
    spec: ToolSpec
    server: str | None
    validator: ArgumentValidator | None
    timeout_s: float
    cache_id: str | None  # None: not cached
    max_chars: int
    limits: tuple[asyncio.Semaphore, ...]
    metrics: MetricsRecorder


def _as_tool(obj: Any) -> Tool:
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return function_tool(obj)
    raise TypeError(f"not a tool or a function: {obj!r}")


def import_function(ref: str) -> Callable[..., Any]:
    """`package.module:function` -> the function (for `tools.python` entries)."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"python tool {ref!r}: expected `module:function`")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class ToolRunner:
    """Runs tool calls: Python tools, MCP servers from config, model and agent tools.

    Use as `async with ToolRunner(tools, config) as runner:` or `await runner.start()` /
    `await runner.aclose()`. A runner lives on the loop that started it.
    `connect_server(name, server_config, policy)` makes the connection to each MCP server
    (default None: `mcp_client.connect`, start or reach the server from this process); another can
    reach servers that run elsewhere (rlfactory.distributed: a Ray tool-pool actor) and must
    answer like a `ServerConnection` (`start`, `call`, `tools`, `cfg`, `limiter`, `aclose`, ...).
    """

    def __init__(self, tools: Sequence[Any] = (), config: ToolsConfig | None = None, mcp: Any = None,
                 connect_server: Callable[[str, ServerConfig, SupervisionPolicy], Any] | None = None) -> None:
        self.config = config if config is not None else ToolsConfig()
        self._connect_server = connect_server or connect
        self._local = [_as_tool(t) for t in tools]
        names = [t.name for t in self._local]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two tools share the name(s) {dupes}")
        self._server_cfgs: dict[str, ServerConfig] = merge_mcp_configs(self.config.mcp, mcp)
        c = self.config
        self._policy = SupervisionPolicy(c.startup_timeout_s, c.crash_limit, c.crash_window_s, c.circuit_cooldown_s)
        self.connections: dict[str, ServerConnection | ServerPool] = {}
        self._entries: dict[str, _Entry] = {}  # exposed names and `server.tool` aliases
        self._visible: list[_Entry] = []
        self._metrics: dict[str, MetricsRecorder] = {}
        self._cache = ResultCache(c.cache_size, c.cache_path, c.cache_ttl_s)
        self._global = asyncio.Semaphore(c.max_concurrency)
        self._started = not self._server_cfgs
        self._start_lock = asyncio.Lock()
        self._start_error: str | None = None
        self._start_failed_at = -float("inf")
        self._unknown_calls = 0
        self._closed = False
        for t in self._local:
            bind = getattr(t, "bind_runner", None)
            if callable(bind):
                bind(self)
        self._index([(t, None) for t in self._local])
        if self._started:
            self._warn_unknown_options()

    @classmethod
    def from_config(cls, cfg: ToolsConfig, python_tools: Iterable[Any] = (), mcp: Any = None,
                    connect_server: Callable[[str, ServerConfig, SupervisionPolicy], Any] | None = None) -> "ToolRunner":
        """A runner with the config's tools (`tools.python`, `tools.mcp`) plus an env's own tools."""
        tools = [function_tool(import_function(ref)) for ref in cfg.python]
        tools += [_as_tool(t) for t in python_tools]
        return cls(tools, cfg, mcp, connect_server)

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> "ToolRunner":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start (or connect to) every MCP server and list its tools. Raises `ToolStartError`."""
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise ToolStartError("the runner is closed")
            conns = {n: self._connect_server(n, cfg, self._policy) for n, cfg in self._server_cfgs.items()}
            self.connections = conns
            try:
                outcomes = await asyncio.gather(*(c.start() for c in conns.values()), return_exceptions=True)
            except BaseException:  # cancelled (Ctrl-C) mid-start: `async with` will not call aclose
                await asyncio.shield(self._close_connections())
                raise
            failed = [(n, o) for n, o in zip(conns, outcomes) if isinstance(o, BaseException)]
            if failed:
                await self._close_connections()
                self._start_error = "; ".join(f"{n}: {o}" for n, o in failed)
                self._start_failed_at = time.monotonic()
                raise ToolStartError(f"MCP server(s) failed to start: {self._start_error}")
            pairs: list[tuple[Tool, str | None]] = [(t, None) for t in self._local]
            for conn in conns.values():
                pairs += [(t, conn.name) for t in tools_of(conn)]
            self._index(pairs)
            self._started = True
            self._warn_unknown_options()

    async def aclose(self) -> None:
        """Stop every server; no subprocess outlives this (a SIGKILL backs up the polite shutdown)."""
        self._closed = True
        try:
            await self._close_connections()
        finally:
            self._cache.close()
            for t in self._local:
                close = getattr(t, "aclose", None)
                if callable(close):
                    try:
                        await close()
                    except Exception as e:
                        log.warning("closing tool %r failed: %r", t.name, e)

    async def _close_connections(self) -> None:
        conns = list(self.connections.values())
        try:
            await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)
        finally:
            for c in conns:
                c.kill_now()

    def server_pids(self) -> dict[str, int]:
        """PIDs of the stdio servers' current processes (copies of a pool as `name#1`, `name#2`, ...)."""
        return {k: v for c in self.connections.values() for k, v in c.pids().items()}

    # ---- the tool table --------------------------------------------------------------------
    def _index(self, pairs: list[tuple[Tool, str | None]]) -> None:
        counts: dict[str, int] = {}
        for tool, _ in pairs:
            counts[tool.name] = counts.get(tool.name, 0) + 1
        entries: dict[str, _Entry] = {}
        visible: list[_Entry] = []
        for tool, server in pairs:
            qualified = f"{server}.{tool.name}" if server else tool.name
            clash = counts[tool.name] > 1 or self.config.qualify_names
            name = qualified if server and clash else tool.name
            if isinstance(tool, MCPTool) and name != tool.name:
                tool.name = name
            entry = self._entry(name, tool, server)
            visible.append(entry)
            entries[name] = entry
            entries.setdefault(qualified, entry)
        self._entries, self._visible = entries, visible

    def _warn_unknown_options(self) -> None:
        unknown = sorted(set(self.config.per_tool) - set(self._entries))
        if unknown:
            log.warning("tools.per_tool names tools that do not exist: %s", ", ".join(unknown))

    def _entry(self, name: str, tool: Tool, server: str | None) -> _Entry:
        remote = getattr(tool, "remote_name", tool.name)
        opts = self.config.per_tool.get(name) or self.config.per_tool.get(f"{server}.{remote}") or ToolOptions()
        cache_on = opts.cache if opts.cache is not None else getattr(tool, "cache", None)
        if cache_on is None:
            cache_on = self.config.cache
        limit = opts.max_concurrency or getattr(tool, "max_concurrency", None)
        limits = tuple(s for s in (asyncio.Semaphore(limit) if limit else None, getattr(tool, "limiter", None)) if s)
        metrics = self._metrics.setdefault(name, MetricsRecorder())
        return _Entry(
            name=name,
            tool=tool,
            spec=ToolSpec(name, tool.description or "", tool.parameters),
            server=server,
            validator=ArgumentValidator.for_schema(name, tool.parameters),
            timeout_s=opts.timeout_s or getattr(tool, "timeout_s", None) or self.config.timeout_s,
            cache_id=str(getattr(tool, "cache_id", name)) if cache_on else None,
            max_chars=opts.max_output_chars or self.config.max_output_chars,
            limits=limits,
            metrics=metrics,
        )

    def specs(self) -> list[ToolSpec]:
        """What the model is told about each tool (after `start()` for MCP tools)."""
        return [e.spec for e in self._visible]

    def tools(self) -> dict[str, Tool]:
        """The tools by the name the model calls them (after `start()` for MCP tools)."""
        return {e.name: e.tool for e in self._visible}

    def server_of(self, name: str) -> str | None:
        """The MCP server that serves tool `name` (None for Python and other local tools)."""
        e = self._entries.get(name)
        return e.server if e else None

    def metrics(self) -> dict[str, ToolMetrics]:
        out = {name: m.snapshot() for name, m in self._metrics.items()}
        if self._unknown_calls:
            out["<unknown>"] = ToolMetrics(calls=self._unknown_calls, errors=self._unknown_calls)
        return out

    def clear_cache(self) -> None:
        self._cache.clear()

    # ---- calls -----------------------------------------------------------------------------
    async def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run `calls` concurrently; results in the same order. Never raises for a tool's sake."""
        return list(await asyncio.gather(*(self.call(c) for c in calls)))

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call. Never raises for a tool's sake; errors are results with `is_error=True`."""
        return await self._call(call, nested=False)

    async def _call(self, call: ToolCall, nested: bool) -> ToolResult:
        t0 = time.perf_counter()
        if not self._started:
            # Lazy start; after a failed start, calls fail fast for a cool-down instead of respawning.
            if time.monotonic() - self._start_failed_at < self.config.circuit_cooldown_s:
                return ToolResult(text=f"tools are unavailable: {self._start_error}", is_error=True, status=CRASHED)
            try:
                await self.start()
            except Exception as e:
                return ToolResult(text=f"tools are unavailable: {e}", is_error=True, status=CRASHED)
        entry = self._entries.get(call.name)
        if entry is None:
            return self._unknown(call.name, t0)
        args = call.arguments
        if not isinstance(args, dict):
            args, problem = _coerce_arguments(args)
            if problem:
                return self._finish(entry, ToolResult.error(f"invalid arguments for {entry.name!r}: {problem}", INVALID_ARGUMENTS), t0)
        key = None
        if entry.cache_id is not None:
            key = canonical_arguments(args)
            hit = self._cache.get(entry.cache_id, key)
            if hit is not None:
                res = ToolResult(hit.text, hit.is_error, hit.status, hit.data, hit.image, True, time.perf_counter() - t0, hit.truncated)
                entry.metrics.record(res)
                return res
        if entry.validator is not None:
            problem = entry.validator.error(args)
            if problem is not None:
                msg = f"invalid arguments for {entry.name!r}: {problem}"
                return self._finish(entry, ToolResult.error(msg, INVALID_ARGUMENTS), t0)
        result = await self._limited(entry, args, nested)
        if len(result.text) > entry.max_chars:
            result = _truncate(result, entry.max_chars)
        if key is not None and not result.is_error:
            self._cache.put(entry.cache_id, key, result)  # type: ignore[arg-type]
        return self._finish(entry, result, t0)

    def _finish(self, entry: _Entry, result: ToolResult, t0: float) -> ToolResult:
        result.latency_s = time.perf_counter() - t0
        entry.metrics.record(result)
        return result

    def _unknown(self, name: str, t0: float) -> ToolResult:
        self._unknown_calls += 1
        names = [e.name for e in self._visible]
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        listing = ", ".join(names[:30]) + (", ..." if len(names) > 30 else "")
        res = ToolResult.error(f"unknown tool {name!r}.{hint} Available tools: {listing or '(none)'}", UNKNOWN_TOOL)
        res.latency_s = time.perf_counter() - t0
        return res

    async def _limited(self, entry: _Entry, args: dict[str, Any], nested: bool) -> ToolResult:
        # Per-tool and per-server slots first, the global slot last: a call queued behind its own
        # tool's limit must not sit on a global slot that other tools could use. Nested calls (an
        # agent tool calling other tools) skip the global slot their parent holds, or a full
        # runner of agents would wait on itself.
        sems = entry.limits if nested else (*entry.limits, self._global)
        held: list[asyncio.Semaphore] = []
        try:
            for s in sems:
                await s.acquire()
                held.append(s)
            return await self._attempts(entry, args)
        finally:
            for s in reversed(held):
                s.release()

    async def _attempts(self, entry: _Entry, args: dict[str, Any]) -> ToolResult:
        cm = asyncio.timeout(entry.timeout_s)
        try:
            async with cm:
                attempt = 0
                while True:
                    try:
                        out = await entry.tool.call(args)
                        return out if isinstance(out, ToolResult) else result_from_value(out)
                    except TransportError as e:
                        if not e.retryable or attempt >= self.config.retries:
                            return ToolResult(text=str(e), is_error=True, status=e.status)
                        await asyncio.sleep(self.config.retry_backoff_s * (2**attempt))
                        attempt += 1
        except TimeoutError as e:
            if cm.expired():
                return ToolResult.error(f"tool {entry.name!r} timed out after {entry.timeout_s:g}s", TIMEOUT)
            return ToolResult.error(f"tool {entry.name!r} failed: TimeoutError: {e}", ERROR)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller is cancelling us: that is theirs to see
            return ToolResult.error(f"tool {entry.name!r} was cancelled from inside", ERROR)
        except Exception as e:
            return ToolResult.error(f"tool {entry.name!r} failed: {type(e).__name__}: {e}", ERROR)


def _coerce_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Arguments given as a JSON string (as some models emit them) or None."""
    import json

    if raw is None:
        return {}, None
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError as e:
            return {}, f"not valid JSON: {e}"
        if isinstance(value, dict):
            return value, None
    return {}, f"expected a JSON object, got {type(raw).__name__}"


def _truncate(result: ToolResult, max_chars: int) -> ToolResult:
    n = len(result.text)
    marker = f"\n...[truncated: showing {max_chars} of {n} characters]"
    result.text = result.text[:max_chars] + marker
    result.truncated = True
    return result
