"""What changed between two steps for the same prompt: its group at step A beside its group at B.

The prompt is matched by its prompt segment's token ids (what the policy saw), not by the group
name: a group is named after its dataset row's `id`, or after its place in the batch when rows
have none, so the same name at two steps need not be the same prompt. Each side gives the group's
statistics and every member's summary and transcript (the segments after the prompt), so the
page can set the group's answers at step A beside those at step B.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from rlfactory.studio.steps import StepIndex

TRANSCRIPT_CHARS = 4000  # per segment shown; the trajectory viewer has the whole of it
PROMPT_CHARS = 1200


@dataclass
class PromptGroup:
    key: str  # a hash of the prompt's token ids
    group: str
    prompt: str  # the prompt's text (its tail, when long)
    question: str | None
    indices: list[int]


@dataclass
class Side:
    step: int
    group: str
    stats: dict[str, Any]
    members: list[dict[str, Any]]


def _key(record: dict[str, Any]) -> tuple[str, str]:
    prompt = next((s for s in record.get("segments") or [] if s.get("role") == "prompt"), {})
    ids = prompt.get("token_ids") or []
    digest = hashlib.sha1(",".join(map(str, ids)).encode() if ids else str(prompt.get("text", "")).encode())
    return digest.hexdigest()[:16], str(prompt.get("text", ""))


class PromptIndex:
    """Each step file's groups keyed by prompt; cached like StepCache (per file size and mtime)."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._items: "OrderedDict[tuple[str, int, float], dict[str, PromptGroup]]" = OrderedDict()
        self._lock = threading.Lock()

    def groups(self, index: StepIndex) -> dict[str, PromptGroup]:
        st = index.path.stat()
        ident = (str(index.path), st.st_size, st.st_mtime)
        with self._lock:
            hit = self._items.get(ident)
            if hit is not None:
                self._items.move_to_end(ident)
                return hit
        out: dict[str, PromptGroup] = {}
        for s in index.summaries:
            record = index.read(s.index)
            key, text = _key(record)
            found = out.get(key)
            if found is None:
                info = record.get("info") or {}
                question = info.get("question") if isinstance(info.get("question"), str) else None
                out[key] = PromptGroup(key, s.group, text[-PROMPT_CHARS:], question, [s.index])
            else:
                found.indices.append(s.index)
        with self._lock:
            self._items[ident] = out
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _side(index: StepIndex, step: int, group: PromptGroup) -> Side:
    members = []
    for i in group.indices:
        record = index.read(i)
        summary = asdict(index.summaries[i])
        summary["transcript"] = [{"role": s.get("role"), "text": str(s.get("text", ""))[:TRANSCRIPT_CHARS],
                                  "cut": len(str(s.get("text", ""))) > TRANSCRIPT_CHARS}
                                 for s in record.get("segments") or [] if s.get("role") != "prompt"]
        members.append(summary)
    rewards = [m["reward"] for m in members if isinstance(m["reward"], (int, float))]
    statuses: dict[str, int] = {}
    for m in members:
        statuses[m["status"]] = statuses.get(m["status"], 0) + 1
    stats = {
        "trajectories": len(members), "reward_mean": _mean(rewards),
        "reward_min": min(rewards) if rewards else None, "reward_max": max(rewards) if rewards else None,
        "ok": statuses.get("ok", 0) / len(members) if members else None, "statuses": statuses,
        "turns_mean": _mean([m["turns"] for m in members]), "tool_calls_mean": _mean([m["tool_calls"] for m in members]),
        "tool_errors": sum(m["tool_errors"] for m in members),
        "model_tokens_mean": _mean([m["model_tokens"] for m in members]),
    }
    return Side(step, group.group, stats, members)


def what_changed(prompts: PromptIndex, a: StepIndex, step_a: int, b: StepIndex, step_b: int,
                 key: str | None = None) -> dict[str, Any]:
    """The prompts rolled out at both steps (in step A's order), and for `key` (default: the
    first of them) its group at each step side by side."""
    ga, gb = prompts.groups(a), prompts.groups(b)
    common = [k for k in ga if k in gb]
    listed = []
    for k in common:
        ra = [a.summaries[i].reward for i in ga[k].indices if a.summaries[i].reward is not None]
        rb = [b.summaries[i].reward for i in gb[k].indices if b.summaries[i].reward is not None]
        listed.append({"key": k, "group_a": ga[k].group, "group_b": gb[k].group,
                       "label": (ga[k].question or ga[k].prompt[-120:]).strip(),
                       "reward_a": _mean(ra), "reward_b": _mean(rb)})
    if key is not None and key not in common:
        raise KeyError(f"prompt {key} was not rolled out at both step {step_a} and step {step_b}")
    picked = None
    chosen = key or (common[0] if common else None)
    if chosen is not None:
        picked = {"key": chosen, "prompt": ga[chosen].prompt, "question": ga[chosen].question,
                  "a": asdict(_side(a, step_a, ga[chosen])), "b": asdict(_side(b, step_b, gb[chosen]))}
    return {"a": step_a, "b": step_b, "common": listed, "only_a": len(ga) - len(common),
            "only_b": len(gb) - len(common), "picked": picked}
