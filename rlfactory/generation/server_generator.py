"""ServerGenerator: the Generator protocol over HTTP generation servers (vLLM, SGLang or
`rlfactory serve`), token ids in and out (wire formats in server_api.py).

Routing. A request's `session` (one per trajectory) pins it to the server that served its first
turn, so every turn of a trajectory reuses that server's prefix cache; a request without a pinned
server goes to the least loaded server that is up (fewest requests in flight from here, then fewest
pinned trajectories). A server that fails (connection error, timeout, 5xx, a body that is not the
documented shape) is marked down for `cooldown_s` and the turn is retried on another server, once
per server. When no server is left the turn raises `GenerationUnavailable`, which the rollout
engine turns into an `infra_error` trajectory; the run goes on. A 4xx answer means the request
itself was refused (e.g. a prompt longer than the server's context): it is not retried and raises
`GenerationUnavailable` with the server's reason.

Versions. Each server has a gate (a TurnGate, as VersionedGenerator's) that the weight sync closes
while it updates that server (`hold` / `release`): no new turn is sent to it until the update is
done, and `hold` returns once the turns already in flight there have come back, so every turn is
served by one set of weights.
A turn's `policy_version` is the version the server reports in its answer (`rlfactory serve`,
SGLang's `weight_version`), else the version the sync recorded for that server when the turn was
sent. A server whose last sync failed is `stale` and gets no turns until a sync succeeds.

Images. A request's images go with every turn in SGLang's `image_data` (`rlfactory serve` reads
them the same way); with `api: vllm` a request with images raises ImagesNotCarried, one line
naming what to use instead (vLLM's HTTP API takes no images with token ids: server_api.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx

from rlfactory.protocols import GenerationUnavailable, GenRequest, GenResult, generate_all
from rlfactory.generation.server_api import (PATHS, VLLM_NO_IMAGES, Api, ImagesNotCarried, MalformedResponse, build_request,
                                             parse_response)
from rlfactory.generation.versioned import TurnGate


@dataclass
class ServerState:
    """What this client knows about one server."""

    url: str
    version: int = 0
    """The policy version this server holds, as recorded by the last successful sync."""
    kind: str | None = None
    """"rlfactory" when `/health` says it is `rlfactory serve`, "other" otherwise, None before the probe."""
    assigned: int = 0
    """Turns picked for this server and not yet answered (waiting at its gate or in flight)."""
    pinned: int = 0
    down_until: float = 0.0
    last_error: str = ""
    stale: bool = False
    """The last weight sync to this server failed: it may hold old weights."""
    reported: int | None = None
    """The version this server reported with its last answer (servers that report one)."""
    served: int = 0
    failures: int = 0
    gate: TurnGate = field(default_factory=TurnGate)
    """Closed while the weight sync updates this server; counts the turns in flight there."""

    @property
    def inflight(self) -> int:
        """Turns sent to this server and not yet answered."""
        return self.gate.active

    def up(self, now: float) -> bool:
        return now >= self.down_until and not self.stale


class ServerGenerator:
    """Generate each model turn on one of `urls` (see the module doc).

    `stop_token_ids` / `stop_strings` are the defaults for requests that do not set their own;
    `tokenizer` decodes the returned ids into `GenResult.text` (special tokens kept, as the local
    generator does). `seed`: requests carry seed+n (n counts requests) when set; a request with its
    own `GenRequest.seed` carries that instead."""

    def __init__(
        self,
        urls: Sequence[str],
        api: Api,
        tokenizer: Any,
        stop_token_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        *,
        timeout_s: float = 300.0,
        cooldown_s: float = 30.0,
        served_model: str | None = None,
        seed: int | None = None,
        initial_version: int = 0,
    ) -> None:
        if not urls:
            raise ValueError("ServerGenerator needs at least one server URL")
        if api not in PATHS:
            raise ValueError(f"unknown server api {api!r} (vllm or sglang)")
        self.api: Api = api
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.timeout_s = float(timeout_s)
        self.cooldown_s = float(cooldown_s)
        self.served_model = served_model
        self.servers = [ServerState(u.rstrip("/"), version=initial_version) for u in urls]
        self._pins: dict[str, ServerState] = {}
        self._seed = seed
        self._count = 0
        self._client: httpx.AsyncClient | None = None
        self._background: set[asyncio.Task] = set()

    # ---- Generator protocol -------------------------------------------------------------------

    async def submit(self, request: GenRequest) -> GenResult:
        if not request.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")
        if request.images and self.api == "vllm":  # before any server is tried: no server of this API could
            raise ImagesNotCarried(VLLM_NO_IMAGES)
        stop_ids = self.stop_token_ids if request.stop_token_ids is None else tuple(request.stop_token_ids)
        stops = self.stop_strings if request.stop_strings is None else tuple(request.stop_strings)
        if request.seed is not None:  # the trajectory's own seed (reproducible whatever else runs)
            seed = request.seed % (2**31)
        else:
            seed = None if self._seed is None else (self._seed + self._count) % (2**31)
        self._count += 1
        tried: list[ServerState] = []
        failures: list[str] = []
        t_submit = time.perf_counter()
        while (server := self._pick(request.session, tried)) is not None:
            tried.append(server)
            server.assigned += 1  # counts for placement from the moment it is picked
            try:
                if server.kind is None:
                    await self.probe(server)  # before the gate: nothing may await between it and the send
                await server.gate.enter()
                try:
                    if not server.up(time.monotonic()):
                        continue  # went down (or stale) while we waited at its gate
                    session = request.session if self.api == "vllm" or server.kind == "rlfactory" else None
                    body = build_request(self.api, request, stop_ids, stops, seed=seed, model=self.served_model,
                                         session=session)
                    version_at_send = server.version
                    t_send = time.perf_counter()
                    turn = await self._post(server, body, stop_ids)
                finally:
                    server.gate.leave()
            except _Rejected as e:
                raise GenerationUnavailable(f"generation server {server.url} refused the request: {e}") from None
            except _ServerFault as e:
                self._mark_down(server, str(e))
                failures.append(f"{server.url}: {e}")
                continue
            finally:
                server.assigned -= 1
            server.served += 1
            if turn.policy_version is not None:
                server.reported = turn.policy_version
            self._pin(request.session, server)
            text = self.tokenizer.decode(turn.token_ids, skip_special_tokens=False) if self.tokenizer is not None else ""
            return GenResult(
                token_ids=turn.token_ids, logprobs=turn.logprobs, finish_reason=turn.finish_reason, text=text,
                stop_token=turn.stop_token, queue_s=t_send - t_submit, gen_s=time.perf_counter() - t_send,
                policy_version=turn.policy_version if turn.policy_version is not None else version_at_send,
            )
        raise GenerationUnavailable(self._unavailable_message(failures))

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await generate_all(self, requests)

    def forget(self, session: str | None = None) -> None:
        """Unpin `session` (None: every session); `rlfactory serve` also drops its KV cache."""
        sessions = list(self._pins) if session is None else [session]
        for s in sessions:
            server = self._pins.pop(s, None)
            if server is None:
                continue
            server.pinned -= 1
            if server.kind == "rlfactory":
                self._spawn(self._release(server, s))

    def reseed(self, seed: int) -> None:
        """Requests from now on carry seed, seed+1, ... (the trainer reseeds every step)."""
        self._seed, self._count = int(seed), 0

    async def aclose(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- weight sync hooks --------------------------------------------------------------------

    async def hold(self, server: ServerState) -> None:
        """Stop sending turns to `server` and wait until those in flight there have come back."""
        await server.gate.close()

    def release(self, server: ServerState, version: int | None) -> None:
        """Reopen `server` after a sync: `version` it now holds, or None when the sync failed
        (the server is then stale and gets no turns until a later sync succeeds)."""
        if version is None:
            server.stale = True
            server.last_error = "weight sync failed"
        else:
            server.version, server.stale = int(version), False
        server.gate.open()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
                                             limits=limits)
        return self._client

    # ---- pieces -------------------------------------------------------------------------------

    def _pick(self, session: str | None, tried: list[ServerState]) -> ServerState | None:
        now = time.monotonic()
        pinned = self._pins.get(session) if session is not None else None
        if pinned is not None and pinned not in tried and pinned.up(now):
            return pinned
        candidates = [s for s in self.servers if s not in tried and s.up(now)]
        if not candidates:
            return None
        return min(candidates, key=lambda s: (s.assigned, s.pinned, s.served))

    def _pin(self, session: str | None, server: ServerState) -> None:
        if session is None:
            return
        old = self._pins.get(session)
        if old is server:
            return
        if old is not None:
            old.pinned -= 1
        self._pins[session] = server
        server.pinned += 1

    def _mark_down(self, server: ServerState, reason: str) -> None:
        server.down_until = time.monotonic() + self.cooldown_s
        server.last_error = reason
        server.failures += 1
        for s in [s for s, srv in self._pins.items() if srv is server]:
            self._pins.pop(s)  # its trajectories move to another server on their next turn
            server.pinned -= 1

    def _unavailable_message(self, failures: list[str]) -> str:
        now = time.monotonic()
        parts = list(failures)
        for s in self.servers:
            if any(f.startswith(s.url + ":") for f in failures):
                continue
            if s.stale:
                parts.append(f"{s.url}: its last weight sync failed")
            elif now < s.down_until:
                parts.append(f"{s.url}: down for {s.down_until - now:.0f} s more ({s.last_error})")
        return "no generation server could serve this turn: " + "; ".join(parts or ["no servers"])

    async def _post(self, server: ServerState, body: dict[str, Any], stop_ids: Sequence[int]):
        try:
            r = await self.client.post(server.url + PATHS[self.api], json=body)
        except httpx.TimeoutException:
            raise _ServerFault(f"timed out after {self.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise _ServerFault(f"{type(e).__name__}: {e}") from None
        if r.status_code >= 500 or r.status_code in (408, 429):
            raise _ServerFault(f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code >= 400:
            raise _Rejected(f"HTTP {r.status_code} for {PATHS[self.api]}: {r.text[:300]}")
        try:  # bytes that are not UTF-8 (in a text field we never use) read as U+FFFD
            body = json.loads(r.content.decode("utf-8", "replace"))
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            raise _ServerFault(f"answered with a body that is not JSON: {r.text[:120]!r}") from None
        try:
            return parse_response(self.api, body, stop_ids)
        except MalformedResponse as e:
            raise _ServerFault(f"answered with a malformed {self.api} response: {e}") from None

    async def probe(self, server: ServerState) -> None:
        """Learn whether `server` is `rlfactory serve` (its /health is JSON naming it)."""
        try:
            r = await self.client.get(server.url + "/health", timeout=min(10.0, self.timeout_s))
        except httpx.HTTPError:
            return  # the turn itself will find out; probe again next time
        try:
            info = r.json()
        except ValueError:
            info = None
        server.kind = "rlfactory" if isinstance(info, dict) and info.get("server") == "rlfactory" else "other"

    async def _release(self, server: ServerState, session: str) -> None:
        try:
            await self.client.post(server.url + "/release_session", json={"session_id": session}, timeout=10.0)
        except httpx.HTTPError:
            pass  # the server also evicts old sessions itself

    def _spawn(self, coro) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class _ServerFault(Exception):
    """The server failed this turn (retry elsewhere)."""


class _Rejected(Exception):
    """The server refused this request (a retry elsewhere would be refused too)."""
