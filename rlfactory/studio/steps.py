"""One step's trajectories (trajectories/step_NNNNNN.jsonl): summaries, filters, one trajectory.

`StepIndex` parses a step file once and keeps a small summary per trajectory plus the byte span
of its line; it is cached per (file, size, mtime), so filtering and opening trajectories re-read
only the one line needed. The viewer's token rows are built by `trajectory_view`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlfactory.studio.tokens import TokenText

PREVIEW_CHARS = 160


@dataclass
class TrajSummary:
    index: int
    id: str
    group: str
    status: str
    reward: float | None
    advantage: float | None
    reward_terms: dict[str, float]
    turns: int
    tool_calls: int
    tool_errors: int
    tokens: int
    model_tokens: int
    answer_preview: str
    error: str | None


@dataclass
class StepIndex:
    path: Path
    summaries: list[TrajSummary]
    spans: list[tuple[int, int]]  # byte offset and length of each trajectory's line
    texts: list[str]  # lower-cased text of every segment, for search

    def groups(self, keep: list[int] | None = None) -> list[dict[str, Any]]:
        """Groups in file order, each with its members' summaries (only `keep` indices if given)."""
        wanted = set(range(len(self.summaries))) if keep is None else set(keep)
        out: "OrderedDict[str, list[dict[str, Any]]]" = OrderedDict()
        for s in self.summaries:
            if s.index in wanted:
                out.setdefault(s.group, []).append(asdict(s))
        return [{"group": g, "members": m} for g, m in out.items()]

    def filter(self, status: str | None = None, min_reward: float | None = None, max_reward: float | None = None,
               tool_errors: bool = False, text: str | None = None) -> list[int]:
        """Indices of the trajectories that pass every given condition."""
        needle = (text or "").strip().lower()
        keep = []
        for s in self.summaries:
            if status and s.status != status:
                continue
            if min_reward is not None and (s.reward is None or s.reward < min_reward):
                continue
            if max_reward is not None and (s.reward is None or s.reward > max_reward):
                continue
            if tool_errors and not s.tool_errors:
                continue
            if needle and needle not in self.texts[s.index]:
                continue
            keep.append(s.index)
        return keep

    def read(self, index: int) -> dict[str, Any]:
        """The full JSON record of trajectory `index`."""
        if not 0 <= index < len(self.spans):
            raise IndexError(f"no trajectory {index} in {self.path.name} (it has {len(self.spans)})")
        start, length = self.spans[index]
        with open(self.path, "rb") as f:
            f.seek(start)
            return json.loads(f.read(length))


def preview_tail(text: str, limit: int = PREVIEW_CHARS) -> str:
    """The end of `text` in at most `limit` characters, starting at a word ("… " marks the cut),
    so a card never opens mid-word."""
    text = text.strip()
    if len(text) <= limit:
        return text
    tail = text[-(limit - 2):]
    if not text[-(limit - 2) - 1].isspace():  # the cut fell inside a word: start at the next one
        i = next((i for i, c in enumerate(tail) if c.isspace()), None)
        if i is not None and tail[i:].strip():
            tail = tail[i:]
    return "… " + tail.lstrip()


def _summary(i: int, d: dict[str, Any]) -> tuple[TrajSummary, str]:
    segs = d.get("segments") or []
    calls = d.get("tool_calls") or []
    model_text = "".join(s.get("text", "") for s in segs if s.get("role") == "model")
    tail = preview_tail(model_text)
    summary = TrajSummary(
        index=i, id=str(d.get("id", i)), group=str(d.get("group", "")), status=str(d.get("status", "?")),
        reward=d.get("reward"), advantage=d.get("advantage"), reward_terms=dict(d.get("reward_terms") or {}),
        turns=int(d.get("turns", 0) or 0), tool_calls=len(calls),
        tool_errors=sum(1 for c in calls if c.get("status") != "ok"),
        tokens=sum(len(s.get("token_ids") or []) for s in segs),
        model_tokens=sum(len(s.get("token_ids") or []) for s in segs if s.get("role") == "model"),
        answer_preview=tail, error=d.get("error"),
    )
    text = "\n".join(s.get("text", "") for s in segs).lower()
    return summary, text


def build_index(path: Path) -> StepIndex:
    data = path.read_bytes()
    summaries, spans, texts = [], [], []
    pos = 0
    for line in data.split(b"\n"):
        n = len(line)
        if line.strip():
            try:
                d = json.loads(line)
            except ValueError:
                d = None  # a torn last line while the step is being written
            if isinstance(d, dict):
                s, text = _summary(len(summaries), d)
                summaries.append(s)
                spans.append((pos, n))
                texts.append(text)
        pos += n + 1
    return StepIndex(path, summaries, spans, texts)


class StepCache:
    """StepIndex per step file, rebuilt when the file changes; the most recent `size` kept."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._items: "OrderedDict[str, tuple[tuple[int, float], StepIndex]]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> StepIndex:
        st = path.stat()
        key, ident = str(path), (st.st_size, st.st_mtime)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0] == ident:
                self._items.move_to_end(key)
                return hit[1]
        index = build_index(path)
        with self._lock:
            self._items[key] = (ident, index)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return index


def step_path(run: Path, step: int) -> Path:
    p = run / "trajectories" / f"step_{int(step):06d}.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"no trajectories logged for step {step}")
    return p


def trajectory_view(d: dict[str, Any], tokens: TokenText | None) -> dict[str, Any]:
    """A trajectory for the viewer: each segment with one row per token
    [id, text, sampler logprob, trainer logprob] (logprobs null where there are none), a model
    turn's own reward and reward terms (null where the turn was not scored), and the references
    (sha256, mime, width, height) of the images its pads stand for ([] for none)."""
    segments = []
    for seg in d.get("segments") or []:
        ids = seg.get("token_ids") or []
        lps = seg.get("logprobs") or []
        tlps = seg.get("trainer_logprobs") or []
        rows = []
        for j, tid in enumerate(ids):
            text = tokens.text(tid) if tokens is not None else None
            rows.append([tid, text, lps[j] if j < len(lps) else None, tlps[j] if j < len(tlps) else None])
        segments.append({"role": seg.get("role"), "text": seg.get("text", ""), "policy_version": seg.get("policy_version"),
                         "tokens": rows, "reward": seg.get("reward"), "reward_terms": seg.get("reward_terms"),
                         "images": list(seg.get("images") or [])})
    out = {k: v for k, v in d.items() if k != "segments"}
    out["segments"] = segments
    out["decoded"] = tokens is not None
    return out
