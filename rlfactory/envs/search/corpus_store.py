"""A JSON-lines corpus read by position: the byte offset of every line is kept (8 bytes a passage),
and a document is read from the file when asked for, so a million passages cost megabytes, not
the gigabytes of holding every document in memory.

The retriever answers a document as JSON (`json_bytes`): a corpus line that names its `id` first
(Search-R1's layout, `{"id": ..., "contents": ...}`) is that JSON already, so it is sliced from the
file and spliced into the answer as it is, not parsed and encoded again (at 1M passages the parse
and the encoding cost more than the slice: ~10 vs ~2 us a document)."""

from __future__ import annotations

import json
import mmap
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

# A JSON object whose first key is "id": the line holds its id, so it is the answer's JSON as it is.
_ID_FIRST = re.compile(rb"\s*\{\s*\"id\"\s*:")


def dumps(content: Any) -> bytes:
    """JSON as Starlette's JSONResponse renders it (compact, UTF-8, no NaN)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


@runtime_checkable
class Documents(Protocol):
    """Documents by position, each also as the JSON the retriever answers for it."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> dict[str, Any]: ...

    def json_bytes(self, i: int) -> bytes:
        """Document `i` as JSON (UTF-8): equal, once parsed, to `self[i]`."""


class InMemoryDocs:
    """A list of document dicts as `Documents`: each encoded once, on first use."""

    def __init__(self, docs: Sequence[dict[str, Any]]) -> None:
        self.docs = docs
        self._encoded: list[bytes | None] = [None] * len(docs)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.docs[i]

    def json_bytes(self, i: int) -> bytes:
        got = self._encoded[i]
        if got is None:
            got = self._encoded[i] = dumps(self.docs[i])
        return got


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
    defaults to the 0-based line number). Its lines were checked by `scan_corpus` when the index
    was built."""

    def __init__(self, path: str | Path, offsets: np.ndarray, lines: np.ndarray) -> None:
        self.path = Path(path)
        self.offsets, self.lines = offsets, lines
        with open(self.path, "rb") as f:  # mapped: reads from many threads at once need no lock
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if len(offsets) else None

    def __len__(self) -> int:
        return len(self.offsets)

    def _line(self, i: int) -> bytes:
        start = int(self.offsets[i])
        end = self._map.find(b"\n", start)
        return self._map[start:end if end >= 0 else len(self._map)]

    def __getitem__(self, i: int) -> dict[str, Any]:
        doc = json.loads(self._line(i))
        doc.setdefault("id", str(int(self.lines[i])))
        return doc

    def json_bytes(self, i: int) -> bytes:
        """The corpus line itself where it names its id first; else parsed, given its id, encoded."""
        line = self._line(i)
        if _ID_FIRST.match(line):
            return line.strip()
        return dumps(self[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
