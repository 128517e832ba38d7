"""Shared-prefix decode attention: the columns that many rows' caches start with, read once a step.

In a rollout every trajectory starts with the same system prompt and tool list (~300 tokens in the
rollout benchmark: ~75% of a row's columns in its first turns). The prefill computes that prefix
once (prefill.py `_share_prefix`) and copies it into each row's slot, so a decode step's attention,
which on the CPU is bound by reading the cache, read those columns once per row. Here a decode step
reads them once for all rows that hold them: a row's scores against the prefix are one matmul of all
those rows' queries with the prefix keys [Hkv, P, D] (the same as cascade or "shared prefix"
attention in FlashInfer and vLLM); its scores against its own columns after the prefix come from its
slot as before; one softmax over both, so the output is attention over the row's whole cache, equal
to the one-pass attention up to float rounding.

`SharedPrefix` is the block the decode cache holds once (its ids and, per layer, keys and values);
a slot holds it when its columns [0, P) are that block's values bit for bit (`holds`). A step passes
a `PrefixStep` to the model's forward as the keyword `shared_prefix`, which transformers hands to
every layer's attention function (gqa_attention.gqa_sdpa_attention runs `prefix_decode_attention`);
an attention function that does not know the keyword ignores it and reads the whole cache, which
still holds the prefix's copy: same outputs, today's cost. Used for CPU decode steps of
full-attention models only; the fixed-shape (CUDA-graph) step and sliding-window models keep the
one-pass attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfactory.generation.kv_cache import RowKV


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
    [B, 1, H, Dv], the layout transformers' attention functions return."""
    b, h, _, d = query.shape
    hkv, p = prefix_key.shape[0], prefix_key.shape[1]
    g = h // hkv
    scale = scaling if scaling is not None else d ** -0.5
    q = query.reshape(b, hkv, g, d)  # a group's query heads share their KV head
    # The prefix once for all rows: per KV head [B*G, D] x [D, P].
    qh = q.transpose(0, 1).reshape(hkv, b * g, d)
    s_pre = torch.matmul(qh, prefix_key.transpose(1, 2)).view(hkv, b, g, p).transpose(0, 1)  # [B, Hkv, G, P]
    s_own = torch.matmul(q, key[:, :, p:].transpose(2, 3))  # [B, Hkv, G, W-P]
    scores = torch.cat([s_pre, s_own], dim=-1)
    if own is not None:
        scores[own, :, :, :p] = torch.matmul(q[own], key[own, :, :p].transpose(2, 3))
    scores = scores.float() * scale
    if attention_mask is not None:
        m = attention_mask[:, :, :, : key.shape[2]]  # [B, 1, 1, W], over heads and group
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    w_pre = weights[..., :p].transpose(0, 1).reshape(hkv, b * g, p)
    out = torch.matmul(w_pre, prefix_value).view(hkv, b, g, -1).transpose(0, 1)  # [B, Hkv, G, Dv]
    out = out + torch.matmul(weights[..., p:], value[:, :, p:])
    if own is not None:
        out[own] = torch.matmul(weights[own, :, :, :p], value[own, :, :p]) + torch.matmul(
            weights[own, :, :, p:], value[own, :, p:])
    return out.reshape(b, 1, h, value.shape[-1])
