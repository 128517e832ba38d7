"""ToolRunner: every tool call of every trajectory, concurrently, on one asyncio loop.

A call goes: resolve the name -> cache lookup -> validate the arguments against the schema ->
wait for a slot (global limit, per-tool limit, per-server limit) -> run under the per-call
timeout, retrying transport failures with backoff -> cut long output -> cache -> metrics.
Whatever goes wrong becomes a `ToolResult` with `is_error=True` and a message the model can read;
only the caller's own cancellation propagates.

MCP servers start each on its own (`startup.py`): `start()` waits for all of them and names those
that failed; a runner used without `start()` starts them on the first call, and a call waits only
until the server of its tool is up, within its own timeout. A server that failed to start costs
only the calls that might be its own (unknown names), and is tried again after the cool-down.

A timed-out call to an MCP server is `unresponsive` when the server sent no message at all from
the start of the call to its timeout (no answer to any request, no notification, no answer to the
ping sent to a silent server halfway through the timeout, or no end of its start-up handshake);
it is `timeout` when the server did answer something meanwhile: alive, but this call was slow.
Other tools that time out are `timeout`.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from rlfactory.imports import import_ref
from rlfactory.text import valid_text
from rlfactory.tools.base import (
    CRASHED,
    ERROR,
    INVALID_ARGUMENTS,
    TIMEOUT,
    UNKNOWN_TOOL,
    UNRESPONSIVE,
    CallOptions,
    ClosesAsync,
    Tool,
    ToolCall,
    ToolResult,
    ToolSpec,
    TransportError,
    UsesRunner,
)
from rlfactory.tools.cache import ResultCache, canonical_arguments
from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools.function import function_tool, result_from_value
from rlfactory.tools.mcp_client import (
    CallTrace,
    MCPTool,
    ServerConnection,
    ServerPool,
    SupervisionPolicy,
    connect,
    include_problem,
    tools_of,
)
from rlfactory.tools.mcp_config import ServerConfig, merge_mcp_configs
from rlfactory.tools.metrics import MetricsRecorder, ToolMetrics
from rlfactory.tools.startup import ServerStarts
from rlfactory.tools.validation import ArgumentValidator, arguments_problem

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
        self._local = [_as_tool(t) for t in tools]
        names = [t.name for t in self._local]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two tools share the name(s) {dupes}")
        c = self.config
        policy = SupervisionPolicy(
            c.startup_timeout_s, c.crash_limit, c.crash_window_s, c.circuit_cooldown_s,
            max_result_bytes=c.max_result_bytes, isolate_pids=c.isolate_server_pids,
        )
        self._servers = ServerStarts(merge_mcp_configs(c.mcp, mcp), policy, c.circuit_cooldown_s, self._reindex,
                                     connect_server or connect)
        self.connections: dict[str, ServerConnection | ServerPool] = self._servers.connections
        self._entries: dict[str, _Entry] = {}  # exposed names and `server.tool` aliases
        self._visible: list[_Entry] = []
        self._made: dict[tuple[str, str | None, str], _Entry] = {}  # entries by (name, server, remote name)
        self._metrics: dict[str, MetricsRecorder] = {}
        self._cache = ResultCache(c.cache_size, c.cache_path, c.cache_ttl_s)
        self._global = asyncio.Semaphore(c.max_concurrency)
        self._unknown_calls = 0
        self._closed = False
        for t in self._local:
            if isinstance(t, UsesRunner):
                t.bind_runner(self)
        self._reindex()

    @classmethod
    def from_config(cls, cfg: ToolsConfig, python_tools: Iterable[Any] = (), mcp: Any = None,
                    connect_server: Callable[[str, ServerConfig, SupervisionPolicy], Any] | None = None) -> "ToolRunner":
        """A runner with the config's tools (`tools.python`, `tools.mcp`) plus an env's own tools."""
        tools = [function_tool(import_ref(ref, f"tools.python[{i}]", "function")) for i, ref in enumerate(cfg.python)]
        tools += [_as_tool(t) for t in python_tools]
        return cls(tools, cfg, mcp, connect_server)

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> "ToolRunner":
        try:
            await self.start()
        except BaseException:
            await asyncio.shield(self.aclose())  # `async with` will not call __aexit__
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start (or connect to) every MCP server and list its tools, all at once, each within its
        start-up timeout. Raises `ToolStartError` naming each server that failed and why, after
        stopping the servers that did start (calls made anyway start them again, one attempt each,
        and try a failed server again only after `tools.circuit_cooldown_s`)."""
        if self._closed:
            raise ToolStartError("the runner is closed")
        attempts = self._servers.start_missing(respect_cooldown=False)
        try:
            if attempts:
                await asyncio.wait(attempts)
        except BaseException:  # cancelled (Ctrl-C) mid-start
            await asyncio.shield(self._servers.aclose())
            raise
        if self._servers.all_up:
            wrong = [p for c in self.connections.values() if (p := include_problem(c))]
            if wrong:  # a misspelt `include` would otherwise leave the model without the tool, silently
                await self._servers.reset()
                self._made = {key: e for key, e in self._made.items() if e.server is None}
                self._reindex()
                raise ToolStartError("; ".join(wrong))
        else:
            error = ToolStartError(f"MCP server(s) failed to start: {self._servers.down(retry_note=False)}")
            await self._servers.reset()
            self._made = {key: e for key, e in self._made.items() if e.server is None}
            self._reindex()
            raise error

    async def aclose(self) -> None:
        """Stop every server; no subprocess outlives this (a SIGKILL backs up the polite shutdown)."""
        self._closed = True
        try:
            await self._servers.aclose()
        finally:
            self._cache.close()
            for t in self._local:
                if isinstance(t, ClosesAsync):
                    try:
                        await t.aclose()
                    except Exception as e:
                        log.warning("closing tool %r failed: %r", t.name, e)

    def server_pids(self) -> dict[str, int]:
        """PIDs of the stdio servers' current processes (copies of a pool as `name#1`, `name#2`, ...)."""
        return {k: v for c in self.connections.values() for k, v in c.pids().items()}

    # ---- the tool table --------------------------------------------------------------------
    def _reindex(self) -> None:
        """Rebuild the tool table from the local tools and the servers that are up (config order)."""
        pairs: list[tuple[Tool, str | None]] = [(t, None) for t in self._local]
        for name, conn in self.connections.items():
            if name in self._servers.up:
                pairs += [(t, conn.name) for t in tools_of(conn)]
        self._index(pairs)
        if self._servers.all_up:
            self._warn_unknown_options()

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
            key = (name, server, tool.remote_name if isinstance(tool, MCPTool) else tool.name)
            entry = self._made.get(key)
            if entry is None:  # a server that comes up later keeps the entries (and slots) of the others
                if isinstance(tool, MCPTool) and name != tool.name:
                    tool.name = name
                entry = self._made[key] = self._entry(name, tool, server)
            visible.append(entry)
            entries[name] = entry
            entries.setdefault(qualified, entry)
        self._entries, self._visible = entries, visible

    def _warn_unknown_options(self) -> None:
        from rlfactory.config import did_you_mean

        unknown = sorted(set(self.config.per_tool) - set(self._entries))
        for name in unknown:
            log.warning("tools.per_tool.%s: no tool is called %r%s (tools: %s)", name, name,
                        did_you_mean(name, self._entries), ", ".join(e.name for e in self._visible) or "none")

    def _entry(self, name: str, tool: Tool, server: str | None) -> _Entry:
        mcp = tool if isinstance(tool, MCPTool) else None
        remote = mcp.remote_name if mcp else tool.name
        opts = self.config.per_tool.get(name) or self.config.per_tool.get(f"{server}.{remote}") or ToolOptions()
        own = tool if isinstance(tool, CallOptions) else ToolOptions()  # the tool's own defaults, if it has any
        cache_on = opts.cache if opts.cache is not None else own.cache
        if cache_on is None:
            cache_on = self.config.cache
        limit = opts.max_concurrency or own.max_concurrency
        limits = tuple(s for s in (asyncio.Semaphore(limit) if limit else None, mcp.limiter if mcp else None) if s)
        metrics = self._metrics.setdefault(name, MetricsRecorder())
        return _Entry(
            name=name,
            tool=tool,
            spec=ToolSpec(name, tool.description or "", tool.parameters),
            server=server,
            validator=ArgumentValidator.for_schema(name, tool.parameters),
            timeout_s=opts.timeout_s or own.timeout_s or self.config.timeout_s,
            cache_id=(mcp.cache_id if mcp else name) if cache_on else None,
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
        t0, started = time.perf_counter(), time.monotonic()
        entry, waited_from = self._entries.get(call.name), None
        if entry is None and not self._servers.all_up:
            missing = await self._await_servers(call.name, t0, started)
            if missing is not None:
                return missing
            entry, waited_from = self._entries.get(call.name), started
        if entry is None:
            return self._unknown(call.name, t0)
        args = call.arguments
        if not isinstance(args, dict):
            args, problem = _coerce_arguments(args)
            if problem:
                return self._finish(entry, ToolResult.error(f"invalid arguments for {entry.name!r}: {problem}", INVALID_ARGUMENTS), t0)
        problem = arguments_problem(args)  # before the cache key and the schema: both walk them
        if problem is not None:
            return self._finish(entry, ToolResult.error(f"invalid arguments for {entry.name!r}: {problem}", INVALID_ARGUMENTS), t0)
        key = None
        if entry.cache_id is not None:
            key = canonical_arguments(args)
            hit = self._cache.get(entry.cache_id, key)
            if hit is not None:
                res = replace(hit, cached=True, latency_s=time.perf_counter() - t0)
                entry.metrics.record(res)
                return res
        if entry.validator is not None:
            problem = entry.validator.error(args)
            if problem is not None:
                msg = f"invalid arguments for {entry.name!r}: {problem}"
                return self._finish(entry, ToolResult.error(msg, INVALID_ARGUMENTS), t0)
        result = _valid(await self._limited(entry, args, nested, waited_from))
        if len(result.text) > entry.max_chars:
            result = _truncate(result, entry.max_chars)
        if key is not None and not result.is_error:
            self._cache.put(entry.cache_id, key, result)  # type: ignore[arg-type]
        return self._finish(entry, result, t0)

    def _finish(self, entry: _Entry, result: ToolResult, t0: float) -> ToolResult:
        result = _valid(result)  # error texts quote what tools and servers said
        result.latency_s = time.perf_counter() - t0
        entry.metrics.record(result)
        return result

    async def _await_servers(self, name: str, t0: float, started: float) -> ToolResult | None:
        """Start the servers that are not up (each on its own, those cooling down after a failed
        start excepted) and wait, within the call's timeout, until one of them serves `name` or
        none is starting any more. An error result when `name` may belong to a server that is
        down; None when the call can go on (or is for an unknown name)."""
        if self._closed:
            return self._not_served(name, "the runner is closed", CRASHED, t0)
        opts = self.config.per_tool.get(name)
        timeout = (opts.timeout_s if opts else None) or self.config.timeout_s
        self._servers.start_missing(respect_cooldown=True)
        while name not in self._entries and (attempts := self._servers.attempts()):
            remaining = started + timeout - time.monotonic()
            if remaining <= 0:
                waiting = ", ".join(self._servers.starting())
                why = f"MCP server(s) {waiting} did not finish starting within the call's timeout of {timeout:g}s"
                return self._not_served(name, why, UNRESPONSIVE, t0)
            await asyncio.wait(attempts, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        down = self._servers.down()
        if name in self._entries or not down:
            return None
        return self._not_served(name, f"MCP server(s) failed to start: {down}", CRASHED, t0)

    def _not_served(self, name: str, why: str, status: str, t0: float) -> ToolResult:
        self._unknown_calls += 1
        res = _valid(ToolResult.error(f"tool {name!r} is unavailable: {why}", status))
        res.latency_s = time.perf_counter() - t0
        return res

    def _unknown(self, name: str, t0: float) -> ToolResult:
        self._unknown_calls += 1
        names = [e.name for e in self._visible]
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        listing = ", ".join(names[:30]) + (", ..." if len(names) > 30 else "")
        res = _valid(ToolResult.error(f"unknown tool {name!r}.{hint} Available tools: {listing or '(none)'}", UNKNOWN_TOOL))
        res.latency_s = time.perf_counter() - t0
        return res

    async def _limited(self, entry: _Entry, args: dict[str, Any], nested: bool, started: float | None) -> ToolResult:
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
            return await self._attempts(entry, args, started)
        finally:
            for s in reversed(held):
                s.release()

    async def _attempts(self, entry: _Entry, args: dict[str, Any], started: float | None) -> ToolResult:
        """The call under its timeout, which runs from `started` when the call waited for its server
        to start (the wait counts), else from now."""
        now = time.monotonic()
        started = now if started is None else started
        trace = CallTrace(started, entry.timeout_s) if isinstance(entry.tool, MCPTool) else None
        cm = asyncio.timeout(max(entry.timeout_s - (now - started), 0.0))
        try:
            async with cm:
                attempt = 0
                while True:
                    try:
                        out = await (entry.tool.call(args) if trace is None else entry.tool.call(args, trace))  # type: ignore[call-arg]
                        return out if isinstance(out, ToolResult) else result_from_value(out)
                    except TransportError as e:
                        if not e.retryable or attempt >= self.config.retries:
                            return ToolResult(text=str(e), is_error=True, status=e.status)
                        await asyncio.sleep(self.config.retry_backoff_s * (2**attempt))
                        attempt += 1
        except TimeoutError as e:
            if cm.expired():
                if trace is not None and trace.server_silent():
                    server = trace.connection.name if trace.connection is not None else entry.server
                    msg = f"tool {entry.name!r} timed out after {entry.timeout_s:g}s; MCP server {server!r} sent nothing at all meanwhile (not even an answer to a ping)"
                    return ToolResult.error(msg, UNRESPONSIVE)
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


def _valid(result: ToolResult) -> ToolResult:
    """`result` with its text made valid Unicode (rlfactory/text.py), the replacements counted:
    what a tool returns is encoded by tokenizers and log writers, which refuse lone surrogates."""
    text, replaced = valid_text(result.text)
    result.text = text
    result.replaced_chars += replaced
    return result


def _truncate(result: ToolResult, max_chars: int) -> ToolResult:
    n = len(result.text)
    marker = f"\n...[truncated: showing {max_chars} of {n} characters]"
    result.text = result.text[:max_chars] + marker
    result.truncated = True
    return result
