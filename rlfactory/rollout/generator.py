"""The generator contract: token ids in, sampled token ids and their logprobs out.

A generator serves many trajectories at once. `submit` is called by one trajectory for one model
turn; `generate` is a convenience for a whole batch. Backends: `LocalGenerator` (transformers,
continuous batching, rlfactory/rollout/local.py) and `ServerGenerator` (vLLM / SGLang /
`rlfactory serve` over HTTP, rlfactory/rollout/server_generator.py).

A generator that cannot serve a turn for reasons outside the model (every server down, a server
rejecting the request) raises `GenerationUnavailable`; the rollout engine ends that trajectory
`infra_error` and goes on with the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal, Protocol, Sequence

from rlfactory.config import SamplingConfig

FinishReason = Literal["stop", "length"]


@dataclass
class GenRequest:
    """One model turn to generate: continue `prompt_ids` (the whole context so far)."""

    prompt_ids: list[int]
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_token_ids: Sequence[int] | None = None
    """Token ids that end the turn (kept as the last token); None = the generator's defaults,
    [] = none (only max_new_tokens ends the turn)."""
    stop_strings: Sequence[str] | None = None
    """Strings that end the turn once the decoded new tokens contain one (the token that completes
    it is kept, nothing is cut); None = the generator's defaults."""
    session: str | None = None
    """Shared by the turns of one trajectory: the generator may keep this trajectory's KV cache
    after the turn and reuse it for the next request whose prompt extends the same ids (only
    the new tokens are prefilled). Release it with `forget(session)`."""
    seed: int | None = None
    """Seeds this turn's draws: its j-th token is drawn with `sampling.seeded_uniforms(seed, j)`,
    so the same request samples the same tokens whatever batch it joins (given the same logits).
    None = the generator's own random generator."""
    priority: int = 0
    """Lower is served first. The local generator lets a request join its batch only while no
    request of a lower priority waits or generates (rows already generating are never stopped);
    asynchronous training gives each step's rollout its step number, so the older step, which the
    learner waits for, is not slowed by the next one's turns. Server backends ignore it."""


@dataclass
class GenResult:
    token_ids: list[int]
    """The sampled tokens, in order (a stop token, when one ended the turn, is the last)."""
    logprobs: list[float]
    """log_softmax(logits / T)[token] for each sampled token (see rlfactory/rollout/sampling.py)."""
    finish_reason: FinishReason
    """stop: a stop token or stop string ended the turn; length: max_new_tokens was reached."""
    text: str = ""
    """The decoded tokens (special tokens kept, the stop token included): the one decode of the
    turn. The rollout engine records it on the model segment and parses it (less the stop token's
    text); it never decodes the ids again. Empty only from a generator without a tokenizer, which
    therefore cannot serve the engine."""
    stop_token: int | None = None
    """The stop token id that ended the turn, if one did."""
    queue_s: float = 0.0
    """Seconds from submission until the request entered the batch (its prefill started)."""
    gen_s: float = 0.0
    """Seconds from the start of its prefill to its last token."""
    policy_version: int | None = None
    """The policy version that produced every token of this turn, when the generator knows it
    (a server reports the weights it held); None = the version the caller asked for."""


class GenerationUnavailable(RuntimeError):
    """The generator could not serve this turn for infrastructure reasons (every server down or
    timing out, or a server rejecting the request); the message says which and why."""


class Generator(Protocol):
    async def submit(self, request: GenRequest) -> GenResult:
        """Generate one turn; many calls from many coroutines are served together."""
        ...

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Generate a batch of turns; results in request order."""
        ...


async def generate_all(generator: Generator, requests: list[GenRequest]) -> list[GenResult]:
    """`generate` in terms of `submit`: every request is submitted at once, so they batch together."""
    return list(await asyncio.gather(*(generator.submit(r) for r in requests)))
