"""Trajectory: token in, token out (DESIGN.md "Trajectory").

A trajectory is a list of segments (prompt, model, observation). `input_ids` is their
concatenation and `loss_mask` is 1 exactly on model tokens. Sampled tokens are never decoded and
re-encoded. Serializes to JSON lines losslessly.

These types sit at the bottom of the package graph, beside `rlfactory.config`, and import nothing
of rlfactory's but `rlfactory.images` (the Image type, also at the bottom): the rollout engine builds
trajectories, rewards and envs read them, the trainer learns from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlfactory.images import Image

Role = Literal["prompt", "model", "observation"]
Status = Literal["ok", "truncated", "malformed", "infra_error"]
"""How a trajectory ended (rlfactory/rollout/episode.py says when each one is given)."""
STATUSES: tuple[Status, ...] = ("ok", "truncated", "malformed", "infra_error")


@dataclass
class Segment:
    role: Role
    token_ids: list[int]
    text: str = ""
    logprobs: list[float] | None = None  # model segments: the sampler's logprob of each token
    policy_version: int | None = None  # model segments: the policy that sampled them
    trainer_logprobs: list[float] | None = None  # model segments: the trainer's logprob of each token, before its update
    reward: float | None = None
    """Model segments: this turn's own reward (process reward), the weighted sum of `reward_terms`;
    None = the turn was not scored (outcome-only rewards). Turn-level advantage estimators read it."""
    reward_terms: dict[str, float] | None = None
    """Model segments: this turn's reward terms, raw: `step` (what env.step's results and the tools
    scored, `ToolResult.reward` summed), and each process term of `reward.turn_terms` that applied."""
    images: list[Image] | None = None
    """Prompt and observation segments: the images their pad tokens stand for, in order (None: no
    images). A JSON line holds references (sha256, mime, size); `write_jsonl` stores each image once
    as `images/<sha256>.<ext>` beside the file and `read_jsonl` reads them back."""


@dataclass
class ToolCallRecord:
    name: str
    arguments: Any
    status: str
    latency_s: float
    cached: bool = False
    turn: int = 0
    truncated: bool = False  # the result's text was cut to fit rollout.max_observation_tokens
    error: str | None = None  # for a status other than ok: the start of what the model was shown
    replaced_chars: int = 0  # characters of the result that were not valid Unicode, shown as U+FFFD


@dataclass
class Branch:
    """Where a rollout's history was rewritten (`rollout.context`; DESIGN.md "Branches"): the
    turns from segment `at` on were generated from `prompt_ids` (the rewritten history), not from
    the segments before `at`. A trajectory with branches is trained as its samples
    (`rlfactory.branches.episode_samples`), one per branch plus the first."""

    at: int
    """Index into `Trajectory.segments` of the first segment generated from `prompt_ids`."""
    prompt_ids: list[int]
    prompt_text: str
    first_diff: int
    """The first token where `prompt_ids` differs from the sample before it."""
    reason: str


@dataclass
class Trajectory:
    id: str
    """Unique within one rollout call: `<group>-<k>` for the k-th sample of its group."""
    group: str
    """The group this trajectory belongs to: the n samples of one dataset row in one rollout call
    share it, and no other trajectory of that call does (see RolloutEngine.run). The trainer's
    baselines and the evaluation's per-question figures are taken over it."""
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    turns: int = 0
    status: Status = "ok"
    reward: float | None = None
    reward_terms: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # the dataset row's fields the env keeps
    error: str | None = None  # what went wrong, for infra_error
    metrics: dict[str, float] = field(default_factory=dict)  # timings and counts from the rollout engine
    advantage: float | None = None  # set by the trainer (gae: the mean over the model tokens); None = not trained on
    branches: list[Branch] = field(default_factory=list)
    """Where `rollout.context` rewrote the history the model saw (empty: never, the segments are
    one sequence as sampled). With branches, `input_ids` is the conversation as it happened, not
    what the model saw after a branch; the trainer learns from `episode_samples(trajectory)`."""

    @property
    def input_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [1 if s.role == "model" else 0 for s in self.segments for _ in s.token_ids]

    @property
    def prompt_len(self) -> int:
        return len(self.segments[0].token_ids) if self.segments and self.segments[0].role == "prompt" else 0

    @property
    def sampler_logprobs(self) -> list[float]:
        """Logprob per token of input_ids[prompt_len:] (0.0 on observation tokens)."""
        out: list[float] = []
        for s in self.segments:
            if s.role == "prompt":
                continue
            out.extend(s.logprobs if s.role == "model" and s.logprobs is not None else [0.0] * len(s.token_ids))
        return out

    def turn_segments(self) -> list[Segment]:
        """The model segments in order: turn k (1-based, as `ToolCallRecord.turn`) is element k-1."""
        return [s for s in self.segments if s.role == "model"]

    def turn_rewards(self) -> list[float]:
        """Each model turn's own reward (0.0 for a turn that was not scored)."""
        return [s.reward if s.reward is not None else 0.0 for s in self.turn_segments()]

    def model_text(self) -> str:
        return "".join(s.text for s in self.segments if s.role == "model")

    def completion_text(self) -> str:
        """Everything after the prompt, as text (model and observation turns)."""
        return "".join(s.text for s in self.segments if s.role != "prompt")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for seg, out in zip(self.segments, d["segments"]):
            if seg.images is None:
                del out["images"]  # lines without images stay as they were
            else:
                out["images"] = [im.ref() for im in seg.images]
        if not self.branches:
            del d["branches"]  # an unbranched trajectory's line stays as it was
        return d

    def images(self) -> list[Image]:
        """Every image of every segment, in order."""
        return [im for s in self.segments for im in s.images or ()]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["segments"] = [_segment(s) for s in d.get("segments", [])]
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        d["branches"] = [Branch(**b) for b in d.get("branches", [])]
        return cls(**d)

    def to_json(self) -> str:
        """One JSON line. Readable UTF-8, except when some string is not valid Unicode (a lone
        surrogate in a row's info or a call's arguments, which no UTF-8 writer accepts): then the
        whole line escapes non-ASCII as `\\uXXXX`, which reads back to the same strings."""
        line = json.dumps(self.to_dict(), ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(self.to_dict())
        return line

    @classmethod
    def from_json(cls, line: str) -> "Trajectory":
        return cls.from_dict(json.loads(line))


def _segment(d: dict[str, Any]) -> Segment:
    if d.get("images") is not None:
        d = {**d, "images": [Image.from_ref(r) for r in d["images"]]}
    return Segment(**d)


def image_dir(path) -> Path:
    """Where the images of the trajectories in the JSON-lines file `path` are stored."""
    return Path(path).parent / "images"


def write_jsonl(path, trajectories: list[Trajectory], mode: str = "a") -> None:
    """Append trajectories as JSON lines; each line is written whole and flushed, after the images
    it references (each stored once, under `image_dir(path)`)."""
    for im in {im.sha256: im for t in trajectories for im in t.images()}.values():
        im.save(image_dir(path))
    with open(path, mode, encoding="utf-8") as f:
        f.write("".join(t.to_json() + "\n" for t in trajectories))
        f.flush()


def read_jsonl(path) -> list[Trajectory]:
    """The trajectories of a JSON-lines file, their images read back from `image_dir(path)`
    (an `rlfactory.images.ImageError` names an image file that is missing or altered)."""
    with open(path, encoding="utf-8") as f:
        trajectories = [Trajectory.from_json(line) for line in f if line.strip()]
    for t in trajectories:
        for s in t.segments:
            if s.images:
                s.images = [im.resolve(image_dir(path)) for im in s.images]
    return trajectories
