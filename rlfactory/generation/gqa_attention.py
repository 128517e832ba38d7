"""Decode attention for grouped-query (GQA) models without `repeat_kv` copies.

A GQA model (Qwen3-0.6B: 16 query heads, 8 KV heads) shares each KV head among a group of query
heads. transformers' sdpa path (5.17, the GPU machine's) copies the whole K and V cache of a layer
out to one head per query head (`repeat_kv`) whenever a mask is passed, which the local generator
always does: on an H100 that copy was 55% of a decode step's GPU time (benchmarks/results/
gpu_train.txt). sdpa's own `enable_gqa` avoids it only on the math kernel when a mask is given.

For one query token per row there is an exact way round it: the group's query heads become the
query axis, [B, H, 1, D] -> [B, Hkv, G, D] (a view), attended against K/V [B, Hkv, L, D] as they
are, with the row's mask [B, 1, 1, L] broadcast over heads and group. Every score is the same dot
product as before, so the output is the same (transformers >= 5.23 does this itself as `pack_gqa`).

A decode step may also pass `shared_prefix` (a shared_prefix.PrefixStep: the columns most rows'
caches start with, held once); one-token steps then read those columns once for all rows
(shared_prefix.prefix_decode_attention).

`install()` registers `gqa_sdpa_attention` as transformers' "sdpa" attention (AttentionInterface),
once per process. Everything it does not handle (more than one query token: prefill and training;
per-head masks, dropout, position bias, torch.compile tracing) goes to transformers' own
`sdpa_attention_forward` unchanged, so only the decode step changes. Shapes do not change, so the
CUDA-graph decode (decode_graph.py) records and replays it as before.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from rlfactory.generation.shared_prefix import prefix_decode_attention

log = logging.getLogger(__name__)

_ORIGINAL: Any = None  # transformers' sdpa function, set by install()


def one_token_step(query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float,
                   kwargs: dict[str, Any]) -> bool:
    """Whether this call is one query token per row with a mask shared by all heads, and nothing
    (dropout, position bias, softcap, returned weights, compile tracing) that only sdpa handles."""
    if query.shape[2] != 1 or dropout:
        return False
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1):
        return False
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None or kwargs.get("output_attentions"):
        return False
    return not torch.compiler.is_compiling()


def packable(module: Any, query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float,
             kwargs: dict[str, Any]) -> bool:
    """Whether this call is a one-token step (`one_token_step`) on a GQA layer."""
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    return groups > 1 and one_token_step(query, attention_mask, dropout, kwargs)


def prefix_readable(module: Any, query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float,
                    kwargs: dict[str, Any]) -> bool:
    """Whether this call can read a shared prefix once: a one-token step of a layer that knows its
    index (GQA or not)."""
    return getattr(module, "layer_idx", None) is not None and one_token_step(query, attention_mask, dropout, kwargs)


def packed_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Attention of one query token per row: `query` [B, H, 1, D], `key`/`value` [B, Hkv, L, D],
    `attention_mask` [B, 1, 1, L] (bool: visible; float: added) or None. Returns [B, 1, H, Dv] (the
    layout transformers' attention functions return)."""
    b, h, _, d = query.shape
    hkv = key.shape[1]
    q = query.reshape(b, hkv, h // hkv, d)  # the group's heads on the query axis
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[2]]
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)  # [B, Hkv, G, Dv]
    return out.reshape(b, 1, h, value.shape[-1])


def gqa_sdpa_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with one-token GQA steps run without copying K/V per query head
    (and reading a shared prefix once when the step passes `shared_prefix`)."""
    prefix = kwargs.pop("shared_prefix", None)
    if prefix is not None and prefix_readable(module, query, attention_mask, dropout, kwargs):
        k, v = prefix.kv[module.layer_idx]
        return prefix_decode_attention(query, key, value, attention_mask, scaling, k, v, prefix.own), None
    if packable(module, query, attention_mask, dropout, kwargs):
        return packed_decode_attention(query, key, value, attention_mask, scaling), None
    return _original()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                       is_causal=is_causal, **kwargs)


def _original() -> Any:
    if _ORIGINAL is not None:
        return _ORIGINAL
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def install() -> None:
    """Make `gqa_sdpa_attention` transformers' "sdpa" attention in this process (idempotent)."""
    global _ORIGINAL
    from transformers import AttentionInterface

    current = AttentionInterface._global_mapping.get("sdpa")
    if current is gqa_sdpa_attention:
        return
    _ORIGINAL = current
    AttentionInterface.register("sdpa", gqa_sdpa_attention)
    log.debug("generation: GQA decode steps attend without repeat_kv (rlfactory.generation.gqa_attention)")


def uninstall() -> None:
    """Give transformers back its own "sdpa" attention (tests and before/after timings)."""
    global _ORIGINAL
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get("sdpa") is gqa_sdpa_attention and _ORIGINAL is not None:
        AttentionInterface.register("sdpa", _ORIGINAL)
    _ORIGINAL = None


def installed() -> bool:
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping.get("sdpa") is gqa_sdpa_attention
