"""Fixtures shared across test packages."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for the module (tiny models gain nothing from more, and on a shared
    CPU the thread pool's barriers stall badly); restores the setting afterwards. Modules opt in
    with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    """rlfactory's tiny:1m model (eval mode) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfactory.tiny import resolve_model

    path = resolve_model("tiny:1m")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
