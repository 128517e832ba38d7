"""Splitting rows of different lengths into passes of rows of similar length.

One forward pass pads its rows to the longest, so rows that differ by whole tool responses waste
compute on padding when they share a pass, and every extra pass costs its fixed work (each layer's
dispatch, the weights read once more). `plan_micro_batches` finds the split where padded positions
plus that per-pass cost are least. The trainer plans its update passes with it
(rlfactory/train/parallel.py), the local generator its prefills (rlfactory/generation/prefill.py).
"""

from __future__ import annotations

from typing import Sequence

PLAN_WINDOW = 512
"""Most rows `plan_micro_batches` puts in one pass without a `size` (bounds its search)."""

PASS_OVERHEAD_TOKENS = 64
"""What one more forward/backward pass costs in padded tokens (its fixed work: every layer's
dispatch, kernel launches): `plan_micro_batches` splits only where that saves more padding."""


def plan_micro_batches(completion_len: Sequence[int], prompt_len: Sequence[int], prompt_key: Sequence[int],
                       size: int | None = None, max_tokens: int | None = None,
                       overhead: int = PASS_OVERHEAD_TOKENS, packed: bool = False) -> list[list[int]]:
    """Split rows 0..n-1 into forward/backward passes of rows of similar length.

    A pass pads its completions to its longest and runs each distinct prompt (`prompt_key`) once,
    padded to its longest prompt, so it computes `rows x longest completion + prompts x longest
    prompt` token positions. Rows sorted by completion length (a prompt's rows kept together among
    equal lengths) are cut where that total plus `overhead` per pass is smallest (exact dynamic
    programming over the sorted order), with at most `size` rows (unset: PLAN_WINDOW) and
    `max_tokens` positions per pass (a single row over `max_tokens` gets a pass of its own). Returns each pass's row
    positions, in ascending order; a batch of rows of equal length and one prompt stays one pass.

    Why: a step's trajectories differ in length by whole tool responses (one search against three),
    so padding them all to the longest one wastes up to half the update's compute and memory; verl's
    dynamic batch size (`use_dynamic_bsz`) and TRL's `group_by_length` answer the same waste.

    `packed` (passes packed without padding, rlfactory/train/packed.py): a pass computes its real
    tokens only, `packed_tokens`; rows are taken in prompt order (a prompt's rows together, so a
    split costs its prompt once more) and `max_tokens` caps those real tokens.
    """
    n = len(completion_len)
    if n == 0:
        return []
    if packed:
        return _plan_packed(completion_len, prompt_len, prompt_key, size, max_tokens, overhead)
    order = sorted(range(n), key=lambda i: (int(completion_len[i]), int(prompt_key[i]), i))
    lc = [int(completion_len[i]) for i in order]
    lp = [int(prompt_len[i]) for i in order]
    key = [int(prompt_key[i]) for i in order]
    inf = float("inf")
    best = [0.0] + [inf] * n  # best[j]: cheapest split of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest_prompt, prompts = 0, set()
        for i in range(j - 1, -1, -1):  # the last pass is sorted rows i..j-1
            rows = j - i
            if rows > (size or PLAN_WINDOW):
                break
            longest_prompt = max(longest_prompt, lp[i])
            prompts.add(key[i])
            tokens = rows * lc[j - 1] + len(prompts) * longest_prompt
            if max_tokens is not None and tokens > max_tokens and rows > 1:
                break  # longer passes only grow (the rows are sorted by length)
            total = best[i] + tokens + overhead
            if total < best[j]:
                best[j], cut[j] = total, i
    return _passes_from_cuts(order, cut)


def packed_tokens(completion_len: Sequence[int], prompt_len: Sequence[int], prompt_key: Sequence[int]) -> int:
    """Tokens of one packed pass of these rows: each distinct prompt once, and each completion but
    its last token (which predicts nothing)."""
    prompts = {int(k): int(p) for k, p in zip(prompt_key, prompt_len)}
    return sum(prompts.values()) + sum(max(int(c) - 1, 0) for c in completion_len)


def _plan_packed(completion_len: Sequence[int], prompt_len: Sequence[int], prompt_key: Sequence[int],
                 size: int | None, max_tokens: int | None, overhead: int) -> list[list[int]]:
    """plan_micro_batches for packed passes: the same exact dynamic programming over the rows in
    prompt order, costing each pass its real tokens plus `overhead`."""
    n = len(completion_len)
    order = sorted(range(n), key=lambda i: (int(prompt_key[i]), int(completion_len[i]), i))
    inf = float("inf")
    best = [0.0] + [inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        tokens, prompts = 0, set()
        for i in range(j - 1, -1, -1):  # the last pass is rows order[i..j-1]
            r = order[i]
            if j - i > (size or PLAN_WINDOW):
                break
            tokens += max(int(completion_len[r]) - 1, 0)
            if int(prompt_key[r]) not in prompts:
                prompts.add(int(prompt_key[r]))
                tokens += int(prompt_len[r])
            if max_tokens is not None and tokens > max_tokens and j - i > 1:
                break  # longer passes only grow
            total = best[i] + tokens + overhead
            if total < best[j]:
                best[j], cut[j] = total, i
    return _passes_from_cuts(order, cut)


def _passes_from_cuts(order: Sequence[int], cut: Sequence[int]) -> list[list[int]]:
    """The passes of a plan whose last pass ending at row j starts at cut[j] (rows in `order`)."""
    passes = []
    j = len(order)
    while j > 0:
        passes.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return passes[::-1]
