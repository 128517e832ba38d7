"""The MCP servers of a runner and how they come up: each on its own.

Every server of the config gets one supervised connection (`ServerConnection` or `ServerPool`).
A server starts in a task of its own, one attempt at a time however many callers ask for it, so
that a caller that stops waiting (its call timed out) never aborts an attempt the next caller
needs. A server that fails to start is remembered with its reason, and is not tried again before
its cool-down has passed; the others are untouched by it: their tools are listed and served as
soon as they are up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from rlfactory.tools.mcp_client import ServerConnection, ServerPool, SupervisionPolicy, connect
from rlfactory.tools.mcp_config import ServerConfig


class ServerStarts:
    """Starts the servers of a config, each independently; `on_up()` runs when one comes up.
    `connect_server(name, config, policy)` makes each server's connection (see ToolRunner)."""

    def __init__(
        self, cfgs: dict[str, ServerConfig], policy: SupervisionPolicy, cooldown_s: float, on_up: Callable[[], None],
        connect_server: Callable[[str, ServerConfig, SupervisionPolicy], Any] = connect,
    ) -> None:
        self._cfgs, self._policy, self._connect = cfgs, policy, connect_server
        self.connections: dict[str, ServerConnection | ServerPool] = {n: connect_server(n, c, policy) for n, c in cfgs.items()}
        self.up: set[str] = set()
        self.errors: dict[str, str] = {}  # server -> why its last start failed
        self._failed_at: dict[str, float] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cooldown_s = cooldown_s
        self._on_up = on_up
        self._closed = False

    @property
    def all_up(self) -> bool:
        return len(self.up) == len(self.connections)

    def cooling(self, name: str) -> float:
        """Seconds before server `name` may be tried again after a failed start (0: now)."""
        since = time.monotonic() - self._failed_at.get(name, -float("inf"))
        return max(0.0, self._cooldown_s - since)

    def start(self, name: str) -> asyncio.Task[None]:
        """The attempt to start server `name`: the one under way, or a new one."""
        task = self._tasks.get(name)
        if task is None or task.done():
            task = asyncio.create_task(self._bring_up(name), name=f"mcp-up-{name}")
            self._tasks[name] = task
        return task

    def start_missing(self, respect_cooldown: bool) -> list[asyncio.Task[None]]:
        """Attempts for every server not up (skipping those cooling down, if asked)."""
        if self._closed:
            return []
        names = [n for n in self.connections if n not in self.up and not (respect_cooldown and self.cooling(n) > 0)]
        return [self.start(n) for n in names]

    def starting(self) -> list[str]:
        """Servers whose start attempt is under way."""
        return [n for n, t in self._tasks.items() if not t.done()]

    def attempts(self) -> list[asyncio.Task[None]]:
        return [t for t in self._tasks.values() if not t.done()]

    def down(self, retry_note: bool = True) -> str:
        """The servers that are not up, each with why and (`retry_note`) when it is tried again
        ('' when none). A command that stops on the failure has no next attempt to announce."""
        parts = []
        for name in self.connections:
            if name in self.up or name not in self.errors:
                continue
            wait = self.cooling(name) if retry_note else 0.0
            again = f" (next attempt in {wait:.1f}s)" if wait > 0 else ""
            parts.append(f"{name}: {self.errors[name]}{again}")
        return "; ".join(parts)

    async def _bring_up(self, name: str) -> None:
        conn = self.connections[name]
        try:
            await conn.start()
        except Exception as e:
            self.errors[name] = str(e)
            self._failed_at[name] = time.monotonic()
            return
        if self._closed:
            return
        self.errors.pop(name, None)
        self._failed_at.pop(name, None)
        self.up.add(name)
        self._on_up()

    async def reset(self) -> None:
        """Stop every server and start over with fresh connections, none up; the failures and
        their cool-downs are kept (a later call starts the servers again, one attempt each)."""
        await self._stop_all()
        self.up.clear()
        self._tasks.clear()
        self.connections.clear()  # the same dict: the runner shows it as `connections`
        self.connections.update({n: self._connect(n, c, self._policy) for n, c in self._cfgs.items()})

    async def aclose(self) -> None:
        """Stop every attempt and every server, for good."""
        self._closed = True
        await self._stop_all()

    async def _stop_all(self) -> None:
        """Cancel the attempts and stop every server; SIGKILL backs up the polite stop."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
        conns = list(self.connections.values())
        try:
            await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)
        finally:
            for c in conns:
                c.kill_now()
