"""Text to token ids without transformers' batch road: `encode_text(tokenizer, text)`.

`tokenizer.encode(text, add_special_tokens=False)` of a Hugging Face fast tokenizer ends in the Rust
tokenizer's `encode_batch`, which lets go of the GIL and must then win it back; beside a thread
that runs Python (the decode thread of the local generator) that wait lasts up to the
interpreter's switch interval (0.33 ms vs 5.7 ms wall for 190 characters beside a busy thread, at
the default 5 ms). The Rust tokenizer's own `encode` holds the GIL and gives the same ids when
transformers adds nothing around it: a `TokenizersBackend` whose `encode` path is not overridden,
that does not split special tokens, and whose backend has no truncation or padding set (transformers
turns those off for an encode without them). Even then the first `CHECKS` texts per tokenizer
object are also encoded by transformers and compared; a difference logs one line with the first
differing token, and that tokenizer is encoded by transformers from then on (the ids of the
check are what the call gets).

One function for every caller: the chat templates (`ChatTemplate.encode`: prompts and
observations of native rollouts), the gateway (serve/gateway_prefix.py) and the generation side.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from rlfactory.branches import first_difference

log = logging.getLogger("rlfactory.chat")

CHECKS = 16
"""Texts per tokenizer object encoded both ways and compared before the quick road is trusted."""


@dataclass
class _Road:
    """How one tokenizer is encoded: its quick encode (None: transformers'), and the checks done."""

    quick: Callable[[str], list[int]] | None
    checked: int = 0


_ROADS: weakref.WeakKeyDictionary[Any, _Road] = weakref.WeakKeyDictionary()


def backend_encode(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """The Rust tokenizer's own `encode` of a Hugging Face fast tokenizer, where it gives the ids of
    `tokenizer.encode(text, add_special_tokens=False)` by construction (module docstring); None
    for any other tokenizer. Unchecked: `encode_text` is the checked road."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False) or \
            getattr(backend, "encode_special_tokens", False) or \
            getattr(backend, "truncation", None) is not None or getattr(backend, "padding", None) is not None:
        return None
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # a transformers without it: its own road
        return None
    kind = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or kind.encode is not TokenizersBackend.encode or \
            kind._encode_plus is not TokenizersBackend._encode_plus:
        return None

    def encode(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    return encode


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """`list(tokenizer.encode(text, add_special_tokens=False))`, by `backend_encode` where that
    gives the same ids (checked on the first `CHECKS` texts of each tokenizer object)."""
    road = _road(tokenizer)
    if road.quick is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    ids = road.quick(text)
    if road.checked < CHECKS:
        road.checked += 1
        slow = list(tokenizer.encode(text, add_special_tokens=False))
        if slow != ids:
            at = first_difference(slow, ids)
            log.warning("the Rust tokenizer's own encode differs from transformers' (token %d: %r vs %r); this "
                        "tokenizer is encoded by transformers from now on", at, slow[at:at + 4], ids[at:at + 4])
            road.quick = None
            return slow
    return ids


def _road(tokenizer: Any) -> _Road:
    try:
        road = _ROADS.get(tokenizer)
    except TypeError:  # not weakly referable (nor hashable): transformers' road, each time
        return _Road(None)
    if road is None:
        road = _ROADS[tokenizer] = _Road(backend_encode(tokenizer))
    return road
