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

QWEN3_1_7B: dict[str, Any] = {**QWEN3_0_6B, "hidden_size": 2048, "intermediate_size": 6144}
"""Qwen3-1.7B (28 layers, 16 query / 8 KV heads of 128, tied embeddings)."""

QWEN3_4B: dict[str, Any] = {**QWEN3_0_6B, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                            "num_attention_heads": 32}
"""Qwen3-4B (36 layers, 32 query / 8 KV heads of 128, tied embeddings)."""

QWEN3_8B: dict[str, Any] = {**QWEN3_0_6B, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                            "num_attention_heads": 32, "tie_word_embeddings": False}
"""Qwen3-8B (36 layers, 32 query / 8 KV heads of 128, its own LM head)."""

ARCHITECTURES = {"qwen3-0.6b": QWEN3_0_6B, "qwen3-1.7b": QWEN3_1_7B, "qwen3-4b": QWEN3_4B, "qwen3-8b": QWEN3_8B}


def random_model(arch: str = "qwen3-0.6b", *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 attn_implementation: str = "sdpa", device: str | torch.device = "cpu", **overrides: Any) -> Any:
    """A randomly initialised Qwen3ForCausalLM of `arch` (overrides change fields, e.g. a smaller
    `num_hidden_layers` for a smoke run), in `dtype`, in eval mode, made on `device` (a GPU
    initialises an 8B model in seconds; the CPU takes minutes)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {sorted(ARCHITECTURES)}")
    torch.manual_seed(seed)
    config = Qwen3Config(**{**ARCHITECTURES[arch], **overrides}, attn_implementation=attn_implementation)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialised in dtype: no float32 copy of an 8B model first
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype).eval()
