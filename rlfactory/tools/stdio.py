"""The stdio transport: an MCP server as a subprocess we own, with everything it starts.

Unlike `mcp.client.stdio`, this keeps the process handle, so the supervisor knows the PID, sees the
process die, keeps the tail of its stderr for error messages, and stops every process the server
started. The server runs in a PID namespace of its own where the kernel allows it (see
`proctree.py`), otherwise in a process group of its own; stopping it ends the namespace (the kernel
kills all that is in it, setsid() grandchildren included), or kills its group, its descendants and
whatever still holds its pipes.

The process itself is watched (a pidfd on Linux), not only its output: when the server exits while
a grandchild still holds its stdout open, what it wrote before exiting is read, then its output is
closed, so the session fails its pending calls at once instead of waiting for their timeouts.
`StdioSession` (mcp_session.py) speaks MCP over the pipes. A last-resort `atexit` hook kills any
server still alive when the interpreter exits.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import collections
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import termios

from rlfactory.tools import proctree
from rlfactory.tools.process import signal_group

log = logging.getLogger("rlfactory.tools.stdio")

_READ_LIMIT = 1 << 20  # stdout buffered before the pipe is paused; the session consumes it at once
_LIVE: set["StdioProcess"] = set()


def _kill_leftovers() -> None:
    for process in list(_LIVE):
        process.kill_now()


atexit.register(_kill_leftovers)


def _unread_bytes(fd: int) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]


def _pipe_inodes(process: asyncio.subprocess.Process) -> set[int]:
    transport = getattr(process, "_transport", None)
    inodes = set()
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        raw = pipe.get_extra_info("pipe") if pipe is not None else None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            inodes.add(os.fstat(raw.fileno()).st_ino)
    return inodes


class StdioProcess:
    """One server subprocess; its stdin/stdout are the MCP wire.

    `pid` is the process rlfactory started: with PID isolation that is `unshare`, whose death takes
    the server and every process it started with it; otherwise the server, leading its own group.
    """

    def __init__(self, name: str, process: asyncio.subprocess.Process, isolated: bool) -> None:
        self.name = name
        self.process = process
        self.pid = process.pid
        self.isolated = isolated
        self.garbage_lines = 0
        self.exit_noticed = False
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_task = asyncio.create_task(self._pump_stderr())
        self._pipes = _pipe_inodes(process)
        self._exit_task: asyncio.Task[None] | None = None
        self._pidfd: int | None = None
        self._watch_exit()
        _LIVE.add(self)

    @classmethod
    async def spawn(
        cls,
        name: str,
        command: str,
        args: list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        isolate: bool = True,
    ) -> "StdioProcess":
        """Start `command args` with piped stdin/stdout/stderr, in its own PID namespace when
        `isolate` and the kernel allow it, and in its own session (so its own process group)."""
        full_env = {**os.environ, **(env or {})}
        if os.sep not in command and shutil.which(command, path=full_env.get("PATH")) is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", command)
        prefix = await proctree.namespace_prefix() if isolate else None
        process = await asyncio.create_subprocess_exec(
            *(prefix or []),
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            start_new_session=True,  # its own process group: killpg reaches its children too
            limit=_READ_LIMIT,
        )
        return cls(name, process, isolated=prefix is not None)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.exit_noticed

    def describe_exit(self) -> str:
        rc = self.process.returncode
        parts = [f"pid {self.pid}"]
        if rc is not None:
            if rc < 0:
                parts.append(f"killed by signal {-rc}")
            elif self.isolated and rc > 128:  # ns_init reports a signal death as 128 + N
                parts.append(f"killed by signal {rc - 128}")
            else:
                parts.append(f"exit code {rc}")
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

    # ---- noticing the exit -------------------------------------------------------------------
    def _watch_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: poll instead
            self._exit_task = asyncio.create_task(self._poll_exit())
            return
        loop.add_reader(self._pidfd, self._on_pidfd)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None

    def _on_pidfd(self) -> None:
        self._close_pidfd()
        self._exit_task = asyncio.create_task(self._after_exit())

    async def _poll_exit(self) -> None:
        while self.process.returncode is None:
            await asyncio.sleep(0.05)
        await self._after_exit()

    async def _after_exit(self) -> None:
        """The process is gone: read what it wrote, then close its pipes even if a leftover
        grandchild still holds them (and, without a namespace, kill those leftovers)."""
        if not self.isolated:  # reading /proc takes a few ms per hundred processes: not on the loop
            proctree.kill_all(await asyncio.to_thread(proctree.leftovers, self.pid, self._pipes, False))
        transport = getattr(self.process, "_transport", None)
        for fd in (1, 2):
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is None or pipe.is_closing():
                continue
            raw = pipe.get_extra_info("pipe")
            for _ in range(1000):  # what it wrote is in the pipe already: the loop reads it in a turn or two
                try:
                    if _unread_bytes(raw.fileno()) == 0:
                        break
                except (OSError, ValueError):
                    break
                await asyncio.sleep(0)
            self.exit_noticed = True
            pipe.close()
        self.exit_noticed = True

    # ---- stopping ----------------------------------------------------------------------------
    async def _wait_exit(self, timeout: float) -> bool:
        # Poll returncode: Process.wait() also waits for pipe EOF, which a grandchild can hold open.
        deadline = asyncio.get_running_loop().time() + timeout
        while self.process.returncode is None:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def stop(self, grace_s: float = 2.0) -> None:
        """Close stdin, give the server `grace_s` to exit, then SIGTERM / SIGKILL all it started."""
        try:
            if self.process.stdin is not None and not self.process.stdin.is_closing():
                self.process.stdin.close()
            if not await self._wait_exit(grace_s):
                self._signal_group(signal.SIGTERM)
                if not await self._wait_exit(1.0):
                    self.kill_now()
                    await self._wait_exit(2.0)
        finally:
            self.kill_now()  # descendants left behind, if any
            self._close_pidfd()
            self._stderr_task.cancel()
            if self._exit_task is not None:
                self._exit_task.cancel()
            transport = getattr(self.process, "_transport", None)
            if transport is not None:
                transport.close()

    def kill_now(self) -> None:
        """SIGKILL the server and every process it started (synchronous: no event loop needed)."""
        leftovers: list[int] = []
        if not self.isolated and self in _LIVE:  # once only: afterwards the pid and the pipes may be reused
            leftovers = proctree.leftovers(self.pid, self._pipes, server_alive=self.process.returncode is None)
        self._signal_group(signal.SIGKILL)
        proctree.kill_all(leftovers)
        _LIVE.discard(self)

    def _signal_group(self, sig: int) -> None:
        signal_group(self.pid, sig)
