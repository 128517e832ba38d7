"""Text to ids by the Rust tokenizer's own encode (rlfactory/chat/encode.py): the same ids as
transformers' `encode(text, add_special_tokens=False)` on tiny:1m's tokenizer and the real Qwen3
and Llama 3 ones, used by ChatTemplate.encode (prompts and observations of native rollouts) once
the first checks agree, and transformers' road wherever the quick one could differ."""

from __future__ import annotations

import copy
import logging
import random

import pytest

import rlfactory.chat.encode as encode_mod
from rlfactory.chat import ChatTemplate, make_tool_manager
from rlfactory.chat.encode import CHECKS, backend_encode, encode_text
from rlfactory.tools.base import ToolResult

PIECES = ["\n", "\n\n", " ", "  ", "\t", "Hel", "lo", "lo world", "<|im_start|>", "<|im_end|>", "<tool_call>", "</think>",
          "<think>", "é", "e\u0301", "😀", "123", "!!", "'s", "{\"a\": 1}", "<|im_start|>assistant\n", "\r\n",
          "<|begin_of_text|>", "<|eot_id|>", "ü", "中文", "  x"]


@pytest.fixture(params=["tiny", "qwen3", "llama3"])
def tok(request):
    """A fresh copy (the checks are counted per tokenizer object)."""
    return copy.deepcopy(request.getfixturevalue(f"{request.param}_tokenizer"))


def full(tok, text):
    return list(tok.encode(text, add_special_tokens=False))


def test_the_rust_encode_gives_transformers_ids_on_random_texts(tok):
    quick = backend_encode(tok)
    assert quick is not None
    rnd = random.Random(1)
    for _ in range(60):
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 12)))
        assert quick(text) == full(tok, text), text
        assert encode_text(tok, text) == full(tok, text), text


class CountingEncode:
    """Wraps a tokenizer's `encode` (transformers' road) and counts its calls."""

    def __init__(self, tok):
        self.inner, self.calls = tok.encode, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_chat_template_encode_takes_the_quick_road_after_the_checks(tok):
    counting = CountingEncode(tok)
    tok.encode = counting  # on this copy only: the class's encode path is unchanged
    template = ChatTemplate(tok, tok.chat_template)
    texts = [f"<|im_start|>user\nAdd {i} and {i + 1}.<|im_end|>\n" for i in range(3 * CHECKS)]
    ids = [template.encode(t) for t in texts]
    assert counting.calls == CHECKS  # transformers' encode only for the checks, then the Rust encode alone
    assert ids == [counting.inner(t, add_special_tokens=False) for t in texts]


def test_a_native_rollouts_prompt_and_observation_ids_are_unchanged(tok):
    # the families encode through ChatTemplate.encode: the ids equal transformers' encode of the same texts
    chatml = tok.convert_tokens_to_ids("<|im_start|>") not in (None, tok.unk_token_id)
    tm = make_tool_manager(tok, "qwen3" if chatml else "llama3")
    messages = [{"role": "system", "content": "You add numbers é 😀."}, {"role": "user", "content": "Add 2 and 3."}]
    for _ in range(CHECKS + 2):  # past the checks
        prompt = tm.render_prompt(messages, [])
        obs = tm.render_observation([ToolResult(text="5\n\n  ok")])
    assert prompt == full(tok, tm.render_prompt_text(messages, []))
    assert obs == full(tok, tm.observation_text([ToolResult(text="5\n\n  ok")]))


def test_a_quick_encode_that_differs_is_caught_by_the_first_check(tok, caplog, monkeypatch):
    wrong_calls = []

    def wrong(t):
        wrong_calls.append(t)
        return [*full(tok, t), 0]

    monkeypatch.setattr(encode_mod, "backend_encode", lambda _tok: wrong)
    with caplog.at_level(logging.WARNING, logger="rlfactory.chat"):
        assert encode_text(tok, "Hello") == full(tok, "Hello")
    assert "differs from transformers'" in caplog.text and len(wrong_calls) == 1
    assert encode_text(tok, "Hello world") == full(tok, "Hello world") and len(wrong_calls) == 1  # not asked again


def test_transformers_road_where_the_quick_one_could_differ(tok):
    truncating = copy.deepcopy(tok)
    truncating.backend_tokenizer.enable_truncation(4)  # transformers turns it off for its own encode
    assert backend_encode(truncating) is None
    text = "one two three four five six seven"
    assert encode_text(truncating, text) == full(tok, text) and len(full(tok, text)) > 4
    splitting = copy.deepcopy(tok)
    splitting.split_special_tokens = True
    assert backend_encode(splitting) is None

    class OwnEncode(type(tok)):
        def encode(self, text, **kwargs):
            return [1, *super().encode(text, **kwargs)]

    own = copy.deepcopy(tok)
    own.__class__ = OwnEncode
    assert backend_encode(own) is None and encode_text(own, "Hi") == [1, *full(tok, "Hi")]
    assert backend_encode(object()) is None
