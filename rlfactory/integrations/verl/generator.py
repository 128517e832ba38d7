"""VerlGenerator: rlfactory's `Generator` over verl's LLM server manager.

verl hands every agent loop a `server_manager` whose one method is (verl 0.9.1,
verl/workers/rollout/llm_server.py `LLMServerClient.generate`; the same in 0.8's
`AsyncLLMServerManager.generate`, verl/experimental/agent_loop/agent_loop.py):

    async def generate(self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data=None, video_data=None, ...) -> TokenOutput

and `TokenOutput` has `token_ids: list[int]`, `log_probs: list[float] | None` (None unless
`sampling_params["logprobs"]` is true), `stop_reason: "completed" | "aborted" | None` and
`num_preempted: int | None`. The same `request_id` on every turn keeps a trajectory on one
server (verl's sticky session, for its prefix cache).

One VerlGenerator serves one trajectory: its request id is fixed at construction. Token ids go in
and come out; the text is decoded once here (the rollout engine's one decode of a turn).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Protocol

from rlfactory.protocols import GenRequest, GenResult, generate_all


class ServerManager(Protocol):
    """The part of verl's server manager an agent loop uses."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any: ...


class GenerationAborted(RuntimeError):
    """verl's server returned a turn with stop_reason "aborted" (the request was cancelled)."""


class VerlGenerator:
    """`submit(GenRequest) -> GenResult` through `server_manager.generate`.

    `sampling_params` are verl's (temperature, top_p, top_k, repetition_penalty, logprobs: what
    verl's agent loop worker passes to `run`); they rule sampling, so `GenRequest.sampling` is not
    used. Each turn adds `max_tokens` (the request's `max_new_tokens`), `stop_token_ids` and, when
    the ToolManager has any, `stop` (stop strings): keys both verl servers (vLLM, SGLang) take.
    """

    def __init__(self, server_manager: ServerManager, sampling_params: dict[str, Any], tokenizer: Any,
                 request_id: str | None = None) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.tokenizer = tokenizer
        self.request_id = request_id or uuid.uuid4().hex
        self.wants_logprobs = bool(self.sampling_params.get("logprobs"))
        self.calls = 0
        """generate calls made (the one in flight included)."""
        self.generate_s = 0.0
        self.num_preempted: int | None = None

    async def submit(self, request: GenRequest) -> GenResult:
        """One model turn. The logprobs are the server's; NaN for every token when verl did not ask
        for them (`calculate_log_probs: false`), so that no made-up number passes for one. Raises
        GenerationAborted for an aborted turn, ValueError when asked-for logprobs are missing."""
        params = dict(self.sampling_params)
        params["max_tokens"] = int(request.max_new_tokens)
        stop_ids = [int(i) for i in request.stop_token_ids or ()]
        if stop_ids:
            params["stop_token_ids"] = stop_ids
        if request.stop_strings:
            params["stop"] = list(request.stop_strings)
        t0 = time.perf_counter()
        self.calls += 1
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(request.prompt_ids),
                                                 sampling_params=params)
        seconds = time.perf_counter() - t0
        self.generate_s += seconds
        preempted = getattr(out, "num_preempted", None)
        if preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + int(preempted)
        if getattr(out, "stop_reason", None) == "aborted":
            raise GenerationAborted(f"verl's server aborted request {self.request_id} (turn {self.calls})")
        token_ids = [int(t) for t in out.token_ids]
        log_probs = getattr(out, "log_probs", None)
        if not self.wants_logprobs:
            logprobs = [math.nan] * len(token_ids)
        elif log_probs is None or len(log_probs) != len(token_ids):
            got = "none" if log_probs is None else len(log_probs)
            raise ValueError(f"verl's server returned {got} logprobs for {len(token_ids)} tokens")
        else:
            logprobs = [float(x) for x in log_probs]
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        finish, stop_token = finish_of(token_ids, text, stop_ids, request.stop_strings or (), request.max_new_tokens)
        return GenResult(token_ids, logprobs, finish, text=text, stop_token=stop_token, gen_s=seconds)

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await generate_all(self, requests)


def finish_of(token_ids: list[int], text: str, stop_ids: list[int], stop_strings: Any, max_tokens: int
              ) -> tuple[str, int | None]:
    """(finish_reason, stop token) of a turn, from its tokens: verl reports only "completed".

    A stop token last, or a stop string in the text: "stop". Otherwise, max_tokens tokens:
    "length". Otherwise the server ended the turn early on its own (the model's EOS from its
    generation config, which vLLM and SGLang stop on): "stop" with no stop token.
    """
    if token_ids and token_ids[-1] in stop_ids:
        return "stop", token_ids[-1]
    if any(s and s in text for s in stop_strings):
        return "stop", None
    if len(token_ids) >= max_tokens:
        return "length", None
    return "stop", None
