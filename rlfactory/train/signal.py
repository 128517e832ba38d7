"""Is GRPO learning anything? The learning signal of a step, and a warning when there is none.

A group whose samples all got the same reward has advantage 0 for every sample: it teaches the
policy nothing. When most groups are like that for several steps in a row, the run is spending
its time on nothing, and the usual causes are a reward too sparse for the model's current
success rate, too little warm start, groups too small or sampling too cold to differ. Tool-call
failures are the other usual suspect: their rate and most common error text come with it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from rlfactory.trajectory import Trajectory

HELPS = ("what usually helps: a denser or shaped reward (partial credit, a small format term), more warm start "
         "(sft.steps, sft.full_text_steps), larger groups (algo.group_size), a higher temperature "
         "(sampling.temperature)")


@dataclass
class StepSignal:
    """What one step's trajectories carry for learning."""

    groups: int
    """Groups with at least two scored trajectories."""
    flat_groups: int
    """Of those, groups whose rewards are all equal (no learning signal)."""
    flat_reward: float | None
    """The reward most flat groups share (e.g. 0.0: none succeeded), None without flat groups."""
    tool_calls: int
    tool_ok: int
    top_error: str | None
    """The most common error text of the step's failed tool calls (its first line)."""

    @property
    def flat_frac(self) -> float:
        return self.flat_groups / self.groups if self.groups else 0.0

    @property
    def tool_success(self) -> float:
        return self.tool_ok / self.tool_calls if self.tool_calls else 0.0

    def metrics(self) -> dict[str, float]:
        """`signal/zero_variance_frac` (groups without signal) and `tools/success_rate`."""
        return {"signal/zero_variance_frac": self.flat_frac, "tools/success_rate": self.tool_success}


def step_signal(trajs: Sequence[Trajectory]) -> StepSignal:
    """The signal of a step's scored trajectories (infra_error ones, unscored, are left out)."""
    by_group: dict[str, list[float]] = {}
    for t in trajs:
        if t.reward is not None:
            by_group.setdefault(t.group, []).append(float(t.reward))
    sized = [rs for rs in by_group.values() if len(rs) >= 2]
    flat = [rs for rs in sized if max(rs) - min(rs) <= 1e-9 * max(1.0, max(abs(r) for r in rs))]
    shared = Counter(round(rs[0], 6) for rs in flat).most_common(1)
    calls = [c for t in trajs for c in t.tool_calls]
    errors = Counter(_first_line(c.error or c.status) for c in calls if c.status != "ok")
    return StepSignal(groups=len(sized), flat_groups=len(flat), flat_reward=shared[0][0] if shared else None,
                      tool_calls=len(calls), tool_ok=sum(c.status == "ok" for c in calls),
                      top_error=errors.most_common(1)[0][0] if errors else None)


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0][:160] if lines else ""


class SignalWatch:
    """Warns when at least `threshold` of the groups carry no signal for `patience` steps in a row,
    and again every `every` steps while it lasts."""

    def __init__(self, threshold: float = 0.5, patience: int = 3, every: int = 10) -> None:
        self.threshold, self.patience, self.every = threshold, patience, every
        self.run = 0  # consecutive steps without signal

    def observe(self, step: int, signal: StepSignal) -> str | None:
        """The warning for `step`, when one is due; None otherwise."""
        if not signal.groups or signal.flat_frac < self.threshold:
            self.run = 0
            return None
        self.run += 1
        due = self.run == self.patience or (self.run > self.patience and (self.run - self.patience) % self.every == 0)
        if not due:
            return None
        same = "" if signal.flat_reward is None or math.isnan(signal.flat_reward) else \
            f", most of them all {signal.flat_reward:g}"
        tools = ""
        if signal.tool_calls:
            tools = f"; tool calls succeeded {signal.tool_success:.0%} of {signal.tool_calls}"
            if signal.top_error:
                tools += f" (most common error: {signal.top_error!r})"
        return (f"train: step {step}: {signal.flat_frac:.0%} of groups got one reward for every sample{same} "
                f"(no learning signal), {self.run} steps in a row{tools}; {HELPS}")
