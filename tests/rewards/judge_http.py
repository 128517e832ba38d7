"""A local OpenAI-shaped HTTP endpoint for the judge tests (127.0.0.1, a free port)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, payload: Any, code: int = 200) -> None:
    """Answer with `payload` as JSON (bytes are sent as they are)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], **attrs: Any) -> Iterator[ThreadingHTTPServer]:
    """A server of `handler` in a thread, with `attrs` set on it, shut down on exit."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attrs.items():
        setattr(srv, name, value)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
