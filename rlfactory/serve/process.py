"""Start and stop `rlfactory serve` as a real server process (tests, benchmarks, scripts).

`ServeProcess("tiny:1m")` picks a free port, starts `python -m rlfactory.cli.main serve ...`, waits
until `/health` answers, and stops the process (its whole process group) on `stop()`, on leaving a
`with` block, when garbage-collected and at interpreter exit. The server also exits by itself when
its parent process dies, so a crash leaves no orphan.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    log.close()


class ServeProcess:
    """An `rlfactory serve MODEL` process; `url` is `http://host:port` once started. `args` are
    extra command-line options (e.g. ["--max-batch", "8", "--threads", "1"]); `cwd` its folder."""

    def __init__(self, model: str, args: list[str] | None = None, host: str = "127.0.0.1",
                 port: int | None = None, startup_timeout_s: float = 120.0, cwd: str | None = None) -> None:
        self.model, self.args, self.host, self.cwd = model, list(args or []), host, cwd
        self._requested_port = port
        self.port: int | None = None
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        self._log = None

    @property
    def url(self) -> str:
        if self.proc is None or self.port is None:
            raise RuntimeError("rlfactory serve is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServeProcess":
        if self.proc is not None and self.proc.poll() is None:
            return self
        fixed = self._requested_port is not None
        last_error = ""
        for _ in range(1 if fixed else 3):  # a picked port can be taken before the server binds it
            port = self._requested_port if fixed else free_port(self.host)
            fd, log_path = tempfile.mkstemp(prefix="rlfactory-serve-", suffix=".log")
            log = open(log_path, "rb")
            os.unlink(log_path)  # nothing is left on disk; `log` still reads it
            with os.fdopen(fd, "w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rlfactory.cli.main", "serve", self.model, "--host", self.host,
                     "--port", str(port), *self.args, "--exit-with-parent", str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd,
                )
            finalizer = weakref.finalize(self, _stop, proc, log)
            if self._wait_ready(proc, f"http://{self.host}:{port}"):
                self.proc, self.port, self._finalizer, self._log = proc, port, finalizer, log
                return self
            last_error = log.read().decode(errors="replace")[-3000:]
            finalizer()
        raise RuntimeError(f"rlfactory serve {self.model} did not start:\n{last_error}")

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

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
