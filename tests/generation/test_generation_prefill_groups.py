"""How the CPU prefill splits new rows of different lengths into forwards (prefill.prefill_groups)."""

from __future__ import annotations

import random

import torch

from rlfactory.generation.prefill import PREFILL_OVERHEAD_TOKENS, length_groups, prefill_groups
from rlfactory.passes import plan_micro_batches

CPU = torch.device("cpu")


def cost(lengths: list[int], groups: list[list[int]], overhead: int) -> int:
    return sum(overhead + len(g) * max(lengths[i] for i in g) for g in groups)


def test_the_split_costs_what_plan_micro_batches_costs_on_random_rows():
    """Planned over distinct lengths, the split is as cheap as passes.py's exact plan (padded
    positions plus the per-forward cost), covers every row once, each forward's rows ascending."""
    rng = random.Random(7)
    for trial in range(300):
        n = rng.randint(1, 40)
        spread = rng.choice([3, 40, 300])
        lengths = [rng.randint(1, spread) for _ in range(n)]
        overhead = rng.choice([1, 16, PREFILL_OVERHEAD_TOKENS, 200])
        groups = length_groups(lengths, overhead)
        zeros = [0] * n
        assert sorted(i for g in groups for i in g) == list(range(n))
        assert all(g == sorted(g) for g in groups)
        assert cost(lengths, groups, overhead) == cost(lengths, plan_micro_batches(lengths, zeros, zeros, overhead=overhead),
                                                       overhead), (lengths, overhead)
        if n > 1:
            assert cost(lengths, prefill_groups(lengths, CPU), PREFILL_OVERHEAD_TOKENS) == cost(
                lengths, length_groups(lengths, PREFILL_OVERHEAD_TOKENS), PREFILL_OVERHEAD_TOKENS)


def test_rows_whose_padding_is_under_one_forward_stay_one_forward_without_planning(monkeypatch):
    """The rollout's first turn brings 256 rows of nearly one length (a shared prefix cut off):
    one forward, decided without the O(rows^2) plan (~25 ms of Python for 256 rows)."""
    import rlfactory.generation.prefill as prefill

    assert len(prefill_groups([9 + i % 2 for i in range(256)], CPU)) == 2  # 128 padded positions: planned
    planned = []
    monkeypatch.setattr(prefill, "length_groups", lambda *a: planned.append(a) or [])
    assert prefill_groups([12] * 256, CPU) == [list(range(256))]
    assert prefill_groups([13] * 200 + [12] * 48, CPU) == [list(range(248))]  # 48 padded: no split pays
    assert prefill_groups([5], CPU) == [[0]]
    assert prefill_groups([300, 2, 3], torch.device("cuda")) == [[0, 1, 2]]
    assert planned == []
    monkeypatch.undo()
    assert prefill_groups([300, 2, 3], CPU) == [[1, 2], [0]]
