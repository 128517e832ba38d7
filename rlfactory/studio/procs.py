"""Process facts from /proc (Linux): a process tree, and whether a pid is still the same process."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of `pid`, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def alive(pid: int, start: int | None = None) -> bool:
    """Is `pid` running (and, given its start time, still the same process)?"""
    st = _stat(pid)
    return st is not None and (start is None or st[1] == start)


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return st[1] if st else None


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of `pid`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is not None:
            children.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[1]
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append((p, starts[p]))
        todo.extend(children.get(p, []))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
