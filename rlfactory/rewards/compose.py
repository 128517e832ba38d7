"""Composition of rewards by weights."""

from __future__ import annotations

import asyncio
from typing import Mapping

from rlfactory.rewards.base import Reward, RewardScore, require_scorable, score_many
from rlfactory.trajectory import Trajectory


class ComposedReward:
    """`ComposedReward({name: (reward, weight)})`: total = sum(weight * reward.total).

    `terms` holds each part's total under `name` and each of its terms under `name/term`, so
    every term is reported separately. Parts are scored concurrently; `score_many` hands whole
    batches to parts that batch (judges).
    """

    def __init__(self, parts: Mapping[str, tuple[Reward, float]]) -> None:
        if not parts:
            raise ValueError("ComposedReward needs at least one part")
        for name, part in parts.items():
            if "/" in name:
                raise ValueError(f"reward part name {name!r} must not contain '/'")
            if not (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], Reward)):
                raise ValueError(f"part {name!r} must be (reward, weight), got {part!r}")
        self.parts = {name: (reward, float(weight)) for name, (reward, weight) in parts.items()}

    def _combine(self, scores: dict[str, RewardScore]) -> RewardScore:
        terms: dict[str, float] = {}
        total = 0.0
        for name, s in scores.items():
            total += self.parts[name][1] * s.total
            terms[name] = s.total
            terms.update({f"{name}/{k}": v for k, v in s.terms.items()})
        return RewardScore(total=total, terms=terms)

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        names = list(self.parts)
        results = await asyncio.gather(*(self.parts[n][0].score(trajectory) for n in names))
        return self._combine(dict(zip(names, results)))

    async def score_many(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        for t in trajectories:
            require_scorable(t)
        names = list(self.parts)
        per_part = await asyncio.gather(*(score_many(self.parts[n][0], trajectories) for n in names))
        return [self._combine({n: per_part[j][i] for j, n in enumerate(names)}) for i in range(len(trajectories))]
