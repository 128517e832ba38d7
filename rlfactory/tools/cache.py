"""Result cache: an in-memory LRU in front of an optional sqlite file that survives restarts.

Keys are a tool's stable id plus its arguments in canonical JSON (sorted keys, no spaces), so the
same call with keys in another order hits. Entries expire after `ttl_s` (wall clock, so a TTL
also holds across runs). Only successful results are stored, and not those whose images weigh more
than MAX_IMAGE_BYTES (4096 remembered screenshots would be gigabytes of memory).
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import time
from collections import OrderedDict
from dataclasses import fields
from typing import Any, Callable

from rlfactory.images import Image
from rlfactory.tools.base import ToolResult

MAX_IMAGE_BYTES = 1024 * 1024
"""A result whose images' encoded bytes sum to more is not cached."""


def canonical_arguments(arguments: Any) -> str:
    """The one JSON spelling of an arguments object (the cache key's second half)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class ResultCache:
    """LRU of `(tool id, canonical arguments) -> ToolResult`, optionally backed by sqlite at `path`."""

    def __init__(self, max_entries: int = 4096, path: str | None = None, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`clock` gives the wall-clock time in seconds that expiry is measured by (time.time)."""
        self.max_entries = max_entries
        self.clock = clock
        self.ttl_s = ttl_s
        self.path = path
        self._mem: OrderedDict[tuple[str, str], tuple[ToolResult, float]] = OrderedDict()
        self._db: sqlite3.Connection | None = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS results (tool TEXT, args TEXT, result TEXT, expires REAL,"
                " PRIMARY KEY (tool, args))"
            )

    def get(self, tool: str, args: str) -> ToolResult | None:
        """The stored result or None; memory first, then disk (a disk hit is promoted to memory)."""
        key = (tool, args)
        entry = self._mem.get(key)
        if entry is not None:
            if entry[1] >= self.clock():
                self._mem.move_to_end(key)
                return entry[0]
            del self._mem[key]
        if self._db is None:
            return None
        row = self._db.execute("SELECT result, expires FROM results WHERE tool=? AND args=?", key).fetchone()
        if row is None:
            return None
        if row[1] < self.clock():
            self._db.execute("DELETE FROM results WHERE tool=? AND args=?", key)
            return None
        result = _result_from_json(row[0])
        self._remember(key, result, row[1])
        return result

    def put(self, tool: str, args: str, result: ToolResult) -> None:
        if sum(len(im.data or b"") for im in result.images) > MAX_IMAGE_BYTES:
            return
        expires = self.clock() + self.ttl_s if self.ttl_s is not None else float("inf")
        key = (tool, args)
        self._remember(key, result, expires)
        if self._db is not None:
            blob = _result_to_json(result)
            self._db.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", (tool, args, blob, min(expires, 1e300))
            )

    def _remember(self, key: tuple[str, str], result: ToolResult, expires: float) -> None:
        self._mem[key] = (result, expires)
        self._mem.move_to_end(key)
        while len(self._mem) > self.max_entries:
            self._mem.popitem(last=False)

    def __len__(self) -> int:
        return len(self._mem)

    def clear(self) -> None:
        self._mem.clear()
        if self._db is not None:
            self._db.execute("DELETE FROM results")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _result_to_json(result: ToolResult) -> str:
    """A result as one JSON text; images as base64 (they are part of what the model saw)."""
    d = {f.name: getattr(result, f.name) for f in fields(result) if f.name != "images"}
    d.update(cached=False, latency_s=0.0,
             images=[{**im.ref(), "data": base64.b64encode(im.data or b"").decode()} for im in result.images])
    return json.dumps(d, default=str)


def _result_from_json(blob: str) -> ToolResult:
    d = json.loads(blob)
    images = [Image(**{**im, "data": base64.b64decode(im["data"])}) for im in d.pop("images", None) or []]
    d.pop("image", None)  # an entry written before results carried several images
    return ToolResult(**d, images=images)
