"""Small helpers for the generation tests: a tiny randomly initialised Qwen3 (real transformers
model code, so the generator's batching, KV cache and sampling are exercised for real) and a
code-point tokenizer for the stop-string checks."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


class CodepointTokenizer:
    """id = code point: enough for a generator's `decode` of stop strings."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def tiny_random_lm(vocab: int = 300, seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
    )
    return Qwen3ForCausalLM(cfg).eval()


def reference(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt` from transformers' own `generate` (no stop token)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(k: int) -> list[list[int]]:
    """`k` prompts of different lengths (3 to 19 tokens) for the tiny random models."""
    return [[(7 * i + j) % 250 + 1 for j in range(3 + (5 * i) % 17)] for i in range(k)]
