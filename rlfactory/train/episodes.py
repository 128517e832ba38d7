"""Branched episodes in the loss: an episode of several samples weighs like one episode.

A gateway episode, or a rollout whose history `rollout.context` rewrote (trained as its samples,
rlfactory/branches.py, after it was scored whole), is one or more samples, one trajectory each,
sharing `info["episode"]` and the episode's reward (DESIGN.md "Branches").
Two rules keep such an episode from weighing more than an unbranched one:

- the baseline: an outcome estimator (grpo, rloo, ...) sees each episode once, through its first
  sample; every other sample of the episode gets that sample's advantage
  (`episode_advantages`);
- the tokens: every sampled token is in the loss of exactly one sample (a new sample's prompt
  holds the rewritten history, loss mask 0; gateway_record.py), so with `loss_agg: token-mean`
  the samples of an episode together put exactly the episode's sampled tokens into the mean,
  each once, as one unbranched trajectory holding them would. (With a `seq-mean-*`
  aggregation every sample counts as one sequence.)

Trajectories without an episode (rlfactory's own rollouts with `rollout.context: keep`) are
their own episode: the advantages are then exactly the estimator's.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from rlfactory.trajectory import Trajectory


def episode_firsts(trajs: Sequence[Trajectory]) -> torch.Tensor:
    """[B] long: the index of the first trajectory of b's episode (b itself when it has none).
    An episode is (group, info["episode"])."""
    first: dict[tuple[str, Any], int] = {}
    out = []
    for b, t in enumerate(trajs):
        episode = t.info.get("episode") if isinstance(t.info, dict) else None
        out.append(b if episode is None else first.setdefault((t.group, episode), b))
    return torch.tensor(out, dtype=torch.long)


def episode_advantages(estimator: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                       rewards: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor,
                       trajs: Sequence[Trajectory]) -> torch.Tensor:
    """`estimator(rewards, groups, valid)` [B] with each episode counted once in its group: taken
    over the episodes' first samples and copied to their other samples. Shapes: [B] -> [B]."""
    firsts = episode_firsts(trajs)
    is_first = firsts == torch.arange(len(trajs))
    if bool(is_first.all()):
        return estimator(rewards, groups, valid)
    return estimator(rewards, groups, valid & is_first)[firsts]
