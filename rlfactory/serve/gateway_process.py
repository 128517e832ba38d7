"""Start and stop `rlfactory gateway` as a real server process (tests, benchmarks, scripts):
`with GatewayProcess("tiny:1m", ["--open-episodes"]) as gw: gw.url` (rlfactory.server_process:
a free port, ready once `/health` answers, stopped with its process group)."""

from __future__ import annotations

import sys

from rlfactory.server_process import ServerProcess


class GatewayProcess(ServerProcess):
    log_prefix = "rlfactory-gateway-"

    def __init__(self, model: str, args: list[str] | None = None, host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout_s: float = 120.0, cwd: str | None = None) -> None:
        super().__init__(host, port, startup_timeout_s, cwd)
        self.model, self.args = model, list(args or [])
        self.name = f"rlfactory gateway {model}"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "rlfactory.cli.main", "gateway", self.model, "--host", self.host,
                "--port", str(port), *self.args]
