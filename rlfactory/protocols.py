"""Protocols at the bottom of the house: what one layer offers another, named here instead of `Any`.

`Generator`: token ids in, sampled token ids and their logprobs out (`GenRequest` -> `GenResult`).
A generator serves many trajectories at once: `submit` is called by one trajectory for one model
turn, `generate` is a convenience for a whole batch. Backends: `LocalGenerator` (transformers,
continuous batching, rlfactory/generation/local.py), `ServerGenerator` (vLLM / SGLang / `rlfactory
serve` over HTTP, rlfactory/generation/server_generator.py), `VersionedGenerator` (a policy version
around either) and verl's. What a generator may offer besides is a Protocol of its own, checked
with `isinstance`: `KeepsSessions` (`forget`), `Reseedable` (`reseed`), `FreesCache`
(`free_cache`), `HasTokenizer` (`tokenizer`), `Closeable` (`close`). A generator that cannot serve
a turn for reasons outside the model (every server down, a server rejecting the request) raises
`GenerationUnavailable`; the rollout engine ends that trajectory `infra_error` and goes on with
the others.

`WeightSync`: gives the generators each new policy version. The learner owns the weights; after an
update the training step calls `ensure(policy, version)` and logs the metrics it returns. Three
implement it: `rlfactory.train.weight_sync.ServerWeightSync` (generation servers, over HTTP, disk
or NCCL), `rlfactory.distributed.weights.RayWeightSync` (Ray rollout workers, through the object
store) and `rlfactory.train.async_pipeline.LocalWeightSync` (the local generator's copy of the
policy in asynchronous training). Every one logs its time as `WEIGHT_SYNC_SECONDS` and, where it
moves bytes, their size as `WEIGHT_SYNC_MB`.

`Rollouts` and `Session`: what the training step and evaluation ask of a rollout engine (`run`:
n trajectories per dataset row) and of an opened rollout session (its engine, generator, policy
and tokenizer). `rlfactory.train.session.RolloutSession` (in process, also the gateway's agent
sessions) and `rlfactory.distributed.session.RaySession` (Ray workers) are sessions; what an
engine or a session may offer besides is again a Protocol: `SwapsGenerator` (`with_generator`),
`HasWeightSync` (a session that pushes weights its own way).

`Tool` and what a tool may offer besides are in rlfactory/tools/base.py, beside the call and
result types they speak (the tools package imports only this bottom, so every layer may name
them); `Env` is in rlfactory/envs/base.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence, runtime_checkable

from rlfactory.config import SamplingConfig
from rlfactory.trajectory import Trajectory

if TYPE_CHECKING:
    from torch import nn

    from rlfactory.images import Image
    from transformers import PreTrainedTokenizerBase

WEIGHT_SYNC_SECONDS = "weight_sync/seconds"
"""Seconds one push took in the training step (for a push that finishes later, its start)."""
WEIGHT_SYNC_PREPARE_S = "weight_sync/prepare_s"
"""Seconds spent building what is sent (serialising, writing a checkpoint folder)."""
WEIGHT_SYNC_MB = "weight_sync/mb"
"""Megabytes of weights one push moved."""
WEIGHT_SYNC_OK = "weight_sync/ok"
"""Generation servers that took the new weights."""
WEIGHT_SYNC_FAILED = "weight_sync/failed"
"""Generation servers that did not (they get no turns until a later push succeeds)."""


@runtime_checkable
class WeightSync(Protocol):
    """Gives every generator the learner's weights as a policy version."""

    async def ensure(self, policy: "nn.Module", version: int) -> dict[str, float]:
        """Make sure the generators hold `version` (push it unless they already do); returns the
        push's metrics, or {} when nothing was pushed."""
        ...

    async def push(self, policy: "nn.Module", version: int) -> dict[str, float]:
        """Send `policy`'s weights as `version` to the generators; returns metrics."""
        ...


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
    images: Sequence[Image] | None = None
    """The images that the image pads of `prompt_ids` stand for, in order: a vision-language
    model's whole context so far (every turn's images). The local generator encodes each in the
    prefill of the turn that brings it. None = no images."""


@dataclass
class GenResult:
    token_ids: list[int]
    """The sampled tokens, in order (a stop token, when one ended the turn, is the last)."""
    logprobs: list[float]
    """log_softmax(logits / T)[token] for each sampled token (see rlfactory/generation/sampling.py)."""
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


@runtime_checkable
class KeepsSessions(Protocol):
    """A generator that keeps something per trajectory between its turns (`GenRequest.session`:
    a KV cache, a pinned server)."""

    def forget(self, session: str | None = None) -> None:
        """Drop what is kept for `session` (None: for every session)."""
        ...


@runtime_checkable
class Reseedable(Protocol):
    """A generator whose own random draws (those of requests without `GenRequest.seed`) can be
    reseeded; the trainer reseeds it every step for reproducible draws."""

    def reseed(self, seed: int) -> None:
        ...


@runtime_checkable
class FreesCache(Protocol):
    """A generator that keeps buffers between rollouts and can free them when the memory is
    needed elsewhere (before a training step)."""

    def free_cache(self) -> None:
        ...


@runtime_checkable
class HasTokenizer(Protocol):
    """A generator that decodes its own turns (`GenResult.text`, stop strings) with `tokenizer`; the
    rollout engine and the versioned gate use it when they are given none."""

    tokenizer: PreTrainedTokenizerBase | None


@runtime_checkable
class Closeable(Protocol):
    """A generator that holds a thread or connections until `close()`."""

    def close(self) -> None:
        ...


class Rollouts(Protocol):
    """A rollout engine: `rlfactory.rollout.engine.RolloutEngine` (in process),
    `rlfactory.distributed.engine.RayRolloutEngine` (on Ray workers) and
    `rlfactory.train.gateway_agents.AgentEngine` (a user's agent through the gateway)."""

    sampling: SamplingConfig
    """How it samples; evaluation swaps in a greedy copy for its duration."""

    async def run(self, rows: list[dict[str, Any]], n: int, policy_version: int = 0, *,
                  seeds: Sequence[int] | None = None, priority: int = 0) -> list[Trajectory]:
        """`n` trajectories per row, row-major, each group one row's; unscored (`reward` None).
        `seeds`: one per row (reproducible draws); `priority`: see `GenRequest.priority`."""
        ...


@runtime_checkable
class SwapsGenerator(Protocol):
    """An engine that can roll out with another generator, everything else shared (asynchronous
    training's copy of the policy)."""

    def with_generator(self, generator: Generator) -> Rollouts:
        ...


class Session(Protocol):
    """An opened rollout session, as the trainer uses it."""

    engine: Rollouts
    generator: Generator
    """The session's own generator (reseeded each step, its cache freed before an update)."""
    model: nn.Module | None
    """The policy (the learner's copy; None when not loaded)."""
    tokenizer: PreTrainedTokenizerBase
    tool_manager: object
    """The family's ToolManager; the trainer asks only whether it turns images into pixels."""


@runtime_checkable
class HasWeightSync(Protocol):
    """A session that brings its own way to push weights (Ray rollout workers: the object store);
    None = the generator's default (generation servers: rlfactory.train.weight_sync)."""

    weight_sync: WeightSync | None
