"""Per-step metrics computed from scored trajectories and tensors (plain floats out)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import torch

from rlfactory.train.signal import step_signal
from rlfactory.trajectory import STATUSES, Trajectory

# Reward terms that mean "the answer is right", in order of preference.
ACCURACY_TERMS = ("accuracy", "correct", "correctness", "exact_match", "numeric", "verify", "substring_match", "em")


def accuracy_of(traj: Trajectory) -> float | None:
    """1.0/0.0: is the trajectory's answer right? Read from the first correctness-like reward term
    (see ACCURACY_TERMS: value >= 1 counts as right); without one, reward > 0 counts as right.
    None for an unscored trajectory."""
    if traj.reward is None:
        return None
    for name in ACCURACY_TERMS:
        if name in traj.reward_terms:
            return float(traj.reward_terms[name] >= 1.0 - 1e-9)
    return float(traj.reward > 0)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def trajectory_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """reward/mean, reward/std, reward/<term>, turn_reward/*, accuracy, traj/* and status/* over a
    step's batch.

    Rewards and accuracy are over scored trajectories only (infra_error ones are not scored).
    Rewards, accuracy and status/* count an episode of several samples (gateway_record.py,
    rlfactory/branches.py) once, through its first sample: its samples share its reward and status.
    """
    # the samples after an episode's first share its reward and status: counted once
    episodes = [t for t in trajs if t.info.get("sample", 0) == 0]
    scored = [t for t in episodes if t.reward is not None]
    rewards = [float(t.reward) for t in scored]
    out: dict[str, float] = {"reward/mean": _mean(rewards), "reward/std": _std(rewards)}
    terms = sorted({k for t in scored for k in t.reward_terms})
    for k in terms:
        out[f"reward/{k}"] = _mean([t.reward_terms[k] for t in scored if k in t.reward_terms])
    out.update(turn_reward_metrics([t for t in trajs if t.reward is not None]))  # every sample's own turns
    accs = [a for t in scored if (a := accuracy_of(t)) is not None]
    out["accuracy"] = _mean(accs)
    out["traj/tool_calls"] = _mean([len(t.tool_calls) for t in trajs])
    out["traj/turns"] = _mean([t.turns for t in trajs])
    out["traj/tokens"] = _mean([len(t.input_ids) for t in trajs])
    out["traj/model_tokens"] = _mean([sum(t.loss_mask) for t in trajs])
    # samples per episode (a gateway episode, or a rollout.context rewrite); 1.0 when no history was rewritten
    out["traj/samples"] = _mean([float(t.info.get("samples", 1) or 1) for t in episodes])
    tool_status = Counter(c.status for t in trajs for c in t.tool_calls)
    n_calls = sum(tool_status.values())
    out["tools/error_rate"] = (n_calls - tool_status.get("ok", 0)) / n_calls if n_calls else 0.0
    out.update(step_signal(trajs).metrics())  # signal/zero_variance_frac, tools/success_rate
    # hostile input made harmless, summed over the step: calls past rollout.max_calls_per_turn,
    # and characters of tool results that were not valid Unicode (shown to the model as U+FFFD)
    out["tools/calls_not_run"] = float(sum(t.metrics.get("calls_not_run", 0.0) for t in trajs))
    out["tools/replaced_chars"] = float(sum(c.replaced_chars for t in trajs for c in t.tool_calls))
    out.update(per_tool_metrics(trajs))
    out["time/traj_gen_s"] = _mean([t.metrics.get("gen_s", 0.0) for t in trajs])
    out["time/traj_tool_s"] = _mean([t.metrics.get("tool_s", 0.0) for t in trajs])
    counts = Counter(t.status for t in episodes)
    for s in STATUSES:
        out[f"status/{s}"] = float(counts.get(s, 0))
    return out


def turn_reward_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """turn_reward/mean (over the model turns that carry a reward) and turn_reward/<term> (the
    mean of each process term over the turns it scored); nothing when no turn was scored."""
    segs = [s for t in trajs for s in t.turn_segments() if s.reward is not None]
    if not segs:
        return {}
    out = {"turn_reward/mean": _mean([float(s.reward) for s in segs])}  # type: ignore[arg-type]
    for k in sorted({k for s in segs for k in (s.reward_terms or {})}):
        out[f"turn_reward/{k}"] = _mean([s.reward_terms[k] for s in segs if s.reward_terms and k in s.reward_terms])
    return out


def per_tool_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """tool/<name>/calls, tool/<name>/errors (status not ok), tool/<name>/timeouts and
    time/tool/<name>/latency_s (mean; a timing, so under time/) over a step's tool calls, one set
    per tool name (malformed calls, which name no tool, are left out)."""
    calls: dict[str, list] = {}
    for t in trajs:
        for c in t.tool_calls:
            if c.name:
                calls.setdefault(c.name, []).append(c)
    out: dict[str, float] = {}
    for name, cs in sorted(calls.items()):
        out[f"tool/{name}/calls"] = float(len(cs))
        out[f"tool/{name}/errors"] = float(sum(c.status != "ok" for c in cs))
        out[f"tool/{name}/timeouts"] = float(sum(c.status == "timeout" for c in cs))
        out[f"time/tool/{name}/latency_s"] = _mean([float(c.latency_s) for c in cs])
    return out


def tensor_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """mean/std/min/max of x (over mask when given)."""
    vals = x[mask.bool()] if mask is not None else x.reshape(-1)
    if vals.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/std": 0.0, f"{prefix}/min": 0.0, f"{prefix}/max": 0.0}
    vals = vals.float()
    return {
        f"{prefix}/mean": float(vals.mean()),
        f"{prefix}/std": float(vals.std()) if vals.numel() > 1 else 0.0,
        f"{prefix}/min": float(vals.min()),
        f"{prefix}/max": float(vals.max()),
    }


def logprob_mismatch(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the training model's logprobs are from the sampler's on the sampled tokens.

    train_logp, sampler_logp, mask: [B, T]. mismatch/abs_diff = mean |train - sampler|;
    mismatch/kl = k3 estimate of KL(sampler || train) from the sampler's own samples;
    mismatch/max_abs_diff = the largest token difference.
    """
    m = mask.bool()
    if not m.any():
        return {"mismatch/abs_diff": 0.0, "mismatch/kl": 0.0, "mismatch/max_abs_diff": 0.0}
    d = (train_logp - sampler_logp)[m].float()  # log(train / sampler)
    k3 = torch.exp(d.clamp(-20, 20)) - 1 - d
    return {
        "mismatch/abs_diff": float(d.abs().mean()),
        "mismatch/kl": float(k3.mean()),
        "mismatch/max_abs_diff": float(d.abs().max()),
    }
