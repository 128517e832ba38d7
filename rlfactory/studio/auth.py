"""Token auth for every request, as a notebook server does it.

The token printed at start-up is accepted as `?token=...` (then kept in an HttpOnly, SameSite=Strict
cookie and the URL is cleaned by a redirect), as `Authorization: Bearer ...` or as `X-Studio-Token`.
Anything else gets 401 with a one-line reason. Requests that change something must also come from
the studio's own origin when the browser says where they come from (no cross-site form posts).
"""

from __future__ import annotations

import hmac
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

REFUSED_HTML = (
    "<!doctype html><html><head><meta charset='utf-8'><title>rlfactory studio: token needed</title></head>"
    "<body style='font:16px system-ui;margin:4em'><h1>Token needed</h1><p id='refused'>{reason}</p>"
    "<p>Open the URL that <code>rlfactory ui</code> printed when it started "
    "(it ends in <code>?token=...</code>).</p></body></html>"
)


class TokenAuth:
    """ASGI middleware: refuses any HTTP request without the right token."""

    def __init__(self, app: ASGIApp, token: str, cookie_name: str) -> None:
        if len(token) < 16:
            raise ValueError("the studio token must be at least 16 characters")
        self.app, self.token, self.cookie = app, token, cookie_name

    def _ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        from_query = next((v for k, v in query if k == "token"), None)
        if from_query is not None:
            if not self._ok(from_query):
                await _refuse(scope, send, "wrong token")
                return
            if scope["method"] == "GET" and not scope["path"].startswith("/api/"):
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                await _redirect(send, scope["path"] + (f"?{rest}" if rest else ""), self.cookie, self.token)
                return
        else:
            bearer = headers.get("authorization", "")
            given = bearer[7:] if bearer.lower().startswith("bearer ") else headers.get("x-studio-token")
            if given is None:
                morsel = SimpleCookie(headers.get("cookie", "")).get(self.cookie)
                given = morsel.value if morsel else None
            if not self._ok(given):
                await _refuse(scope, send, "wrong token" if given else "this studio needs its token")
                return
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            origin = headers.get("origin")
            if origin and origin.split("://", 1)[-1] != headers.get("host"):
                await _refuse(scope, send, f"cross-origin request from {origin} refused", status=403)
                return
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, send: Send, reason: str, status: int = 401) -> None:
    if scope["path"].startswith("/api/"):
        import json

        body, kind = json.dumps({"error": reason}).encode(), b"application/json"
    else:
        body, kind = REFUSED_HTML.format(reason=reason).encode(), b"text/html; charset=utf-8"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, cookie: str, token: str) -> None:
    set_cookie = f"{cookie}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", set_cookie.encode("latin-1")),
                            (b"cache-control", b"no-store"), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
