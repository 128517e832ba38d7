"""How long the rest of `rlfactory sft` will take: a moving average of the step times.

The first steps of a run are rarely its typical ones (start-up, a machine whose load changes), so
the estimate is refreshed every step from an exponential moving average of the step times, not
fixed from step 2.
"""

from __future__ import annotations

import time
from typing import Any, Callable


class StepClock:
    """Seconds per step as an exponential moving average (weight `alpha` on the newest step; the
    first step, which pays start-up costs, is left out) and the time the remaining steps take."""

    def __init__(self, steps: int, alpha: float = 0.2, clock: Callable[[], float] = time.perf_counter) -> None:
        self.steps, self.alpha, self._clock = steps, alpha, clock
        self.last = clock()
        self.per_step: float | None = None

    def tick(self, step: int) -> float | None:
        """Record that step `step` (1-based) just ended; the estimated seconds left (None after step 1)."""
        now = self._clock()
        took, self.last = now - self.last, now
        if step < 2:
            return None
        self.per_step = took if self.per_step is None else self.alpha * took + (1 - self.alpha) * self.per_step
        return self.per_step * max(0, self.steps - step)


def duration(seconds: float) -> str:
    """`45 s`, `3.2 min` or `1.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class SftReporter:
    """What `rlfactory sft` prints while it trains: after step 2 one line with the measured rate and
    the expected time; a progress bar (on a terminal) whose `eta` is refreshed every step from the
    moving average; every `every` steps (and at the end) a line with the loss and the time left."""

    def __init__(self, steps: int, file: Any, every: int = 25, clock: Callable[[], float] = time.perf_counter,
                 bar: bool | None = None) -> None:
        from tqdm.auto import tqdm

        self.steps, self.file, self.every = steps, file, every
        self.clock = StepClock(steps, clock=clock)
        # disable=None: no bar when the output is not a terminal (logs keep the lines below)
        self.bar = tqdm(total=steps, desc="sft", unit="step", file=file, dynamic_ncols=True, leave=False,
                        disable=None if bar is None else not bar,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    def step(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        left = self.clock.tick(step)
        eta = f", {duration(left)} left" if left is not None else ""
        if step == 2 and self.steps > 2 and self.clock.per_step is not None:
            total = self.clock.per_step * self.steps
            advice = ("; to go faster: fewer sft.steps, a smaller sft.batch_size, or fewer demo tokens "
                      "(shorter tool descriptions, smaller rollout budgets)") if total > 300 else ""
            self._print(f"sft: {self.clock.per_step:.2f} s/step ({row['tokens_per_s']:,.0f} tokens/s measured on step "
                        f"{step}): about {duration(total)} for {self.steps} steps (refreshed as it goes){advice}")
        self.bar.set_postfix_str(f"loss {row['loss']:.3f}{eta}", refresh=False)
        self.bar.update(1)
        if step % self.every == 0 or step == self.steps:
            self._print(f"sft step {step}/{self.steps}: loss {row['loss']:.4f} token acc {row['token_acc']:.3f}{eta}")

    def _print(self, line: str) -> None:
        if self.bar.disable:
            print(line, file=self.file, flush=True)
        else:
            self.bar.write(line, file=self.file)

    def close(self) -> None:
        self.bar.close()
