"""Make rlfactory's tiny model: a trained tiny tokenizer plus a randomly initialised Qwen3 model.

The result is a standard Hugging Face directory (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat template) that
`AutoTokenizer.from_pretrained` and `AutoModelForCausalLM.from_pretrained` load offline.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

# Bump when the corpus, tokenizer or architecture recipe changes: cached models are rebuilt.
RECIPE_VERSION = 1
MARKER = "rlfactory-tiny.json"


@dataclass(frozen=True)
class TinySize:
    """Architecture of one tiny size. Parameters ~ vocab*hidden + layers*(attn + 3*hidden*inter)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int


SIZES: dict[str, TinySize] = {
    "1m": TinySize(vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, intermediate_size=384),
    "10m": TinySize(vocab_size=4096, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, intermediate_size=768),
}


def make_tiny_model(out: str | Path, size: str = "1m", seed: int = 0) -> Path:
    """Write a tiny tokenizer + Qwen3-architecture model to `out` and return it as a Path.

    Deterministic by `seed`: the same seed gives the same tokenizer.json and the same weights.
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from rlfactory.chat.templates import load_template
    from rlfactory.tiny.tokenizer import SPECIAL_TOKENS, train_tokenizer

    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose one of {sorted(SIZES)}")
    arch = SIZES[size]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(seed, arch.vocab_size)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    hf_tok.chat_template = load_template("qwen3")
    hf_tok.save_pretrained(out)
    # The generic class name loads in both transformers 4.x and 5.x (and so in vLLM/SGLang).
    tok_config_path = out / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")

    eos_id = tok.token_to_id("<|im_end|>")
    pad_id = tok.token_to_id("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = [eos_id, pad_id]
    model.generation_config.pad_token_id = pad_id
    save_quietly(model, out)

    marker = {"recipe_version": RECIPE_VERSION, "size": size, "seed": seed, "arch": asdict(arch),
              "num_parameters": sum(p.numel() for p in model.parameters())}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def save_quietly(model, out) -> None:
    """`model.save_pretrained(out)` without transformers' progress bar (the tiny models are made on
    first use, inside other commands' output)."""
    from transformers.utils import logging as hf_logging

    progress_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if progress_was_on:
            hf_logging.enable_progress_bar()
