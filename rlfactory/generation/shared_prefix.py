"""Shared-prefix decode attention: the columns that many rows' caches start with, read once a step.

In a rollout every trajectory starts with the same system prompt and tool list (~300 tokens in the
rollout benchmark: ~75% of a row's columns in its first turns). The prefill computes that prefix
once (prefill.py `_share_prefix`) and copies it into each row's slot, so a decode step's attention,
which on the CPU is bound by reading the cache, read those columns once per row. Here a decode step
reads them once for all rows that hold them: every row's queries attend the prefix keys and values
[Hkv, P, D] in one attention (the rows' query heads as its query axis), each row's own columns after
the prefix are attended from its slot as before, and the two partial results are merged exactly by
their log-sum-exps (cascade or "shared prefix" attention in FlashInfer and vLLM): attention over the
row's whole cache, equal to the one-pass attention up to float rounding.

`SharedPrefix` is the block the decode cache holds once (its ids and, per layer, keys and values);
a slot holds it when its columns [0, P) are that block's values bit for bit (`holds`). A step passes
a `PrefixStep` to the model's forward as the keyword `shared_prefix`, which transformers hands to
every layer's attention function (gqa_attention.gqa_sdpa_attention runs `prefix_decode_attention`);
an attention function that does not know the keyword ignores it and reads the whole cache, which
still holds the prefix's copy: same outputs, the one-pass cost. Used for CPU decode steps of
full-attention models with at least MIN_ROWS rows holding the block; other steps, the fixed-shape
(CUDA-graph) step and sliding-window models keep the one-pass attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlfactory.generation.kv_cache import RowKV


CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""torch's CPU flash attention, which returns the log-sum-exps the two parts merge by (None: a torch
without it; then decode steps keep the one-pass attention)."""

MIN_ROWS = 16
"""Fewest rows holding the block for a step to read it once: with fewer, the second attention call
and the merge cost more than the reads saved (benchmarks/shared_prefix_attention.py on tiny:1m
shapes, 1 thread: 0.5-0.9x at 8 rows, about even at 16, 1.3-1.6x at 32, 1.3-4x at 128)."""


@dataclass(frozen=True, eq=False)
class SharedPrefix:
    """A prefix block held once: its token ids and its cache, per layer (keys, values) [Hkv, P, D]."""

    ids: tuple[int, ...]
    kv: RowKV

    @property
    def length(self) -> int:
        return len(self.ids)

    def cut(self, n: int) -> "SharedPrefix":
        """The block's first n columns (views: a row holding the block holds these too)."""
        return SharedPrefix(self.ids[:n], [(k[:, :n], v[:, :n]) for k, v in self.kv])

    def holds(self, past: RowKV | None) -> bool:
        """Whether a row's cache `past` starts with this block, bit for bit (the block itself, a
        kept cache that was copied from a slot holding it)."""
        if not past:
            return False
        if past is self.kv:
            return True
        n = self.length
        if len(past) != len(self.kv) or past[0][0].shape[1] < n:
            return False
        return all(k.shape[0::2] == pk.shape[0::2] and torch.equal(k[:, :n], pk) and torch.equal(v[:, :n], pv)
                   for (k, v), (pk, pv) in zip(past, self.kv))


def common_length(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """How many ids two sequences share at their start."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True, eq=False)
class PrefixStep:
    """What a decode step's attention needs to read the shared prefix once: the block's per-layer
    keys/values [Hkv, P, D], and the step's rows that do not hold it (`own` [N], indices among the
    forward's rows; None: every row holds it). Those rows read their own columns [0, P)."""

    kv: RowKV
    own: torch.Tensor | None

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[1]


def prefix_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None,
                            prefix_key: torch.Tensor, prefix_value: torch.Tensor,
                            own: torch.Tensor | None) -> torch.Tensor:
    """One query token per row, `query` [B, H, 1, D], over `key`/`value` [B, Hkv, W, D] whose columns
    [0, P) are `prefix_key`/`prefix_value` [Hkv, P, D] for every row but those in `own` [N] (which
    read their own). `attention_mask` [B, 1, 1, W] (bool: visible; float: added) or None. Returns
    [B, 1, H, Dv], the layout transformers' attention functions return.

    Two fused partial attentions by torch's CPU flash kernel (which also returns each query's
    log-sum-exp), merged by their log-sum-exps: the prefix part as one attention whose query axis is
    every row's group of heads, the rest from each row's slot columns [P, W). CPU tensors only."""
    op = CPU_FLASH
    b, h, _, d = query.shape
    hkv, p = prefix_key.shape[0], prefix_key.shape[1]
    g = h // hkv
    q = query.reshape(b, hkv, g, d)
    # The prefix once for all rows: the rows' group heads are one long query axis per KV head.
    o_pre, l_pre = op(q.transpose(0, 1).reshape(1, hkv, b * g, d), prefix_key[None], prefix_value[None], scale=scaling)
    o_pre = o_pre.view(hkv, b, g, -1).transpose(0, 1)
    l_pre = l_pre.view(hkv, b, g).transpose(0, 1)
    mask = None
    if attention_mask is not None:
        m = attention_mask[:, :, :, : key.shape[2]]
        mask = m[..., p:].to(query.dtype) if m.dtype != torch.bool else torch.zeros(
            m[..., p:].shape, dtype=query.dtype, device=m.device).masked_fill(~m[..., p:], float("-inf"))
    # A row with nothing visible after the prefix (only rows in `own`) comes back as 0 with a
    # log-sum-exp of 0; those rows are recomputed below.
    o_own, l_own = op(q, key[:, :, p:], value[:, :, p:], attn_mask=mask, scale=scaling)
    top = torch.maximum(l_pre, l_own)
    w_pre, w_own = torch.exp(l_pre - top).unsqueeze(-1), torch.exp(l_own - top).unsqueeze(-1)
    out = ((o_pre.float() * w_pre + o_own.float() * w_own) / (w_pre + w_own)).to(value.dtype)  # [B, Hkv, G, Dv]
    if own is not None:
        m = None if attention_mask is None else attention_mask[own, :, :, : key.shape[2]]
        out[own] = F.scaled_dot_product_attention(q[own], key[own], value[own], attn_mask=m, scale=scaling).to(out.dtype)
    return out.reshape(b, 1, h, value.shape[-1])
