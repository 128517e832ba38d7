"""Reading metrics.jsonl / eval.jsonl fast, however long they are.

- `overview(path, points)`: the chart of a whole run. A file of up to `points` lines is read
  whole; a longer one is drawn from `points` lines picked at even byte offsets (seek, skip to the
  next line start, parse one line), so opening a run costs O(points), not O(file). This is the
  downsampling TensorBoard does for scalars; `window` reads a step range at full resolution.
- `JsonlTail`: live updates. It keeps the byte offset it has read up to and each `read_new()`
  parses only complete lines appended since; a file that shrank or was replaced (a resumed run
  rewrites its logs) is reported as a reset.
- `last_record(path)`: the last complete line, read from the end (the Runs table).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 8192


@dataclass
class Series:
    """Columnar records: `steps[i]` and `values[key][i]` (None where a record lacks the key)."""

    steps: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    total_lines: int | None = None  # lines in the file when known exactly
    sampled: bool = False  # True when only some lines were read
    end_offset: int = 0  # bytes covered (the start of the next, not yet complete, line)

    def add(self, record: dict[str, Any]) -> None:
        n = len(self.steps)
        self.steps.append(int(record.get("step", n + 1)))
        for key, value in record.items():
            if key == "step" or not isinstance(value, (int, float, type(None))) or isinstance(value, bool):
                continue
            col = self.values.get(key)
            if col is None:
                col = self.values[key] = [None] * n
            col.append(value)
        for col in self.values.values():
            if len(col) < n + 1:
                col.append(None)

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "values": self.values, "total_lines": self.total_lines,
                "sampled": self.sampled, "end_offset": self.end_offset}


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _line_at(f: Any, offset: int, size: int) -> tuple[int, bytes] | None:
    """The first complete line starting at or after `offset`: (its start, its bytes without \\n)."""
    start = offset
    if offset > 0:
        f.seek(offset - 1)
        buf = b""
        while True:  # skip the rest of the line `offset` falls into
            chunk = f.read(CHUNK)
            if not chunk:
                return None
            nl = chunk.find(b"\n")
            if nl >= 0:
                start += len(buf) + nl
                break
            buf += chunk
        f.seek(start)
    else:
        f.seek(0)
    data = b""
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return None  # no newline: the last line is still being written
        nl = chunk.find(b"\n")
        if nl >= 0:
            return start, data + chunk[:nl]
        data += chunk


def read_all(path: Path, start: int = 0, end: int | None = None) -> Series:
    """Every complete line of `path` in byte range [start, end)."""
    s = Series(sampled=False)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(0, end - start))
    cut = data.rfind(b"\n")
    lines = data[: cut + 1].splitlines() if cut >= 0 else []
    for line in lines:
        record = _parse(line)
        if record is not None:
            s.add(record)
    s.total_lines = len(lines)
    s.end_offset = start + cut + 1
    return s


def overview(path: str | Path, points: int = 2000) -> Series:
    """The records of a whole file, or an even sample of `points` of them (plus the last one)."""
    p = Path(path)
    if not p.is_file():
        return Series(total_lines=0)
    size = p.stat().st_size
    if size == 0:
        return Series(total_lines=0)
    with open(p, "rb") as f:
        head = f.read(min(size, CHUNK * 4))
    nl = head.find(b"\n")
    line_len = nl + 1 if nl >= 0 else size
    if size <= line_len * points * 1.5:  # small enough: every line
        return read_all(p)
    return _sampled(p, 0, size, points)


def window(path: str | Path, first_step: int, last_step: int, points: int = 2000) -> Series:
    """Records with first_step <= step <= last_step (steps increase along the file), all of
    them when they are at most ~`points` lines, else an even sample."""
    p = Path(path)
    if not p.is_file():
        return Series(total_lines=0)
    size = p.stat().st_size
    with open(p, "rb") as f:
        lo = _offset_of_step(f, size, first_step)
        hi = _offset_of_step(f, size, last_step + 1)
        head = _line_at(f, lo, size)
    if head is None or hi <= lo:
        return Series(total_lines=0)
    line_len = len(head[1]) + 1
    if hi - lo <= line_len * points * 1.5:
        s = read_all(p, lo, hi)
    else:
        s = _sampled(p, lo, hi, points)
    keep = [i for i, st in enumerate(s.steps) if first_step <= st <= last_step]
    out = Series(steps=[s.steps[i] for i in keep], values={k: [v[i] for i in keep] for k, v in s.values.items()},
                 total_lines=s.total_lines, sampled=s.sampled, end_offset=s.end_offset)
    return out


def _offset_of_step(f: Any, size: int, step: int) -> int:
    """Byte offset of the first line whose step >= `step` (binary search on line starts)."""
    lo, hi = 0, size
    while hi - lo > CHUNK:
        mid = (lo + hi) // 2
        found = _line_at(f, mid, size)
        if found is None:
            hi = mid
            continue
        record = _parse(found[1]) or {}
        if int(record.get("step", 0)) < step:
            lo = found[0] + len(found[1]) + 1
        else:
            hi = mid
    # finish linearly over at most one chunk's worth of lines
    pos = lo
    while pos < size:
        found = _line_at(f, pos, size)
        if found is None:
            return size
        record = _parse(found[1]) or {}
        if int(record.get("step", 0)) >= step:
            return found[0]
        pos = found[0] + len(found[1]) + 1
    return size


def _sampled(p: Path, start: int, end: int, points: int) -> Series:
    s = Series(sampled=True)
    seen: set[int] = set()
    last_end = start
    with open(p, "rb") as f:
        for i in range(points):
            found = _line_at(f, start + (end - start) * i // points, end)
            if found is None or found[0] >= end:
                break
            if found[0] in seen:
                continue
            seen.add(found[0])
            record = _parse(found[1])
            if record is not None:
                s.add(record)
            last_end = found[0] + len(found[1]) + 1
        tail = last_record(p, end) if end > last_end else None
        if tail is not None and (not s.steps or int(tail.get("step", 0)) > s.steps[-1]):
            s.add(tail)
    s.end_offset = _complete_end(p, end)
    return s


def _complete_end(p: Path, end: int) -> int:
    """The offset just after the last newline before `end`."""
    with open(p, "rb") as f:
        pos = end
        while pos > 0:
            n = min(CHUNK, pos)
            f.seek(pos - n)
            chunk = f.read(n)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                return pos - n + nl + 1
            pos -= n
    return 0


def last_record(path: str | Path, end: int | None = None) -> dict[str, Any] | None:
    """The last complete, parseable line before byte `end` (default: the end of the file)."""
    p = Path(path)
    if not p.is_file():
        return None
    with open(p, "rb") as f:
        pos = p.stat().st_size if end is None else end
        pos = _complete_end(p, pos)
        buf = b""
        while pos > 0:
            n = min(CHUNK, pos)
            f.seek(pos - n)
            buf = f.read(n) + buf
            pos -= n
            lines = buf.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or pos == 0:
                for line in reversed(lines if pos == 0 else lines[1:]):
                    record = _parse(line)
                    if record is not None:
                        return record
                if pos == 0:
                    return None
                buf = lines[0]
    return None


class JsonlTail:
    """Follows a growing JSON-lines file; `read_new()` parses only what was appended."""

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self._ident: tuple[int, int] | None = None
        self.bytes_read = 0  # what the reads cost, for tests and the benchmark

    def read_new(self) -> tuple[list[dict[str, Any]], bool]:
        """(records appended since the last call, whether the file was reset meanwhile)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            reset = self.offset > 0
            self.offset, self._ident = 0, None
            return [], reset
        ident = (st.st_dev, st.st_ino)
        reset = (self._ident is not None and ident != self._ident) or st.st_size < self.offset
        self._ident = ident
        if reset:
            self.offset = 0
        if st.st_size == self.offset:
            return [], reset
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        self.bytes_read += len(data)
        cut = data.rfind(b"\n")
        if cut < 0:
            return [], reset
        self.offset += cut + 1
        records = [r for line in data[: cut + 1].splitlines() if (r := _parse(line)) is not None]
        return records, reset
