"""The stdio transport: an MCP server as a subprocess we own.

Unlike `mcp.client.stdio`, this keeps the process handle, so the supervisor knows the PID, sees the
process die, keeps the tail of its stderr for error messages, and kills its whole process group
on shutdown. `StdioSession` (mcp_session.py) speaks MCP over its pipes; lines on stdout that are
not JSON-RPC are skipped and counted in `garbage_lines`. A last-resort `atexit` hook kills any
group still alive when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import logging
import os
import signal

log = logging.getLogger("rlfactory.tools.stdio")

_LINE_LIMIT = 1 << 30  # the largest single message we accept (1 GiB): huge outputs are cut later
_LIVE_GROUPS: set[int] = set()


def _kill_leftovers() -> None:
    for pgid in list(_LIVE_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _LIVE_GROUPS.clear()


atexit.register(_kill_leftovers)


class StdioProcess:
    """One server subprocess in its own process group; its stdin/stdout are the MCP wire."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.pid = process.pid
        self.garbage_lines = 0
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_task = asyncio.create_task(self._pump_stderr())
        _LIVE_GROUPS.add(self.pid)

    @classmethod
    async def spawn(
        cls, name: str, command: str, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> "StdioProcess":
        full_env = {**os.environ, **(env or {})}
        process = await asyncio.create_subprocess_exec(
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            start_new_session=True,  # its own process group: killpg reaches its children too
            limit=_LINE_LIMIT,
        )
        return cls(name, process)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def describe_exit(self) -> str:
        rc = self.process.returncode
        parts = [f"pid {self.pid}"]
        if rc is not None:
            parts.append(f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}")
        tail = "\n".join(list(self.stderr_tail)[-5:]).strip()
        if tail:
            parts.append(f"last stderr lines:\n{tail}")
        return "; ".join(parts)

    async def settle(self, timeout: float = 0.5) -> None:
        """Give a dying process a moment to be reaped and flush stderr, so `describe_exit` is complete."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wait_exit(timeout)
                await asyncio.shield(self._stderr_task)

    async def _pump_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        try:
            while line := await stderr.readline():
                text = line.decode(errors="replace").rstrip()
                self.stderr_tail.append(text)
                log.debug("[%s] %s", self.name, text)
        except (asyncio.CancelledError, ConnectionError, OSError, ValueError):
            pass

    async def _wait_exit(self, timeout: float) -> bool:
        # Poll returncode: Process.wait() also waits for pipe EOF, which a grandchild can hold open.
        deadline = asyncio.get_running_loop().time() + timeout
        while self.process.returncode is None:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def stop(self, grace_s: float = 2.0) -> None:
        """Close stdin, give the server `grace_s` to exit, then SIGTERM / SIGKILL its whole group."""
        try:
            if self.process.stdin is not None and not self.process.stdin.is_closing():
                self.process.stdin.close()
            if not await self._wait_exit(grace_s):
                self._signal_group(signal.SIGTERM)
                if not await self._wait_exit(1.0):
                    self._signal_group(signal.SIGKILL)
                    await self._wait_exit(2.0)
        finally:
            self._signal_group(signal.SIGKILL)  # descendants left in the group, if any
            _LIVE_GROUPS.discard(self.pid)
            self._stderr_task.cancel()
            transport = getattr(self.process, "_transport", None)
            if transport is not None:
                transport.close()

    def kill_now(self) -> None:
        """Synchronous last resort (no event loop needed)."""
        self._signal_group(signal.SIGKILL)
        _LIVE_GROUPS.discard(self.pid)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
