"""Encoding a rendered prompt by reusing the ids of text the gateway already encoded.

An agent's calls re-send the whole conversation, so each call's rendered prompt starts with the
previous call's prompt (the merge case), and the episodes of one task share their system prompt
and tool list. Encoding only what is new saves most of the tokenizer's time per call, but the
ids must stay exactly `encode(text)`: encoding the new suffix on its own is not enough, because a
tokenizer merges across the join ("assistant\\n" + "\\nHi" encodes "\\n\\n" as one token; "Hel" +
"lo" as "Hello").

The join is made at an *anchor*: an added token of the tokenizer (`<|im_start|>`, `<|im_end|>`,
`<tool_call>`...) that is matched on the raw text (not normalized) and strips no whitespace on
either side. A Hugging Face tokenizer cuts the text at every added token before it normalizes,
pre-tokenizes or merges anything, so the ids before an anchor depend only on the text before it.
For a new text T and a known text K (with ids I) sharing a prefix of P characters, the last
anchor of K that lies wholly inside that prefix, at character s and token j, gives

    encode(T) == I[:j] + encode(T[s:])

and only T[s:] is encoded: the previous turn's assistant header, the model's turn, the new
observations and the next header in the merge case. Where the assumption could fail (a
tokenizer that is not cut at its added tokens), the first `verify` reuses with a tokenizer are
checked against a full encode (counted per tokenizer object, so a gateway made per round or per
run checks once); a mismatch logs one line naming the first differing token, turns reuse off for
that tokenizer, and the full encode is what the call gets. `verify=True` checks every call
(tests). The gateway's `encode` is the template's (`ChatTemplate.encode`), which takes the Rust
tokenizer's own encode where that gives transformers' ids (chat/encode.py, checked there).
"""

from __future__ import annotations

import logging
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlfactory.branches import first_difference
from rlfactory.text import valid_text

log = logging.getLogger("rlfactory.gateway")


@dataclass(frozen=True)
class KnownText:
    """A text with its ids (`encode(text)`) and its anchors: (first character, end character,
    token index) of each anchor token, in order."""

    text: str
    ids: list[int]
    anchors: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class PrefixStats:
    calls: int = 0
    reused_tokens: int = 0
    """Tokens taken from known ids instead of being encoded again."""
    encoded_chars: int = 0
    """Characters given to the tokenizer."""
    total_chars: int = 0
    """Characters of the texts asked for (what a full encode would have encoded)."""
    verified: int = 0


@dataclass
class _Trust:
    """What the checks found for one tokenizer: reuses verified, and whether one failed."""

    verified: int = 0
    broken: bool = False


_TRUST: weakref.WeakKeyDictionary[Any, _Trust] = weakref.WeakKeyDictionary()


class PrefixEncoder:
    """`encode(text)` (which must be a Hugging Face tokenizer's encode without added special
    tokens, e.g. ChatTemplate.encode) with the ids of known texts reused (module docstring).
    `tokenizer` names the anchors (its `added_tokens_decoder`); none, and every call encodes in
    full."""

    def __init__(self, encode: Callable[[str], list[int]], tokenizer: Any, verify: int | bool = 16) -> None:
        self._encode = encode
        self.verify_all = verify is True
        self.verify_first = 0 if verify is False else int(verify)
        self.stats = PrefixStats()
        try:
            self._trust = _TRUST.setdefault(tokenizer, _Trust())
        except TypeError:  # not weakly referable: this encoder's own checks
            self._trust = _Trust()
        anchors = _anchor_tokens(tokenizer)
        self._anchor_ids = frozenset(anchors.values())
        # longest first: the regex takes the first alternative that matches, the tokenizer the longest
        self._anchor_re = re.compile("|".join(re.escape(t) for t in sorted(anchors, key=len, reverse=True))) \
            if anchors else None
        self._has_anchors = self._anchor_re is not None

    @property
    def enabled(self) -> bool:
        """Whether prompts are encoded reusing known ids (anchors, and no failed check)."""
        return self._has_anchors and not self._trust.broken

    def encode(self, text: str, known: Sequence[KnownText | None] = ()) -> KnownText:
        """`text`'s ids, reusing the longest shared prefix with any of `known`."""
        self.stats.calls += 1
        self.stats.total_chars += len(text)
        valid, replaced = valid_text(text)
        if replaced:  # rare: `encode` replaces (and reports) them; positions below are in the valid text
            self.stats.encoded_chars += len(text)
            return self._known(valid, self._encode(text))
        best: tuple[int, int, KnownText] | None = None  # (characters reused, token index, known)
        if self.enabled:
            for k in known:
                if k is None or not k.anchors:
                    continue
                at = _anchor_before(k, _common_prefix(k.text, text))
                if at is not None and (best is None or at[0] > best[0]):
                    best = (*at, k)
        if best is None:
            ids = self._encode(text)
            self.stats.encoded_chars += len(text)
            s = 0
        else:
            s, j, k = best
            ids = k.ids[:j] + self._encode(text[s:])
            self.stats.encoded_chars += len(text) - s
            self.stats.reused_tokens += j
        if best is not None and (self.verify_all or self._trust.verified < self.verify_first):
            self._trust.verified += 1
            self.stats.verified += 1
            full = self._encode(text)
            if full != ids:
                at = first_difference(full, ids)
                log.warning("the tokenizer does not cut its text at added tokens (encoding from character %d "
                            "differs from a full encode at token %d: %r vs %r); the gateway now encodes every "
                            "prompt in full", s, at, full[at: at + 4], ids[at: at + 4])
                self._trust.broken = True
                ids = full
        return self._known(text, ids)

    def _known(self, text: str, ids: list[int]) -> KnownText:
        """`text` with its anchors, when each anchor string in it is one anchor token of `ids`;
        with none (nothing to reuse from it) when they do not pair up."""
        if not self.enabled:
            return KnownText(text, ids)
        spans = [m.span() for m in self._anchor_re.finditer(text)]  # type: ignore[union-attr]
        ids_at = [i for i, t in enumerate(ids) if t in self._anchor_ids]
        if len(spans) != len(ids_at):
            return KnownText(text, ids)
        return KnownText(text, ids, [(s, e, i) for (s, e), i in zip(spans, ids_at)])


def _anchor_tokens(tokenizer: Any) -> dict[str, int]:
    """The added tokens the tokenizer cuts the raw text at: content -> id."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out = {}
    for i, tok in added.items():
        content = getattr(tok, "content", None)
        if (content and not getattr(tok, "normalized", True) and not getattr(tok, "lstrip", True)
                and not getattr(tok, "rstrip", True) and not getattr(tok, "single_word", True)):
            out[content] = int(i)
    return out


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (C-level slice comparisons)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _anchor_before(known: KnownText, shared: int) -> tuple[int, int] | None:
    """(character, token index) of the last anchor of `known` that lies wholly inside its first
    `shared` characters, past the start; None when there is none."""
    for s, e, j in reversed(known.anchors):
        if e <= shared:
            return (s, j) if s > 0 else None
    return None
