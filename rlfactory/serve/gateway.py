"""The OpenAI-compatible recording gateway: an agent's own loop talks to the policy through
`/v1/chat/completions`, and every sampled token is recorded into its episode's trajectories.

    Gateway         episodes, one chat call end to end, the HTTP routes, in-loop start/stop
    gateway_api     the OpenAI request/response shapes (and the SSE stream)
    gateway_record  calls of one episode into samples (continuations and branches)
    cli/gateway.py  `rlfactory gateway MODEL`: the same in a process of its own

The trainer's side (run a user's agent per dataset row, score it) is rlfactory/train/gateway_agents.py,
in the layer that assembles runs.

Routes (`{p}` is `/v1` or `/episodes/<key>/v1`):
    POST {p}/chat/completions   the episode is the path's key, else the `Authorization: Bearer <key>`
    GET  {p}/models             the served model
    POST /v1/episodes           {"info"?: {...}} -> {"episode": key, "base_url"}: a new episode
    POST /v1/episodes/<key>/finish  {"reward"?: x, "status"?: s} -> its trajectories (JSON)
    GET  /v1/gateway/stats      calls, episodes, mean added latency per call
    GET  /health                {"status": "ok", ...}

A call renders its messages and tools with the family's ToolManager (the same ids the trainer
would build), submits the prompt to the policy's Generator (the local one, or servers through the
same interface), parses each sampled turn with the family's parser and answers with OpenAI's
`tool_calls`; the agent runs its tools itself. An unknown key is a 401 that says so, unless the
gateway was opened with `open_episodes` (then a new key starts an episode).

Added latency: each call's wall time in the gateway minus the generator's own time (queue +
generation), summed per episode (`gateway_overhead_s`) and over the gateway (`stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlfactory.chat.base import ParseResult, PromptTextRenderer, ToolCalls
from rlfactory.config import SamplingConfig
from rlfactory.chat.turns import parse_turn, turn_text
from rlfactory.protocols import GenRequest, GenResult, GenerationUnavailable, Generator, KeepsSessions
from rlfactory.generation.sampling import mix_seed
from rlfactory.serve.gateway_api import (BadRequest, ChatRequest, completion, error_body, make_choice, parse_chat,
                                         stream_chunks, unmet_tool_choice)
from rlfactory.serve.gateway_prefix import KnownText, PrefixEncoder
from rlfactory.serve.gateway_record import Episode


SWITCH_INTERVAL_S = 0.0005
"""The interpreter's GIL switch interval while a gateway serves (Python's default: 5 ms). The event
loop (agents, HTTP, gateway) lets go of the GIL for every socket call and Rust call, then waits for
the decode thread, which holds it while it runs Python, for up to the switch interval: at 5 ms an
agent over loopback TCP took 1.39x the native env's wall time, at 0.5 ms 1.05x (native unchanged;
benchmarks/gateway.py's workload, one run each, load ~2)."""


class UnknownEpisode(KeyError):
    """No open episode has this key."""


class ToolChoiceUnmet(ValueError):
    """tool_choice required / a named function, and no sample of the turn complied (HTTP 422)."""


@dataclass
class GatewayStats:
    calls: int = 0
    overhead_s: float = 0.0
    """Wall seconds in the gateway outside generation (render, parse, record), waits for the GIL
    included: what a call's latency gains."""
    cpu_s: float = 0.0
    """CPU seconds of the same work (the event loop thread's own time)."""
    gen_s: float = 0.0
    tool_choice_retries: int = 0
    """Turns sampled again because the reply did not do what `tool_choice` asked."""

    def as_dict(self, episodes: int) -> dict[str, float]:
        per_call = 1000 / self.calls if self.calls else 0.0
        return {"calls": self.calls, "episodes_open": episodes, "overhead_s": self.overhead_s, "gen_s": self.gen_s,
                "cpu_s": self.cpu_s, "overhead_ms_per_call": self.overhead_s * per_call,
                "cpu_ms_per_call": self.cpu_s * per_call, "tool_choice_retries": self.tool_choice_retries}


