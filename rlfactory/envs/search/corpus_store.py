"""A JSON-lines corpus read by position: the byte offset of every line is kept (8 bytes a passage),
and a document is parsed from the file when asked for, so a million passages cost megabytes, not
the gigabytes of holding every document in memory."""

from __future__ import annotations

import json
import mmap
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np


def scan_corpus(path: str | Path, on_doc: Callable[[int, str], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(byte offset, line number) of each document line of a JSON-lines corpus [n], int64; blank
    lines are skipped. `on_doc(index, contents)` sees every document as it is read. A line that is
    not a JSON object with a string `contents` is a ValueError naming the file and the line."""
    offsets, lines = [], []
    with open(path, "rb") as f:
        pos = 0
        for n, raw in enumerate(f, 1):
            start, pos = pos, pos + len(raw)
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise ValueError(f"{path}:{n}: a corpus line needs a string `contents` field")
            if on_doc is not None:
                on_doc(len(offsets), doc["contents"])
            offsets.append(start)
            lines.append(n - 1)
    return np.asarray(offsets, dtype=np.int64), np.asarray(lines, dtype=np.int64)


class CorpusStore:
    """The documents of a JSON-lines corpus by position (as `load_corpus` gives them: `id`
    defaults to the 0-based line number)."""

    def __init__(self, path: str | Path, offsets: np.ndarray, lines: np.ndarray) -> None:
        self.path = Path(path)
        self.offsets, self.lines = offsets, lines
        with open(self.path, "rb") as f:  # mapped: reads from many threads at once need no lock
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if len(offsets) else None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict[str, Any]:
        start = int(self.offsets[i])
        end = self._map.find(b"\n", start)
        doc = json.loads(self._map[start:end if end >= 0 else len(self._map)])
        doc.setdefault("id", str(int(self.lines[i])))
        return doc

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
