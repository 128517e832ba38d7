"""Caches kept between a trajectory's turns: when a request names a `session`, its finished row's
cache (every token fed so far) is kept, and that session's next request prefills only the ids
after it, when the kept ids prefix its prompt. Read and written from the generation thread and
from the event loop (`forget`), hence the lock."""

from __future__ import annotations

import threading

from rlfactory.generation.kv_cache import RowKV
from rlfactory.generation.rows import Row


class KeptCaches:
    def __init__(self, stats: dict[str, float]) -> None:
        self.sessions: dict[str, tuple[list[int], RowKV]] = {}
        self.lock = threading.Lock()
        self.stats = stats

    def __len__(self) -> int:
        return len(self.sessions)

    def forget(self, session: str | None = None) -> None:
        """Drop the cache kept for `session` (None: for every session)."""
        with self.lock:
            if session is None:
                self.sessions.clear()
            else:
                self.sessions.pop(session, None)

    def reuse(self, row: Row) -> tuple[RowKV | None, list[int]]:
        """(kept cache, ids still to prefill) for a request; the kept ids must prefix the prompt."""
        prompt = row.req.prompt_ids
        if row.req.session is None:
            return None, prompt
        with self.lock:
            kept = self.sessions.pop(row.req.session, None)
        if kept is None or len(kept[0]) >= len(prompt) or prompt[: len(kept[0])] != kept[0]:
            return None, prompt
        self.stats["reused_tokens"] += len(kept[0])
        return kept[1], prompt[len(kept[0]):]

    def keep(self, row: Row, kv: RowKV) -> None:
        """Keep a finished row's cache (every token fed so far) under its session."""
        if row.req.session is None:
            return
        ids = list(row.req.prompt_ids) + row.tokens[:-1]  # the last token was never fed
        if len(ids) == kv[0][0].shape[1]:
            with self.lock:
                self.sessions[row.req.session] = (ids, kv)
