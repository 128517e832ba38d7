"""Run an ASGI app (e.g. `build_app(served)`) on a free loopback port in a background thread:
`with AppThread(app) as srv: srv.url`. For tests and benchmarks that want a real HTTP server in
this process; `rlfactory serve` and ServeProcess run it in a process of its own."""

from __future__ import annotations

import threading
import time
from typing import Any

from rlfactory.serve.process import free_port


class AppThread:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, startup_timeout_s: float = 30.0) -> None:
        self.app, self.host, self.port = app, host, port
        self.startup_timeout_s = startup_timeout_s
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "AppThread":
        import uvicorn

        self.port = self.port or free_port(self.host)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1)  # stop() cancels hanging requests
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name=f"app-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> "AppThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
