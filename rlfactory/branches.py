"""Branches: one episode as several samples when its history was rewritten (DESIGN.md "Branches").

Two producers share these helpers: the recording gateway (serve/gateway_record.py), whose agents
rewrite their own messages, and rlfactory's own rollouts under `rollout.context`
(rollout/context.py), which rewrite the history on purpose. Either way, a prompt that extends the
current sample's ids token for token continues it; one that does not starts a new sample, whose
prompt segment holds the rewritten history (loss mask 0), so every sampled token is trained in
exactly one sample and none is re-encoded where it is trained. `branch_reason` says why a branch
started (the first differing token, in both texts); `episode_samples` turns a rollout's
trajectory with `Trajectory.branches` into those samples, all sharing the episode's reward,
status and advantage (train/episodes.py counts the episode once in its group's baseline).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from rlfactory.trajectory import Segment, Trajectory


def first_difference(a: list[int], b: list[int]) -> int:
    """The first index where `a` and `b` differ (the shorter length when one is a prefix)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def extends(prompt: list[int], ids: list[int]) -> bool:
    """Whether `prompt` continues `ids` token for token (equal counts)."""
    return len(ids) <= len(prompt) and prompt[: len(ids)] == ids


def branch_reason(ids: list[int], prompt: list[int], decode: Callable[[list[int]], str],
                  name: str = "the sample") -> tuple[int, str]:
    """(first differing token, why) for a `prompt` that does not extend `ids` (`name` says whose)."""
    diff = first_difference(ids, prompt)
    if diff == len(prompt):
        return diff, (f"the prompt ({len(prompt)} tokens) is shorter than {name} ({len(ids)} tokens) "
                      "and ends inside it")
    was, now = decode(ids[diff: diff + 8]), decode(prompt[diff: diff + 8])
    return diff, f"history rewritten: at token {diff} {name} has {was!r}, the prompt has {now!r}"


def episode_samples(traj: Trajectory) -> list[Trajectory]:
    """`traj` as the samples its branches make ([traj] when it has none).

    Sample 0 is the prompt and the turns before the first branch; sample k its branch's prompt
    and the turns generated from it. Trailing observations of a sample (the tool results that
    were rewritten into the next sample's prompt) are left out: nothing was generated from them
    there. Each sample shares the episode's status, reward, reward terms, error and metrics; its
    tool calls are those of its own turns (numbered from 1 in the sample); ids are `traj.id` and
    `<traj.id>.<k>`; `info` gains `episode` (traj.id), `sample`, `samples` and `branch`
    (from_sample, first_diff, reason), as the gateway's samples carry them."""
    if not traj.branches:
        return [traj]
    starts = [1] + [b.at for b in traj.branches]
    ends = [b.at for b in traj.branches] + [len(traj.segments)]
    prompts = [traj.segments[0]] + [Segment("prompt", list(b.prompt_ids), b.prompt_text) for b in traj.branches]
    out: list[Trajectory] = []
    turns_before = 0
    for k, (start, end, prompt) in enumerate(zip(starts, ends, prompts)):
        segments = traj.segments[start:end]
        while segments and segments[-1].role != "model":
            segments = segments[:-1]
        turns = sum(1 for s in segments if s.role == "model")
        calls = [replace(c, turn=c.turn - turns_before) for c in traj.tool_calls
                 if turns_before < c.turn <= turns_before + turns]
        branch: dict[str, Any] | None = None
        if k:
            b = traj.branches[k - 1]
            branch = {"from_sample": k - 1, "first_diff": b.first_diff, "reason": b.reason}
        info = {**traj.info, "episode": traj.id, "sample": k, "samples": len(starts), "branch": branch}
        out.append(Trajectory(traj.id + (f".{k}" if k else ""), traj.group, [prompt, *segments], calls, turns,
                              traj.status, traj.reward, dict(traj.reward_terms), info, traj.error,
                              dict(traj.metrics), traj.advantage))
        turns_before += turns
    return out


def all_samples(trajs: list[Trajectory]) -> list[Trajectory]:
    """Every trajectory's samples, in order (the list itself when none has branches)."""
    if not any(t.branches for t in trajs):
        return trajs
    return [s for t in trajs for s in episode_samples(t)]
