"""Start and stop `rlfactory serve` as a real server process (tests, benchmarks, scripts).

`ServeProcess("tiny:1m")` picks a free port, starts `python -m rlfactory.cli.main serve ...` and
waits until `/health` answers (rlfactory.server_process: stopped with its whole process group on
`stop()`, on leaving a `with` block, when garbage-collected and at interpreter exit; it exits by
itself when its parent dies).
"""

from __future__ import annotations

import sys

from rlfactory.server_process import ServerProcess, free_port

__all__ = ["ServeProcess", "free_port"]


class ServeProcess(ServerProcess):
    """An `rlfactory serve MODEL` process; `url` is `http://host:port` once started. `args` are
    extra command-line options (e.g. ["--max-batch", "8", "--threads", "1"]); `cwd` its folder."""

    log_prefix = "rlfactory-serve-"

    def __init__(self, model: str, args: list[str] | None = None, host: str = "127.0.0.1",
                 port: int | None = None, startup_timeout_s: float = 120.0, cwd: str | None = None) -> None:
        super().__init__(host, port, startup_timeout_s, cwd)
        self.model, self.args = model, list(args or [])
        self.name = f"rlfactory serve {model}"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "rlfactory.cli.main", "serve", self.model, "--host", self.host,
                "--port", str(port), *self.args]
