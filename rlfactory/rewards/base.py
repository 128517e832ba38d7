"""The reward contract (DESIGN.md "Reward"): `score(trajectory) -> RewardScore`.

Rule, judge and verify rewards share this signature and compose by weights. Scoring is async
because judge and verify rewards call models and tools; rule rewards simply return.
A trajectory with status `infra_error` is never scored: the trainer leaves it out of its group's
baseline and out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, runtime_checkable

from rlfactory.trajectory import Trajectory


@dataclass
class RewardScore:
    total: float
    terms: dict[str, float] = field(default_factory=dict)
    turns: list[RewardScore] | None = None
    """Process rewards: one score per model turn, in order (rlfactory/rewards/turns.py); None for
    an outcome-only reward. They do not enter `total`."""


@runtime_checkable
class Reward(Protocol):
    async def score(self, trajectory: Trajectory) -> RewardScore:
        """The reward of `trajectory` (never an `infra_error` one: see `is_scorable`)."""
        ...


@runtime_checkable
class ScoresMany(Protocol):
    """A reward that scores a batch at once (judges coalesce it into batched model calls;
    ComposedReward and the per-turn reward hand the batch to their parts)."""

    async def score_many(self, trajectories: list[Trajectory]) -> list[RewardScore]: ...


@runtime_checkable
class ReadsAnswers(Protocol):
    """A reward that finds the model's final answer in a trajectory (RuleReward): evaluation reports
    the answer the way the reward reads it."""

    answer_extractor: Callable[[Trajectory], str | None]


@runtime_checkable
class HasParts(Protocol):
    """A reward made of weighted parts (ComposedReward), by name."""

    parts: Mapping[str, tuple[Reward, float]]


# --- added with the reward implementations (backward compatible) --------------------------------


class UnscorableTrajectory(ValueError):
    """Raised by rlfactory's rewards when asked to score an `infra_error` trajectory.

    Such a trajectory failed for reasons that are not the policy's (a tool server died, a
    generator crashed); scoring it zero would teach the policy something false. The trainer is
    responsible: check `is_scorable` first (or use `score_all`, which does), leave the trajectory
    out of its group's baseline (advantage `valid=False`) and out of the loss.
    """


def is_scorable(trajectory: Trajectory) -> bool:
    """False for an `infra_error` trajectory (see `UnscorableTrajectory`); True otherwise."""
    return trajectory.status != "infra_error"


def require_scorable(trajectory: Trajectory) -> None:
    """Raise `UnscorableTrajectory` for an `infra_error` trajectory."""
    if not is_scorable(trajectory):
        raise UnscorableTrajectory(
            f"trajectory {trajectory.id!r} has status infra_error and must not be scored; "
            "the trainer leaves it out of the baseline and the loss (rlfactory.rewards.is_scorable)"
        )


async def score_many(reward: Reward, trajectories: list[Trajectory]) -> list[RewardScore]:
    """Score all trajectories concurrently, with `reward.score_many` when the reward batches
    (ScoresMany: judges do), else `asyncio.gather` over `reward.score`. All must be scorable."""
    import asyncio

    if isinstance(reward, ScoresMany):
        return list(await reward.score_many(trajectories))
    return list(await asyncio.gather(*(reward.score(t) for t in trajectories)))


async def score_all(reward: Reward, trajectories: list[Trajectory]) -> list[RewardScore | None]:
    """What the trainer calls: scores in input order, None for every `infra_error` trajectory."""
    todo = [t for t in trajectories if is_scorable(t)]
    scores = iter(await score_many(reward, todo))
    return [next(scores) if is_scorable(t) else None for t in trajectories]
