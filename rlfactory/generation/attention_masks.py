"""Attention masks built from token positions, for models with sliding-window layers.

transformers builds a sliding-window mask from *column* distances in the cache (`kv_idx > q_idx -
window`). rlfactory's batches are not laid out so that columns are positions: a prefill on kept
caches has padding between a row's past and its new tokens, decode slots are left-aligned at
different lengths, and the trainer puts padding between a prompt and its completion. For
full-attention models that is harmless (a padding mask suffices, and that fast path is kept
unchanged); for sliding-window layers it would let a token see too little or too much.

So for those models the caller passes ready 4D masks built here from each key's and query's real
position: key k is visible to query q when k is a real token, pos(k) <= pos(q), and, in a sliding
layer, pos(q) - pos(k) < window. A 4D mask is used as given by every transformers model; models
that mix layer kinds (Gemma 2/3, gpt-oss, Qwen2 with `use_sliding_window`) take a dict
`{"full_attention": m, "sliding_attention": m}`. Masks are boolean for sdpa and additive floats
for eager attention; other kernels (flash, flex) are refused for sliding-window models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FULL, SLIDING = "full_attention", "sliding_attention"
MASKABLE = ("sdpa", "eager")


@dataclass(frozen=True)
class MaskPlan:
    """How to mask a model with sliding-window layers."""

    kinds: frozenset[str]  # layer kinds present
    window: int  # sliding window (tokens a query sees, itself included)
    as_dict: bool  # the model reads one mask per layer kind
    additive: bool  # eager attention adds the mask to its scores
    dtype: torch.dtype  # of an additive mask

    def build(self, key_pos: torch.Tensor, key_valid: torch.Tensor, query_pos: torch.Tensor,
              query_col: torch.Tensor | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """Masks for queries at `query_pos` [B, Q] over keys at `key_pos` [B, K] (`key_valid` [B, K]
        bool: real tokens). `query_col` [Q]: each query's own key column, always visible to it (a
        padding query then attends to itself only, which keeps its output finite). Returns [B, 1, Q,
        K] (or a dict of them by layer kind)."""
        kp, qp = key_pos.unsqueeze(1), query_pos.unsqueeze(2)  # [B, 1, K], [B, Q, 1]
        causal = key_valid.unsqueeze(1) & (kp <= qp)
        if query_col is not None:
            own = torch.zeros(causal.shape[1:], dtype=torch.bool, device=causal.device)
            own[torch.arange(len(query_col), device=own.device), query_col] = True
            causal = causal | own
        masks = {}
        if FULL in self.kinds:
            masks[FULL] = self._format(causal)
        if SLIDING in self.kinds:
            window = causal & (qp - kp < self.window)
            if query_col is not None:
                window = window | own
            masks[SLIDING] = self._format(window)
        return masks if self.as_dict else next(iter(masks.values()))

    def _format(self, allowed: torch.Tensor) -> torch.Tensor:
        allowed = allowed.unsqueeze(1)
        if not self.additive:
            return allowed
        return torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min)


def layer_kinds(config: Any) -> list[str]:
    """Each layer's attention kind: `config.layer_types` when the model has them, else sliding for
    every layer when `config.sliding_window` is set (Mistral), else full."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    n = int(getattr(config, "num_hidden_layers", 1) or 1)
    sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) is not False
    return [SLIDING if sliding else FULL] * n


def mask_plan(model: Any) -> MaskPlan | None:
    """None for full-attention models (a 2D padding mask is enough); a MaskPlan for models with
    sliding-window layers. Raises NotImplementedError for layer kinds rlfactory cannot mask
    (linear attention, chunked attention, ...) and for kernels other than sdpa/eager."""
    config = getattr(model, "config", None)
    kinds = frozenset(layer_kinds(config))
    if kinds == {FULL}:
        return None
    unknown = sorted(kinds - {FULL, SLIDING})
    name = type(model).__name__
    if unknown:
        raise NotImplementedError(f"{name} has {', '.join(unknown)} layers; rlfactory's local generator runs "
                                  "full-attention and sliding-window layers only")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in MASKABLE:
        raise NotImplementedError(f"{name} has sliding-window layers; rlfactory masks them for sdpa or eager "
                                  f"attention, not {impl!r}: set model.attn_implementation to sdpa or eager")
    window = int(getattr(config, "sliding_window", 0) or 0)
    if window <= 0:
        raise ValueError(f"{name} has sliding-window layers but config.sliding_window is {window}")
    mixed = getattr(config, "layer_types", None) is not None
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return MaskPlan(kinds, window, as_dict=mixed, additive=impl != "sdpa", dtype=dtype)
