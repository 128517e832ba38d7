"""Staleness in asynchronous training (trainer.max_staleness, async_pipeline.py): how many
versions behind the trained weights a trajectory's model segments are, which trajectories are
fresh enough to train on, and the off-policy weights' statistics."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch

from rlfactory.trajectory import Trajectory


def staleness_of(traj: Trajectory, version: int) -> int:
    """How many versions the trajectory's oldest model segment is behind `version` (0 without any
    model segment; a segment without a recorded version counts as current)."""
    return max((version - s.policy_version for s in traj.segments
                if s.role == "model" and s.policy_version is not None), default=0)


def fresh_mask(trajs: Sequence[Trajectory], version: int, max_staleness: int) -> tuple[torch.Tensor, dict[str, float]]:
    """fresh [B] bool (every model segment at most `max_staleness` behind `version`) and metrics:
    async/dropped_stale (trajectories not fresh), async/staleness_mean and async/staleness_max (over
    model segments), async/trajs_staleness_<n> (trajectories whose oldest segment is n behind)."""
    worst = [staleness_of(t, version) for t in trajs]
    fresh = torch.tensor([w <= max_staleness for w in worst], dtype=torch.bool)
    segs = [version - s.policy_version for t in trajs for s in t.segments
            if s.role == "model" and s.policy_version is not None]
    out = {"async/dropped_stale": float((~fresh).sum()),
           "async/staleness_mean": sum(segs) / len(segs) if segs else 0.0,
           "async/staleness_max": float(max(segs, default=0))}
    for n, count in sorted(Counter(worst).items()):
        out[f"async/trajs_staleness_{n}"] = float(count)
    return fresh, out


def is_weight_stats(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """async/is_weight_mean, async/is_weight_max (before truncation) and async/is_clipped_frac
    (tokens whose weight pi_old / pi_behaviour exceeded `cap`), over mask; shapes [B, T]."""
    m = mask.bool()
    if not m.any():
        return {"async/is_weight_mean": 1.0, "async/is_weight_max": 1.0, "async/is_clipped_frac": 0.0}
    w = torch.exp((old_logp.detach().float() - sampler_logp.float()).clamp(-20.0, 20.0))[m]
    return {"async/is_weight_mean": float(w.clamp(max=cap).mean()), "async/is_weight_max": float(w.max()),
            "async/is_clipped_frac": float((w > cap).float().mean())}
