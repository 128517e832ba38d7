"""Which dataset rows each step trains on, and the per-step seeds.

The rows are an endless stream of shuffled passes over the dataset; pass e is permuted by a
generator seeded from (seed, e), and step s takes stream positions [s*P, (s+1)*P). Nothing
depends on what happened in earlier steps, so a resumed run sees the same prompts.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Sequence

import numpy as np
import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from the given parts (stable across processes and Python versions)."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def pin_threads() -> None:
    """Fix torch's CPU threading for the rest of the process, so that float results depend on the
    thread count only, not on whether something in this process called `torch.set_num_threads`
    before. (That call also turns MKL's dynamic threading off: a process that never made it runs
    MKL matrix products with a different split, and its weights drift from an identical run's by
    a few ulps in one step. A resumed run in a fresh process must match the run it continues.)"""
    torch.set_num_threads(torch.get_num_threads())


def step_generator(seed: int, step: int, what: str) -> torch.Generator:
    """A CPU torch.Generator seeded from (seed, step, what)."""
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, step, what))
    return g


class PromptSampler:
    """Rows for step s: positions [s*P, (s+1)*P) of the shuffled-passes stream."""

    def __init__(self, rows: Sequence[dict[str, Any]], prompts_per_step: int, seed: int) -> None:
        if not rows:
            raise ValueError("the training split has no rows")
        self.rows = list(rows)
        self.per_step = prompts_per_step
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            g = torch.Generator()
            g.manual_seed(derive_seed(self.seed, "data", epoch))
            self._perms = {epoch: torch.randperm(len(self.rows), generator=g).tolist()}
        return self._perms[epoch]

    def position(self, step: int) -> int:
        """Rows consumed before step `step` (0-based)."""
        return step * self.per_step

    def rows_for(self, step: int) -> list[dict[str, Any]]:
        """The rows of step `step` (0-based)."""
        n = len(self.rows)
        out = []
        for pos in range(self.position(step), self.position(step + 1)):
            out.append(self.rows[self._perm(pos // n)[pos % n]])
        return out
