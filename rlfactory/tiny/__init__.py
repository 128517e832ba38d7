"""rlfactory's own tiny model: a byte-level BPE tokenizer trained on a generated corpus and a
randomly initialised Qwen3-architecture model of ~1M or ~10M parameters (`tiny:1m`, `tiny:10m`); and
a tiny vision-language model (`tiny-vl:1m`, Qwen2.5-VL architecture, rlfactory/tiny/vl.py)."""

from rlfactory.tiny.cache import (build_once, cache_root, ensure_tiny, ensure_tiny_vl, parse_tiny_spec, resolve_model,
                                  tiny_dir)
from rlfactory.tiny.model import SIZES, TinySize, make_tiny_model

__all__ = ["SIZES", "TinySize", "build_once", "cache_root", "ensure_tiny", "ensure_tiny_vl", "make_tiny_model",
           "parse_tiny_spec", "resolve_model", "tiny_dir"]
