"""Recording an episode's calls into samples (DESIGN.md "Branches").

An episode is every call made with one episode key. Each call's prompt ids (what the family's chat
template renders for the agent's messages) are matched against the samples recorded so far:

- when they extend a sample's ids (its prompt, model turns and observations so far) token for
  token, the call continues that sample: the extra ids are an observation segment (loss mask 0)
  and the sampled turn a model segment, its ids and logprobs exactly as sampled;
- otherwise the agent rewrote its history (summarised, dropped thinking, slid a window, or
  re-rendered a turn differently from what was sampled), and a new sample of the episode starts,
  with the whole prompt as its prompt segment; `branch` records from which sample, the first
  differing token and why.

A call whose sample was extended by another call while it generated (parallel calls from one
state), and choices 2..n of an `n > 1` call, also start new samples: their prompt segment is the
state they continued from, so every sampled token is trained in exactly one sample.

Every sample of an episode shares its reward and status (`Episode.trajectories`). The matching
helpers are rlfactory/branches.py's, which rlfactory's own rollouts share (`rollout.context`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlfactory.protocols import GenResult
from rlfactory.branches import branch_reason, extends
from rlfactory.tools.base import ToolCall
from rlfactory.trajectory import Segment, Status, ToolCallRecord, Trajectory

BY_AGENT = "by_agent"
"""The status of a tool call the model asked for through the gateway: the agent ran it, so its
outcome is the agent's business and not known here."""


@dataclass
class Sample:
    segments: list[Segment]
    branch: dict[str, Any] | None = None
    """Why this sample started (None for the first): `from_sample`, `first_diff` (token index),
    `reason`."""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    turns: int = 0

    @property
    def ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]


@dataclass
class Match:
    """Where a call's prompt continues: sample `index` at its state of `n_segments` segments
    (`ids_len` tokens); index None = no sample (a new one starts, `branch` says why)."""

    index: int | None
    n_segments: int = 0
    ids_len: int = 0
    branch: dict[str, Any] | None = None


class Episode:
    """The samples of one episode (one key), built call by call."""

    def __init__(self, key: str, decode: Callable[[list[int]], str], info: dict[str, Any] | None = None,
                 seed: int | None = None, generator: Any = None) -> None:
        self.key = key
        self.decode = decode
        self.generator = generator
        """The generator this episode's calls use (None: the gateway's)."""
        self.info = dict(info or {})
        self.seed = seed
        self.samples: list[Sample] = []
        self.calls = 0
        self.overhead_s = 0.0
        """Seconds the gateway spent on this episode's calls outside generation (render, parse, record)."""
        self.gen_s = 0.0
        self.started = time.perf_counter()
        self.closed = False
        self.prompt_text: Any = None
        """The last call's prompt as text with its ids (a gateway_prefix.KnownText): the next call
        encodes only what follows the part of it that they share."""
        self._last: int | None = None  # the sample the last call continued or started

    def match(self, prompt: list[int]) -> Match:
        """Which sample `prompt` continues (the longest whose ids it extends), or why none."""
        best: Match | None = None
        for i, s in enumerate(self.samples):
            ids = s.ids
            if extends(prompt, ids) and (best is None or len(ids) > best.ids_len):
                best = Match(i, len(s.segments), len(ids))
        if best is not None:
            return best
        if not self.samples:
            return Match(None)
        ref = self._last if self._last is not None else len(self.samples) - 1
        diff, reason = branch_reason(self.samples[ref].ids, prompt, self.decode, f"sample {ref}")
        return Match(None, branch={"from_sample": ref, "first_diff": diff, "reason": reason})

    def record(self, match: Match, prompt: list[int], results: list[GenResult], version: int,
               calls: list[list[ToolCall]]) -> list[int]:
        """Record the turns sampled for `prompt` (one per choice) where `match` says; returns the
        sample index of each. `calls[i]`: the tool calls choice i asked for."""
        out = []
        for k, result in enumerate(results):
            target = self._target(match, prompt, k)
            sample = self.samples[target]
            base = sample.ids
            if len(prompt) > len(base):
                delta = prompt[len(base):]
                sample.segments.append(Segment("observation", delta, self.decode(delta)))
            sample.turns += 1
            sample.segments.append(Segment("model", list(result.token_ids), result.text, list(result.logprobs),
                                           version if result.policy_version is None else result.policy_version))
            sample.tool_calls.extend(ToolCallRecord(c.name, c.arguments, BY_AGENT, 0.0, turn=sample.turns)
                                     for c in calls[k])
            out.append(target)
        self.calls += 1
        self._last = out[0] if out else self._last
        return out

    def _target(self, match: Match, prompt: list[int], choice: int) -> int:
        """The sample choice `choice` of a call goes on: the matched one when it is unchanged since
        the call matched it (choice 0 only), else a new sample."""
        if match.index is None:
            branch = match.branch if choice == 0 else {"from_sample": None, "first_diff": None,
                                                       "reason": f"choice {choice} of an n > 1 call"}
            self.samples.append(Sample([Segment("prompt", list(prompt), self.decode(prompt))], branch))
            return len(self.samples) - 1
        sample = self.samples[match.index]
        if choice == 0 and len(sample.segments) == match.n_segments:
            return match.index
        why = (f"choice {choice} of an n > 1 call" if choice else
               f"sample {match.index} was continued by another call while this one generated")
        # the state it continued from is context here, its model tokens trained in sample match.index only
        context = [t for s in sample.segments[: match.n_segments] for t in s.token_ids]
        self.samples.append(Sample([Segment("prompt", context, self.decode(context))],
                                   {"from_sample": match.index, "first_diff": match.ids_len, "reason": why}))
        return len(self.samples) - 1

    def trajectories(self, group: str, index: int, status: Status, reward: float | None,
                     error: str | None = None, reward_terms: dict[str, float] | None = None) -> list[Trajectory]:
        """One trajectory per sample: ids `<group>-<index>` for sample 0 and `<group>-<index>.<s>`
        for the others; each carries the episode's status, reward and error, and in `info` the
        episode key, its sample index, the episode's sample count and the sample's `branch`."""
        wall = time.perf_counter() - self.started
        metrics = {"gateway_calls": float(self.calls), "gateway_overhead_s": self.overhead_s,
                   "gen_s": self.gen_s, "wall_s": wall, "samples": float(len(self.samples))}
        if not self.samples:
            return [Trajectory(f"{group}-{index}", group, status="infra_error",
                               info={**self.info, "episode": self.key, "sample": 0, "samples": 0},
                               error=error or "the agent made no model call through the gateway", metrics=metrics)]
        out = []
        for s, sample in enumerate(self.samples):
            info = {**self.info, "episode": self.key, "sample": s, "samples": len(self.samples),
                    "branch": sample.branch}
            out.append(Trajectory(f"{group}-{index}" + (f".{s}" if s else ""), group, sample.segments,
                                  sample.tool_calls, sample.turns, status, reward, dict(reward_terms or {}), info,
                                  error, dict(metrics)))
        return out
