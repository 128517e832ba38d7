"""rlfactory's tiny vision-language model: `tiny-vl:1m[:seed]`.

A randomly initialised Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`: a small vision tower with
window attention and a patch merger, in front of a Qwen2 text model with 3-D M-RoPE), with
rlfactory's tiny tokenizer (`tiny:1m`'s, same seed) extended by Qwen's vision tokens, the
`qwen3_vl` chat template (rlfactory/chat/templates), and a Qwen2-VL image processor configured
offline with small patches (4 px, merged 2x2: one image token per 8x8 pixels) and small images
(between 16x16 and 64x64 pixels after resizing: 4 to 64 image tokens).

The folder has the files of a real Qwen2.5-VL checkpoint (config.json, model.safetensors,
tokenizer files, preprocessor_config.json), so the same code loads either. Cached like `tiny:1m`
(`tiny-vl-<size>-seed<seed>` under the rlfactory cache; rlfactory/tiny/cache.py), built once,
concurrently safe.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlfactory.tiny.model import save_quietly

VL_RECIPE_VERSION = 1
VL_PREFIX = "tiny-vl:"
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]


@dataclass(frozen=True)
class TinyVision:
    """The vision tower and the image processor of one tiny VL size."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int


VL_SIZES: dict[str, tuple[str, TinyVision]] = {
    # (the text model's tiny size, the vision tower)
    "1m": ("1m", TinyVision(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, patch_size=4, merge_size=2,
                            temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64)),
}
VL_SIZES["1m-compact"] = VL_SIZES["1m"]

VL_TEMPLATES: dict[str, str] = {"1m-compact": "qwen3_vl_compact"}
"""The chat template of a size, when not `qwen3_vl`. `1m-compact` lists tools as one line of
signatures (`Tools: zoom(picture, x, y, size)`) instead of Qwen3's JSON schemas and instructions
(~450 of the tiny tokenizer's tokens per prompt): the CPU demo's prompts are ~5x shorter."""


def parse_tiny_vl_spec(spec: str) -> tuple[str, int] | None:
    """`tiny-vl:1m` -> ("1m", 0); `tiny-vl:1m:3` -> ("1m", 3); anything else -> None."""
    if not spec.startswith(VL_PREFIX):
        return None
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1] not in VL_SIZES:
        raise ValueError(f"bad tiny vision-language model spec {spec!r}: use tiny-vl:<size>[:<seed>], "
                         f"size one of {sorted(VL_SIZES)}")
    try:
        seed = int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise ValueError(f"bad tiny vision-language model spec {spec!r}: the seed must be an integer") from None
    return parts[1], seed


def is_current_vl(path: Path) -> bool:
    """Whether `path` holds a tiny VL model of this recipe."""
    from rlfactory.tiny.model import MARKER

    try:
        return json.loads((path / MARKER).read_text()).get("vl_recipe_version") == VL_RECIPE_VERSION
    except (OSError, ValueError):
        return False


def make_tiny_vl_model(out: str | Path, size: str = "1m", seed: int = 0) -> Path:
    """Write a tiny Qwen2.5-VL model, its tokenizer and image processor to `out`; deterministic by `seed`."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlfactory.chat.templates import load_template
    from rlfactory.tiny.model import MARKER, SIZES
    from rlfactory.tiny.tokenizer import SPECIAL_TOKENS, _added, train_tokenizer

    if size not in VL_SIZES:
        raise ValueError(f"unknown tiny vision-language size {size!r}; choose one of {sorted(VL_SIZES)}")
    text_size, vision = VL_SIZES[size]
    arch = SIZES[text_size]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(seed, arch.vocab_size)
    tok.add_special_tokens([_added(t, special=True) for t in VISION_TOKENS])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS + VISION_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
        clean_up_tokenization_spaces=False, model_max_length=4096,
    )
    hf_tok.chat_template = load_template(VL_TEMPLATES.get(size, "qwen3_vl"))
    hf_tok.save_pretrained(out)
    tok_config_path = out / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")

    processor = Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.merge_size,
                                         temporal_patch_size=vision.temporal_patch_size,
                                         min_pixels=vision.min_pixels, max_pixels=vision.max_pixels)
    processor.save_pretrained(out)
    pre_path = out / "preprocessor_config.json"
    pre = json.loads(pre_path.read_text())
    pre["image_processor_type"] = "Qwen2VLImageProcessor"  # as a real checkpoint names it; loads with or without torchvision
    pre_path.write_text(json.dumps(pre, indent=2) + "\n")

    ids = {t: tok.token_to_id(t) for t in VISION_TOKENS + ["<|im_end|>", "<|endoftext|>"]}
    head_dim = arch.hidden_size // arch.num_attention_heads
    half = head_dim // 2
    hw = half * 3 // 8  # M-RoPE splits the rotary half among (time, height, width) as Qwen2.5-VL does: 2:3:3
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=tok.get_vocab_size(), hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
            num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
            num_key_value_heads=arch.num_key_value_heads, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [half - 2 * hw, hw, hw]},
            eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], bos_token_id=None,
            tie_word_embeddings=True),
        vision_config=dict(
            depth=vision.depth, hidden_size=vision.hidden_size, num_heads=vision.num_heads,
            intermediate_size=vision.intermediate_size, patch_size=vision.patch_size,
            spatial_merge_size=vision.merge_size, temporal_patch_size=vision.temporal_patch_size,
            window_size=vision.patch_size * vision.merge_size * 4, fullatt_block_indexes=[vision.depth - 1],
            out_hidden_size=arch.hidden_size),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    save_quietly(model, out)
    marker = {"vl_recipe_version": VL_RECIPE_VERSION, "size": size, "seed": seed, "text": asdict(arch),
              "template": VL_TEMPLATES.get(size, "qwen3_vl"),
              "vision": asdict(vision), "num_parameters": sum(p.numel() for p in model.parameters())}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out
