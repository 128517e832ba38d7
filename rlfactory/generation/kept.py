"""Caches kept between a trajectory's turns: when a request names a `session`, its finished row's
cache (every token fed so far) is kept, and that session's next request prefills only the ids
after it, when the kept ids prefix its prompt. Read and written from the generation thread and
from the event loop (`forget`), hence the lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rlfactory.generation.kv_cache import RowKV
from rlfactory.generation.rows import Row
from rlfactory.generation.vision import VisionPrefill


@dataclass
class Kept:
    ids: list[int]
    """Every token the cache holds, in order."""
    kv: RowKV
    images: tuple[str, ...]
    """Content hashes of the images whose pixels it was made with, in order (those of its request)."""


class KeptCaches:
    def __init__(self, stats: dict[str, float]) -> None:
        self.sessions: dict[str, Kept] = {}
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

    def reuse(self, row: Row, vision: VisionPrefill | None = None, model: Any = None
              ) -> tuple[RowKV | None, list[int]]:
        """(kept cache, ids still to prefill) for a request; the kept ids must prefix the prompt. A
        kept cache that holds the request's images otherwise than a fresh prefill would (its end
        cuts one, or it fed an image's pads as text or with other pixels) is cut back to before the
        first such image, which is prefilled again (`vision.usable_past`); for a request without
        images, a cache made with pixels is not used."""
        prompt = row.req.prompt_ids
        if row.req.session is None:
            return None, prompt
        with self.lock:
            kept = self.sessions.pop(row.req.session, None)
        if kept is None or len(kept.ids) >= len(prompt) or prompt[: len(kept.ids)] != kept.ids:
            return None, prompt
        n = len(kept.ids)
        if row.req.images and vision is not None:
            n = vision.usable_past(model, prompt, row.req.images, n, kept.images)
        elif kept.images:
            n = 0
        if n == 0:
            return None, prompt
        self.stats["reused_tokens"] += n
        kv = kept.kv if n == len(kept.ids) else [(k[:, :n], v[:, :n]) for k, v in kept.kv]
        return kv, prompt[n:]

    def keep(self, row: Row, kv: RowKV) -> None:
        """Keep a finished row's cache (every token fed so far) under its session."""
        if row.req.session is None:
            return
        ids = list(row.req.prompt_ids) + row.tokens[:-1]  # the last token was never fed
        if len(ids) == kv[0][0].shape[1]:
            images = tuple(im.sha256 for im in row.req.images or ())
            with self.lock:
                self.sessions[row.req.session] = Kept(ids, kv, images)
