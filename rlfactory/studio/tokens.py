"""Per-token text for the trajectory viewer: each token id decoded alone, with the run's tokenizer.

The tokenizer is the one saved with the run's latest checkpoint, else the one of `model.path`
(a folder, or `tiny:<size>` from rlfactory's cache). `tokenizer.json` is read with the
`tokenizers` library (fast, no model code); a folder without one falls back to transformers.
Decoded pieces are cached per tokenizer, so a trajectory of 1,000 tokens costs dict lookups.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from rlfactory.studio.runs import checkpoints, read_config

_lock = threading.Lock()
_decoders: dict[str, "TokenText"] = {}


class TokenText:
    """id -> the text of that token alone (cached); `raw(id)` is the vocabulary entry."""

    def __init__(self, decode_one: Callable[[int], str], raw: Callable[[int], str | None]) -> None:
        self._decode_one, self._raw = decode_one, raw
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        hit = self._cache.get(token_id)
        if hit is None:
            try:
                hit = self._decode_one(token_id)
            except Exception:  # an id outside the vocabulary
                hit = f"<{token_id}>"
            self._cache[token_id] = hit
        return hit

    def raw(self, token_id: int) -> str | None:
        try:
            return self._raw(token_id)
        except Exception:
            return None


def tokenizer_folder(run: Path) -> Path | None:
    """Where the run's tokenizer lives, or None when there is none to be found."""
    ckpts = checkpoints(run)
    if ckpts:
        return run / "checkpoints" / ckpts[-1] / "model"
    model_path = str((read_config(run).get("model") or {}).get("path", ""))
    if model_path.startswith(("tiny:", "tiny-vl:")):
        from rlfactory.tiny.cache import cached_dir

        return cached_dir(model_path)
    p = Path(model_path)
    return p if model_path and p.is_dir() else None


def token_text_for(folder: Path | None) -> TokenText | None:
    """A cached TokenText for the tokenizer in `folder` (None when it cannot be loaded)."""
    if folder is None:
        return None
    key = str(folder.resolve())
    with _lock:
        hit = _decoders.get(key)
        if hit is not None:
            return hit
    tt = _load(folder)
    if tt is not None:
        with _lock:
            _decoders[key] = tt
    return tt


def _load(folder: Path) -> TokenText | None:
    tj = folder / "tokenizer.json"
    if tj.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tj))
        return TokenText(lambda i: tok.decode([i], skip_special_tokens=False), tok.id_to_token)
    try:
        from transformers import AutoTokenizer

        hf: Any = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception:
        return None
    return TokenText(lambda i: hf.decode([i], skip_special_tokens=False), lambda i: hf.convert_ids_to_tokens(i))
