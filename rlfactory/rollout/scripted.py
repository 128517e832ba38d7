"""ScriptedPolicy: make a real (e.g. untrained tiny) model follow a tool-use script.

A LocalGenerator `logits_processor` for benchmarks, tests and demos. For every model turn,
`plan(context_text)` returns how many free tokens to sample and which text to force after them:
  - the first `free` tokens are sampled from the model's own logits, with `banned` ids (markup and
    end-of-turn tokens) masked out, so they are real model text that cannot end the turn early;
  - then the tokens of `forced` and `end_token_id` are forced, one per step (all other logits
    are set to -inf, so their recorded logprob is 0).
The model still runs one forward pass per token, so generation cost is real; only the choice of
the forced tokens is scripted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlfactory.protocols import GenRequest


@dataclass
class TurnPlan:
    free: int
    """Tokens sampled freely before the forced text."""
    forced: str
    """Text forced after them (then the end-of-turn token)."""


def markup_ids(tokenizer: Any, chars: str = "<>") -> list[int]:
    """Special/added token ids and every token whose text contains one of `chars`."""
    out = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        out |= set(added().values())
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    out |= {i for i, t in enumerate(texts) if any(c in t for c in chars)}
    return sorted(out)


class ScriptedPolicy:
    """`logits_processor(requests, generated, logits)` that follows `plan` (see module doc)."""

    def __init__(
        self,
        tokenizer: Any,
        plan: Callable[[str], TurnPlan],
        end_token_id: int,
        banned: list[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.plan = plan
        self.end_token_id = int(end_token_id)
        self.banned = markup_ids(tokenizer) if banned is None else list(banned)
        self._cache: dict[int, tuple[GenRequest, int, list[int]]] = {}

    def _turn(self, req: GenRequest) -> tuple[int, list[int]]:
        hit = self._cache.get(id(req))
        if hit is not None and hit[0] is req:
            return hit[1], hit[2]
        if len(self._cache) > 8192:
            self._cache.clear()
        p = self.plan(self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False))
        forced = list(self.tokenizer.encode(p.forced, add_special_tokens=False)) + [self.end_token_id]
        self._cache[id(req)] = (req, p.free, forced)
        return p.free, forced

    def __call__(self, requests: list[GenRequest], generated: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
        free_rows, forced_rows, forced_tokens = [], [], []
        for i, (req, toks) in enumerate(zip(requests, generated)):
            free, forced = self._turn(req)
            j = len(toks)
            if j < free:
                free_rows.append(i)
            else:
                forced_rows.append(i)
                forced_tokens.append(forced[min(j - free, len(forced) - 1)])
        logits = logits.clone()
        if free_rows and self.banned:
            rows = torch.tensor(free_rows, device=logits.device)
            cols = torch.tensor(self.banned, device=logits.device)
            logits[rows.unsqueeze(1), cols.unsqueeze(0)] = float("-inf")
        if forced_rows:
            rows = torch.tensor(forced_rows, device=logits.device)
            logits[rows] = float("-inf")
            logits[rows, torch.tensor(forced_tokens, device=logits.device)] = 0.0
        return logits
