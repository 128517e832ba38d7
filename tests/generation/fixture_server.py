"""A stand-in generation server for the ServerGenerator tests: a real HTTP server (starlette +
uvicorn in a thread) that answers `/v1/completions` and `/generate` with a fixture body (the
documented vLLM / SGLang shapes in fixtures/) or fails as told, and records what it was sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from rlfactory.serve.process import free_port
from rlfactory.serve.thread import AppThread

FIXTURES = Path(__file__).parent / "fixtures"
MODES = ("ok", "500", "garbage", "malformed", "reject", "slow")


def fixture_response(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())["response"]


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"


class FixtureServer:
    def __init__(self, response: dict, mode: str = "ok", delay_s: float = 0.0, slow_s: float = 60.0) -> None:
        self.response, self.mode, self.delay_s, self.slow_s = response, mode, delay_s, slow_s
        self.requests: list[tuple[str, dict]] = []
        routes = [Route(p, self._generate, methods=["POST"]) for p in ("/v1/completions", "/generate")]
        routes.append(Route("/health", self._health, methods=["GET"]))
        self._thread = AppThread(Starlette(routes=routes))

    @property
    def url(self) -> str:
        return self._thread.url

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)  # vLLM and SGLang answer an empty 200

    async def _generate(self, request: Request) -> Response:
        self.requests.append((request.url.path, await request.json()))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "500":
            return PlainTextResponse("Internal Server Error", status_code=500)
        if self.mode == "garbage":
            return Response("{'not': json", media_type="application/json")
        if self.mode == "bad_utf8":  # the documented body, its text with bytes that are not UTF-8
            body = json.dumps({**self.response, "choices": [{**self.response["choices"][0], "text": "TEXT"}]})
            return Response(body.encode().replace(b"TEXT", b"caf\xc3 \xff"), media_type="application/json")
        if self.mode == "deep":  # a hostile server: nested past Python's recursion limit
            return Response(b'{"choices":' + b"[" * 50_000 + b"]" * 50_000 + b"}", media_type="application/json")
        if self.mode == "negative_id":
            return JSONResponse({**self.response, "choices": [{**self.response["choices"][0], "token_ids": [19, -1, 151645]}]})
        if self.mode == "malformed":
            return JSONResponse({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]})
        if self.mode == "reject":
            return JSONResponse({"error": {"message": "This model's maximum context length is 32 tokens"}}, status_code=400)
        if self.mode == "slow":
            await asyncio.sleep(self.slow_s)
        return JSONResponse(self.response)

    def __enter__(self) -> "FixtureServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop()
