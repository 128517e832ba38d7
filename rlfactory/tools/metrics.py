"""Per-tool counters and latency percentiles."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from rlfactory.tools.base import TIMEOUT, UNRESPONSIVE, ToolResult

_WINDOW = 10_000  # latencies kept per tool for the percentiles


@dataclass(frozen=True)
class ToolMetrics:
    """A snapshot of one tool's counters; latencies in seconds over the last calls."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    """Calls that ran out of their timeout (`timeout` and `unresponsive`)."""
    cache_hits: int = 0
    p50_s: float = 0.0
    p95_s: float = 0.0
    replaced_chars: int = 0
    """Characters of results that were not valid Unicode and were replaced by U+FFFD."""


class MetricsRecorder:
    """Mutable counters of one tool (the runner keeps one per tool)."""

    __slots__ = ("calls", "errors", "timeouts", "cache_hits", "replaced_chars", "latencies")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.cache_hits = 0
        self.replaced_chars = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=_WINDOW)

    def record(self, result: ToolResult) -> None:
        self.calls += 1
        if result.cached:
            self.cache_hits += 1
        self.replaced_chars += result.replaced_chars
        if result.is_error:
            self.errors += 1
            if result.status in (TIMEOUT, UNRESPONSIVE):
                self.timeouts += 1
        self.latencies.append(result.latency_s)

    def snapshot(self) -> ToolMetrics:
        lat = sorted(self.latencies)
        return ToolMetrics(self.calls, self.errors, self.timeouts, self.cache_hits, _pct(lat, 0.50), _pct(lat, 0.95),
                           self.replaced_chars)


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]
