"""The bounded admission wait of LocalGenerator: when the batch is small and turns keep arriving,
hold the next step a moment so the turns about to arrive join it.

On the CPU a step costs a fixed part (the model's Python and per-layer launches, the draw, a
prefill forward for the new rows) plus a part per row. A batch of a few rows pays the fixed part
for little work, and turns that arrive one step later pay it again in a prefill of their own. When
arrivals are frequent, waiting at most `steps` decode steps' time lets them share one prefill and
one step with the rows already there.

"About to arrive" is read from two things the generator sees: trajectories between turns (the
sessions whose cache is kept: their tool calls are in flight) and the turns that arrived over the
last `window_steps` steps (the rate they come back at). The wait happens only when the arrivals
expected within the bound would grow the batch by at least half; a lock-step barrier (no arrivals
while its last rows finish) or the end of a rollout (nobody away) never waits. A wait ends at its
bound, or sooner once the batch has doubled: so no turn waits longer than the bound for it.
"""

from __future__ import annotations

from collections import deque


class AdmissionWait:
    """`steps`: the most a step is held, in decode steps' time (0: never held); a decode step's
    time is what `stepped` is told (prefills left out: a step admitting a batch of long prompts
    would make the bound long).
    `window_steps`: how many steps' time of past arrivals give the rate they come at."""

    def __init__(self, steps: float = 1.0, window_steps: float = 8.0) -> None:
        if steps < 0:
            raise ValueError(f"admission wait must be >= 0 decode steps, not {steps}")
        self.steps = float(steps)
        self.window_steps = float(window_steps)
        self.step_s = 0.0
        """Recent wall seconds of a step (moving average; 0 before the first step)."""
        self._arrivals: deque[float] = deque()

    def arrived(self, now: float) -> None:
        """A turn was submitted at `now` (perf_counter seconds)."""
        if self.steps > 0:  # (turned off, nothing reads them)
            self._arrivals.append(now)
            self._forget_before(now - self.window_steps * self.step_s)

    def stepped(self, seconds: float) -> None:
        """A decode step took `seconds`."""
        self.step_s = seconds if self.step_s == 0 else 0.75 * self.step_s + 0.25 * seconds

    def bound(self) -> float:
        """The longest wait, in seconds: `steps` steps' time."""
        return self.steps * self.step_s

    def expected(self, now: float) -> float:
        """Turns expected to arrive within the bound, at the rate of the last `window_steps` steps."""
        window = self.window_steps * self.step_s
        self._forget_before(now - window)
        return len(self._arrivals) * self.steps / self.window_steps if window > 0 else 0.0

    def _forget_before(self, t: float) -> None:
        """Drop arrivals before `t` (kept only as far back as the window: a long-lived generator,
        `rlfactory serve`'s, sees millions)."""
        while self._arrivals and self._arrivals[0] < t:
            self._arrivals.popleft()

    def wait_s(self, now: float, batch: int, away: int) -> float:
        """How long to hold the next step (0: not at all): `batch` rows are live or waiting to join
        it, `away` trajectories are between turns. Held only when the turns expected within the
        bound, at most `away`, would grow the batch by at least half."""
        bound = self.bound()
        if bound <= 0 or batch <= 0 or away <= 0:
            return 0.0
        return bound if min(self.expected(now), away) >= batch / 2 else 0.0
