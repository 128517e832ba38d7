"""Small HTTP helpers shared by the route modules: JSON bodies, errors as one-line JSON, SSE."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse


class ApiError(Exception):
    """An error answered as {"error": message, "issues": [...]} with an HTTP status."""

    def __init__(self, status: int, message: str, issues: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.issues = status, message, issues or []


async def body(request: Request, max_bytes: int = 2 << 20) -> dict[str, Any]:
    """The request's JSON object body (400 when it is not one; 413 past `max_bytes`)."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise ApiError(413, f"request body over {max_bytes} bytes")
    try:
        data = json.loads(raw or b"{}")
    except ValueError as e:
        raise ApiError(400, f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    return data


def arg(request: Request, name: str, default: Any = None, kind: type = str) -> Any:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if default is None and kind is not None and name in ("run", "id"):
            raise ApiError(400, f"missing query parameter {name!r}")
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ApiError(400, f"query parameter {name}={raw!r} is not a {kind.__name__}") from None


def ok(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={"Cache-Control": "no-store"})


def sse_event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def sse(stream: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
