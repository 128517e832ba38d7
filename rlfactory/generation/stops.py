"""Stop checks: after each sampled token, is the row done (a stop token, a stop string, its
max_new_tokens)? Stop strings are matched on the decoded tail only for tokens that could complete
one (a per-vocabulary gate worked out once per set of stop strings)."""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from rlfactory.generation.rows import Row


class StopCheck:
    """`tokenizer`: anything with `decode(ids)` (needed only for stop strings); `model()`: the model
    (its vocabulary size covers ids the tokenizer does not know)."""

    def __init__(self, tokenizer: Any, model: Callable[[], nn.Module], stats: dict[str, float]) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.stats = stats
        self.gates: dict[tuple[str, ...], list[bool]] = {}

    def record(self, rows: list[Row], tokens: list[int], lps: list[float]) -> list[Row]:
        """Append each row's new token and logprob; mark and return the rows that are done."""
        finished = []
        self.stats["tokens"] += len(rows)
        for row, tok, lp in zip(rows, tokens, lps):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            if tok in row.stop_ids:
                row.finish, row.stop_token = "stop", tok
            elif row.stop_strings and self._gate(row.stop_strings)[tok] and self._hit_stop_string(row):
                row.finish = "stop"
            elif len(row.tokens) >= row.req.max_new_tokens:
                row.finish = "length"
            if row.finish is not None:
                finished.append(row)
        return finished

    def _gate(self, stops: tuple[str, ...]) -> list[bool]:
        """Per token id: could this token complete one of `stops`? (Cheap filter before decoding.)"""
        gate = self.gates.get(stops)
        if gate is None:
            vocab = int(getattr(getattr(self.model(), "config", None), "vocab_size", 0) or 0)
            n_tok = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else vocab
            lasts = {s[-1] for s in stops if s}
            one_each = [[i] for i in range(n_tok)]
            if hasattr(self.tokenizer, "batch_decode"):
                texts = self.tokenizer.batch_decode(one_each, skip_special_tokens=False)
            else:
                texts = [self.tokenizer.decode(ids, skip_special_tokens=False) for ids in one_each]
            gate = [any(c in t for c in lasts) or "\ufffd" in t or t == "" for t in texts]
            gate += [True] * max(0, vocab - n_tok)
            self.gates[stops] = gate
        return gate

    def _hit_stop_string(self, row: Row) -> bool:
        window = max(len(s) for s in row.stop_strings) + 4
        tail = self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=False)
        return any(s in tail for s in row.stop_strings)
