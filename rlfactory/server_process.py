"""A local HTTP server as a real child process: start it on a free port, wait for `/health`, stop it.

`ServerProcess` is the shared mechanism behind the search env's retriever
(rlfactory.envs.search.service.RetrieverProcess) and `rlfactory serve`
(rlfactory.serve.process.ServeProcess): a subclass gives the command for a port. The child runs in
a session of its own with its output in an already-unlinked temp file (nothing is left on disk,
even when this process dies; `output()` still reads it), and it is stopped (its whole process
group: SIGTERM, then SIGKILL) on `stop()`, on leaving a `with` block, when garbage-collected and
at interpreter exit. The commands take `--exit-with-parent PID`, so a crash leaves no orphan.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from typing import IO

import httpx

from rlfactory.tools.process import stop_group


def exit_with_parent(parent_pid: int) -> None:
    """In the server (the child): exit when the process that started it is gone (`--exit-with-parent`;
    no orphaned servers after a crash)."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, log: IO[bytes], grace_s: float) -> None:
    stop_group(proc, grace_s)
    log.close()


class ServerProcess:
    """Base class: `command(port)` is the child's argv; `url` is `http://host:port` once started.
    `name` says what the server is in errors; `stop_grace_s` is how long SIGTERM is given."""

    name = "server"
    log_prefix = "rlfactory-server-"
    stop_grace_s = 10.0

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, startup_timeout_s: float = 60.0,
                 cwd: str | None = None) -> None:
        self.host, self.cwd, self.startup_timeout_s = host, cwd, startup_timeout_s
        self._requested_port = port
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        self._log: IO[bytes] | None = None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        if self.proc is None or self.port is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"http://{self.host}:{self.port}"

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            return self
        fixed = self._requested_port is not None
        last_error = ""
        for _ in range(1 if fixed else 3):  # a picked port can be taken before the server binds it
            port = self._requested_port if fixed else free_port(self.host)
            fd, log_path = tempfile.mkstemp(prefix=self.log_prefix, suffix=".log")
            log = open(log_path, "rb")
            os.unlink(log_path)
            with os.fdopen(fd, "w") as out:
                proc = subprocess.Popen([*self.command(port), "--exit-with-parent", str(os.getpid())],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=self.cwd)
            finalizer = weakref.finalize(self, _stop, proc, log, self.stop_grace_s)
            if self._wait_ready(proc, f"http://{self.host}:{port}"):
                self.proc, self.port, self._finalizer, self._log = proc, port, finalizer, log
                return self
            last_error = log.read().decode(errors="replace")[-3000:]
            finalizer()
        raise RuntimeError(f"{self.name} did not start:\n{last_error}")

    def _wait_ready(self, proc: subprocess.Popen, url: str) -> bool:
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return False
                try:
                    if client.get(url + "/health").status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        return False

    def output(self) -> str:
        """What the server printed so far."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
