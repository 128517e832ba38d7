"""Randomly initialised models of real architectures, for benchmarks: the speed of a model does not
depend on its weights, so no download is needed to measure it."""

from __future__ import annotations

from typing import Any

import torch

QWEN3_0_6B: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
"""Qwen3-0.6B's config.json, the fields that shape the compute."""

ARCHITECTURES = {"qwen3-0.6b": QWEN3_0_6B}


def random_model(arch: str = "qwen3-0.6b", *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 attn_implementation: str = "sdpa", **overrides: Any) -> Any:
    """A randomly initialised Qwen3ForCausalLM of `arch` (overrides change fields, e.g. a smaller
    `num_hidden_layers` for a smoke run), in `dtype`, on the CPU, in eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {sorted(ARCHITECTURES)}")
    torch.manual_seed(seed)
    config = Qwen3Config(**{**ARCHITECTURES[arch], **overrides}, attn_implementation=attn_implementation)
    return Qwen3ForCausalLM(config).to(dtype).eval()