class Gateway:
    """Serve `generator` to agents in OpenAI's chat shape, recording each episode's tokens.

    `tool_manager` renders requests and parses turns; `tokenizer` decodes prompt/observation ids
    for the record; `context` (0: unchecked) bounds prompt + max tokens; `max_new_tokens` is the
    default and the cap of a call's `max_tokens`. `policy_version` is recorded on every model
    segment a generator does not report its own for (the trainer sets it before each rollout).
    `tool_choice_retries`: how many more times a turn is sampled when it does not do what a
    `tool_choice` of required or a named function asks (gateway_api.py). `verify_prefix`: how many
    prompts encoded by reusing known ids are checked against a full encode, counted per tokenizer
    object over every gateway on it (True: all).
    """

    def __init__(self, generator: Generator, tool_manager: Any, tokenizer: Any, *, model_name: str = "rlfactory",
                 max_new_tokens: int = 512, context: int = 0, open_episodes: bool = False,
                 policy_version: int = 0, tool_choice_retries: int = 3, verify_prefix: int | bool = 16) -> None:
        self.generator = generator
        self.tool_manager = tool_manager
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_new_tokens = int(max_new_tokens)
        self.context = int(context)
        self.open_episodes = open_episodes
        self.policy_version = policy_version
        self.tool_choice_retries = int(tool_choice_retries)
        self.sampling: SamplingConfig | None = None
        """When set (training), every call samples with it whatever the agent asks: the recorded
        logprobs must be those the trainer corrects for. None: each request's temperature/top_p."""
        self.stats = GatewayStats()
        self.episodes: dict[str, Episode] = {}
        self.prefix = PrefixEncoder(tool_manager.template.encode, tokenizer, verify_prefix) \
            if _renders_its_prompt_text(tool_manager) else None
        """Encodes each prompt reusing the ids of the episode's previous prompt and of the latest
        prompt of any episode (gateway_prefix.py); None: the family renders ids only."""
        self._latest: KnownText | None = None
        self.stop_ids = list(tool_manager.stop_token_ids())
        self.stop_strings = list(tool_manager.stop_strings())
        self.stop_texts = {i: self.decode([i]) for i in self.stop_ids}
        self.url: str | None = None
        self.on_finish: Callable[[list], None] | None = None
        """Called with an episode's trajectories when a client finishes it over HTTP (the CLI writes them)."""
        self.asgi: Starlette | None = None
        """The app being served (set by `start`): an in-process client may call it directly, without
        a socket (train/gateway_agents.py does, for agents in the gateway's own event loop)."""
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self._switch_before: float | None = None

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ---- episodes -------------------------------------------------------------------------------

    def open_episode(self, info: dict[str, Any] | None = None, seed: int | None = None, key: str | None = None,
                     generator: Generator | None = None) -> str:
        """Start an episode; returns its key (the agent's API key). `seed` seeds its calls' draws;
        `generator` serves its calls instead of the gateway's (asynchronous training's copy)."""
        key = key or f"ep-{uuid.uuid4().hex}"
        self.episodes[key] = Episode(key, self.decode, info, seed, generator)
        return key

    def close_episode(self, key: str) -> Episode:
        """End episode `key`: later calls with its key are refused; its kept KV caches are freed."""
        episode = self.episodes.pop(key, None)
        if episode is None:
            raise UnknownEpisode(key)
        episode.closed = True
        generator = episode.generator or self.generator
        if isinstance(generator, KeepsSessions):
            for s in range(len(episode.samples)):
                generator.forget(f"{key}:{s}")
        return episode

    def base_url(self, key: str | None = None) -> str:
        """The URL an OpenAI client takes as `base_url` (with the key in the path when given)."""
        if self.url is None:
            raise RuntimeError("the gateway is not serving: start() it first")
        return f"{self.url}/episodes/{key}/v1" if key else f"{self.url}/v1"

    def _episode(self, key: str | None) -> Episode:
        if key and key in self.episodes:
            return self.episodes[key]
        if key and self.open_episodes:
            self.open_episode(key=key)
            return self.episodes[key]
        shown = f"{key[:12]}..." if key and len(key) > 12 else key
        raise UnknownEpisode(f"unknown episode key {shown!r}: use the API key the trainer handed out for this "
                             "episode (Authorization: Bearer <key>, or the base URL /episodes/<key>/v1); an "
                             "episode's key stops working when the episode ends" if key else
                             "no episode key: send Authorization: Bearer <episode key> or use /episodes/<key>/v1")

    # ---- one call ---------------------------------------------------------------------------------

    async def chat(self, key: str | None, body: Any) -> tuple[ChatRequest, dict[str, Any], list]:
        """Serve one chat call of episode `key`; returns (request, the rlfactory extras, choices).
        Raises UnknownEpisode, BadRequest, or GenerationUnavailable."""
        t0, c0 = time.perf_counter(), time.thread_time()
        episode = self._episode(key)
        request = parse_chat(body)
        tm = self.tool_manager
        try:
            # tool_choice none: the tools are not shown (vLLM's --exclude-tools-when-tool-choice-none)
            prompt = self._render(episode, request.messages, [] if request.tool_choice == "none" else request.tools)
        except (ValueError, TypeError, KeyError, TemplateError) as e:  # the template refusing these messages
            raise BadRequest(f"the chat template cannot render these messages: {type(e).__name__}: {e}"[:500]) from None
        max_new = min(request.max_tokens or self.max_new_tokens, self.max_new_tokens)
        if self.context and len(prompt) + max_new > self.context:
            max_new = self.context - len(prompt)
            if max_new < 1:
                raise BadRequest(f"the prompt ({len(prompt)} tokens) fills the model's context ({self.context})")
        match = episode.match(prompt)
        call = episode.calls
        seed = request.seed if request.seed is not None else episode.seed
        next_sample = len(episode.samples)

        def gen_request(k: int, attempt: int = 0) -> GenRequest:
            # the kept KV cache of the sample this call continues (choice 0 only)
            session = f"{episode.key}:{match.index if match.index is not None else next_sample}" if k == 0 else None
            draws = (seed, call, k) if attempt == 0 else (seed, call, k, "tool_choice", attempt)
            return GenRequest(prompt, max_new, self.sampling or request.sampling, self.stop_ids,
                              self.stop_strings + request.stop,
                              session, None if seed is None else mix_seed(*draws))

        t_submit, c_submit = time.perf_counter(), time.thread_time()
        generator = episode.generator or self.generator
        if request.n == 1:  # in this task: gather would wrap it in a task of its own, a loop turn later
            results: list[GenResult] = [await generator.submit(gen_request(0))]
        else:
            results = list(await asyncio.gather(*(generator.submit(gen_request(k)) for k in range(request.n))))
        t_gen, c_gen = time.perf_counter(), time.thread_time()
        if episode.closed:
            raise UnknownEpisode(f"episode {episode.key[:12]}... ended while this call generated")
        choices, calls = [], []
        retry_gen_s = 0.0
        for k, r in enumerate(results):
            text = turn_text(r, self.stop_texts)
            parsed = await parse_turn(tm, text)
            if request.tool_choice in ("required", "function"):
                r, text, parsed, spent = await self._meet_tool_choice(
                    request, r, text, parsed, lambda attempt, k=k: generator.submit(gen_request(k, attempt)))
                results[k], retry_gen_s = r, retry_gen_s + spent
            calls.append(list(parsed.calls) if isinstance(parsed, ToolCalls) and request.tool_choice != "none" else [])
            length = r.finish_reason == "length"
            choices.append(make_choice(text, parsed, length, request.tool_choice, len(r.token_ids)))
        samples = episode.record(match, prompt, results, self.policy_version, calls)
        gen_s = t_gen - t_submit + retry_gen_s  # waiting for the generator (its queue and the batch included)
        overhead = time.perf_counter() - t0 - gen_s
        cpu = time.thread_time() - c0 - (c_gen - c_submit)  # the loop thread's CPU while generating is others' work
        episode.overhead_s += overhead
        episode.gen_s += gen_s
        self.stats.calls += 1
        self.stats.overhead_s += overhead
        self.stats.cpu_s += cpu
        self.stats.gen_s += gen_s
        extra = {"episode": episode.key, "samples": samples, "policy_version": self.policy_version,
                 "branched": match.index is None and match.branch is not None}
        return request, {**extra, "prompt_tokens": len(prompt)}, choices

    def _render(self, episode: Episode, messages: list[dict[str, Any]], tools: Sequence[Any]) -> list[int]:
        """The prompt ids of `messages` + `tools`: the family's `render_prompt`, with the text
        encoded only past what this episode's previous prompt or the latest one shares with it."""
        if self.prefix is None:
            return list(self.tool_manager.render_prompt(messages, tools))
        text = self.tool_manager.render_prompt_text(messages, tools)
        known = self.prefix.encode(text, (episode.prompt_text, self._latest))
        episode.prompt_text = self._latest = known
        return list(known.ids)

    async def _meet_tool_choice(self, request: ChatRequest, result: GenResult, text: str, parsed: ParseResult,
                                submit: Callable[[int], Any]) -> tuple[GenResult, str, ParseResult, float]:
        """The first of `result` and up to `tool_choice_retries` more samples that does what
        `request.tool_choice` asks, its text and parse, and the seconds spent generating the
        retries; ToolChoiceUnmet when none does. Set-aside samples are not recorded."""
        why = unmet_tool_choice(request, parsed)
        attempt, spent = 0, 0.0
        while why is not None and attempt < self.tool_choice_retries:
            attempt += 1
            t0 = time.perf_counter()
            result = await submit(attempt)
            spent += time.perf_counter() - t0
            text = turn_text(result, self.stop_texts)
            parsed = await parse_turn(self.tool_manager, text)
            why = unmet_tool_choice(request, parsed)
        self.stats.tool_choice_retries += attempt
        if why is not None:
            wanted = "required" if request.tool_choice == "required" else f"function {request.tool_name!r}"
            raise ToolChoiceUnmet(f"tool_choice {wanted}: {why}, in all {attempt + 1} samples of this turn "
                                  f"(gateway tool_choice_retries={self.tool_choice_retries}); its last reply began "
                                  f"{text[:120]!r}")
        return result, text, parsed, spent

    # ---- HTTP ----------------------------------------------------------------------------------

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            key = request.path_params.get("key") or _bearer(request)
            try:
                body = await request.json()
            except (ValueError, RecursionError):
                return _error("the body is not valid JSON", 400)
            try:
                req, extra, choices = await self.chat(key, body)
            except UnknownEpisode as e:
                return _error(str(e.args[0]), 401)
            except BadRequest as e:
                return _error(str(e), 400)
            except ToolChoiceUnmet as e:
                return _error(str(e), 422)
            except GenerationUnavailable as e:
                return _error(f"generation unavailable: {e}", 503)
            if req.stream:
                chunks = stream_chunks(choices, self.model_name, extra["prompt_tokens"], req.include_usage)
                return StreamingResponse(chunks, media_type="text/event-stream")
            return JSONResponse(completion(choices, self.model_name, extra.pop("prompt_tokens"), extra))

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                             "owned_by": "rlfactory"}]})

        async def new_episode(request: Request) -> JSONResponse:
            body = await _body(request)
            info = body.get("info") if isinstance(body, dict) and isinstance(body.get("info"), dict) else None
            key = self.open_episode(info)
            return JSONResponse({"episode": key, "base_url": self.base_url(key) if self.url else None})

        async def finish(request: Request) -> JSONResponse:
            body = await _body(request)
            body = body if isinstance(body, dict) else {}
            reward = body.get("reward")
            if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
                return _error("`reward` must be a number", 400)
            status = body.get("status", "ok")
            if status not in ("ok", "truncated", "malformed", "infra_error"):
                return _error("`status` must be ok, truncated, malformed or infra_error", 400)
            try:
                episode = self.close_episode(request.path_params["key"])
            except UnknownEpisode:
                return _error(f"unknown episode key {request.path_params['key'][:12]!r}", 401)
            trajs = episode.trajectories(str(body.get("group") or episode.key), 0, status,
                                         None if reward is None else float(reward))
            if self.on_finish is not None:
                self.on_finish(trajs)
            return JSONResponse({"trajectories": [t.to_dict() for t in trajs]})

        async def stats(request: Request) -> JSONResponse:
            return JSONResponse(self.stats.as_dict(len(self.episodes)))

        async def health(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok", "server": "rlfactory-gateway", "model": self.model_name,
                                 "episodes_open": len(self.episodes)})

        return Starlette(routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/episodes/{key}/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/episodes/{key}/v1/models", models, methods=["GET"]),
            Route("/v1/episodes", new_episode, methods=["POST"]),
            Route("/v1/episodes/{key}/finish", finish, methods=["POST"]),
            Route("/v1/gateway/stats", stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ])

    async def start(self, host: str = "127.0.0.1", port: int | None = None) -> str:
        """Serve on `host:port` (a free port when None) from this event loop; returns the URL."""
        import uvicorn

        from rlfactory.serve.process import free_port

        port = port or free_port(host)
        self.asgi = self.app()
        # no `server` and `date` headers: fewer lines for every client to parse and search (httpx's
        # Headers look a name up by scanning them all, and the OpenAI SDK looks up several per reply)
        config = uvicorn.Config(self.asgi, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1, server_header=False, date_header=False)
        self._server = _InLoopServer(config)
        self._task = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError(f"the gateway did not start on {host}:{port}")
            await asyncio.sleep(0.005)
        self.url = f"http://{host}:{port}"
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:  # shorter GIL waits for the loop while serving
            self._switch_before = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)
        self._server = self._task = None
        self.url = None
        self.asgi = None
        if self._switch_before is not None:
            sys.setswitchinterval(self._switch_before)
            self._switch_before = None


class _InLoopServer:
    """uvicorn's Server without its signal handlers: in the trainer's loop, Ctrl-C stays the
    trainer's (uvicorn would swallow it to stop only the gateway)."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def capture_signals(self) -> contextlib.AbstractContextManager:  # type: ignore[override]
                return contextlib.nullcontext()

        return Server(config)


def _renders_its_prompt_text(tool_manager: Any) -> bool:
    """Whether `tool_manager`'s prompt ids are its `render_prompt_text`, encoded: a PromptTextRenderer
    whose two methods come from one class (a subclass that overrides only `render_prompt`, say to
    add something, is not)."""
    if not isinstance(tool_manager, PromptTextRenderer):
        return False
    for klass in type(tool_manager).__mro__:
        own = vars(klass)
        if "render_prompt" in own or "render_prompt_text" in own:
            return "render_prompt" in own and "render_prompt_text" in own
    return False


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def _body(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError):
        return None


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)
