"""A stand-in for verl's LLM server manager, served by a real model, for the adapter's tests.

`TinyVerlServer.generate` has the signature of verl's `LLMServerClient.generate`, verl 0.9.1
(PyPI wheel verl-0.9.1-py3-none-any.whl, verl/workers/rollout/llm_server.py):

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> TokenOutput:

(verl commit b178a3cd56f58b2d502255daba591e92833930a7, 0.8.0.dev, has the same method on
`AsyncLLMServerManager` without audio_data / mm_processor_kwargs / **kwargs.) Its TokenOutput
(verl/workers/rollout/replica.py) has token_ids, log_probs (None unless sampling_params["logprobs"]),
stop_reason ("completed" | "aborted" | None), num_preempted, extra_fields. Like verl's vLLM server,
it reads max_tokens, stop_token_ids, stop, temperature, top_p, top_k (-1 = off) and logprobs.

Behind it: rlfactory's LocalGenerator on the tiny Qwen3 model, steered by ScriptedPolicy so that
the untrained model makes calculator tool calls (task N adds N and the turn number for N % 3
turns, then answers). Every returned turn is recorded in `calls`. Used by the tests in this folder
and by the real-verl check (verl_check.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan


@dataclass
class TokenOutput:
    """verl's TokenOutput fields (verl/workers/rollout/replica.py), used when verl is not installed."""

    token_ids: list[int]
    log_probs: Optional[list[float]] = None
    routed_experts: Any = None
    stop_reason: Optional[str] = None
    num_preempted: Optional[int] = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServedTurn:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    sampling_params: dict[str, Any]


def calculator_plan(ctx: str) -> TurnPlan:
    """Task N: `add(a=N, b=turn)` for N % 3 turns, then an answer."""
    n = int(re.search(r"Task (\d+)", ctx).group(1))
    turn = ctx.count("<tool_response>")
    if turn < n % 3:
        call = f'{{"name": "add", "arguments": {{"a": {n}, "b": {turn}}}}}'
        return TurnPlan(free=2 + (n + turn) % 3, forced=f"\n<tool_call>\n{call}\n</tool_call>")
    return TurnPlan(free=3, forced=f" The answer is {n}.")


class TinyVerlServer:
    """verl's server manager, served by `model` (see the module doc)."""

    def __init__(self, model: Any, tokenizer: Any, token_output: type = TokenOutput, seed: int = 0) -> None:
        policy = ScriptedPolicy(tokenizer, calculator_plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.generator = LocalGenerator(model, tokenizer.pad_token_id or 0, (), tokenizer=tokenizer,
                                        logits_processor=policy, seed=seed)
        self.token_output = token_output
        self.calls: list[ServedTurn] = []

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ):
        params = dict(sampling_params)
        top_k = int(params.get("top_k", -1))
        sampling = SamplingConfig(temperature=float(params.get("temperature", 1.0)),
                                  top_p=float(params.get("top_p", 1.0)), top_k=max(top_k, 0))
        request = GenRequest(list(prompt_ids), int(params["max_tokens"]), sampling,
                             list(params.get("stop_token_ids", [])), list(params.get("stop", [])))
        result = await self.generator.submit(request)
        self.calls.append(ServedTurn(str(request_id), list(prompt_ids), list(result.token_ids),
                                     list(result.logprobs), params))
        log_probs = list(result.logprobs) if params.get("logprobs") else None
        return self.token_output(token_ids=list(result.token_ids), log_probs=log_probs, stop_reason="completed",
                                 num_preempted=0)

    def close(self) -> None:
        self.generator.close()
