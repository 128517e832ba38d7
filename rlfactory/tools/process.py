"""The processes rlfactory starts and stops: the one place that signals them and reads /proc.

- Signalling: `signal_group(pgid, sig)` and `signal_each(pids, sig)` skip what is already gone
  (and what is not ours to signal); `stop_group(proc, grace_s)` stops a `Popen` started with
  `start_new_session=True` and its whole group: SIGTERM, `grace_s` to exit, then SIGKILL.
- Facts from /proc (Linux; elsewhere there is nothing to read and every answer is "none"): the
  process table (`process_table`), a process's `descendants` by parent pid, whether a pid is
  still the same process (`alive`, with the start time from `start_time`), its `cmdline`.

A pid alone can be reused once its process is reaped, so whoever waits on a process tree keeps
(pid, start time) pairs and asks `alive(pid, start)`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_GONE = (ProcessLookupError, PermissionError)  # exited already, or another user's process since reused


@dataclass(frozen=True)
class ProcStat:
    """What /proc/PID/stat says of a process: its parent, start time (clock ticks after boot) and
    state letter (R, S, D, Z = exited but not yet reaped, X = dead, ...)."""

    ppid: int
    start: int
    state: str

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


def stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat of `pid`, or None when there is no such process (or no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
    try:
        return ProcStat(int(fields[1]), int(fields[19]), fields[0].decode())
    except (IndexError, ValueError):
        return None


def process_table() -> dict[int, ProcStat]:
    """pid -> ProcStat of every process visible in /proc (empty where there is no /proc)."""
    table: dict[int, ProcStat] = {}
    if not os.path.isdir("/proc"):
        return table
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := stat(int(entry.name))) is not None:
            table[int(entry.name)] = st
    return table


def descendants(pid: int, table: dict[int, ProcStat] | None = None) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of `pid` (children first, then theirs)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, st in table.items():
        if st.live:
            children.setdefault(st.ppid, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append((p, table[p].start))
        todo.extend(children.get(p, []))
    return out


def alive(pid: int, start: int | None = None) -> bool:
    """Is `pid` running (not a zombie) and, given its start time, still the same process?"""
    st = stat(pid)
    return st is not None and st.live and (start is None or st.start == start)


def start_time(pid: int) -> int | None:
    """The start time of `pid` (clock ticks after boot), or None when it is gone."""
    st = stat(pid)
    return st.start if st is not None and st.live else None


def cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group `pgid`; False when the group is gone already."""
    try:
        os.killpg(pgid, sig)
    except _GONE:
        return False
    return True


def signal_each(pids: Iterable[int], sig: int) -> list[int]:
    """Send `sig` to each of `pids`; returns those it reached (the others were gone already)."""
    reached = []
    for p in pids:
        try:
            os.kill(p, sig)
        except _GONE:
            continue
        reached.append(p)
    return reached


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop `proc` (started with `start_new_session=True`) and its process group: SIGTERM, up to
    `grace_s` to exit, then SIGKILL and up to `grace_s` more (then `TimeoutExpired`). Reaps it."""
    if proc.poll() is not None:
        return
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` (started with `start_new_session=True`) and its process group now; reaps it."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
