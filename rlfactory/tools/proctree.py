"""Keeping track of every process an MCP server starts, so that stopping the server stops them all.

A process group is not enough: a grandchild that calls `setsid()` leaves the group, and one that
outlives its parent is handed to init, where no parent-child link leads back to the server. So a
stdio server runs, where the kernel allows it, in a PID namespace of its own (`unshare --pid
--fork --kill-child --mount-proc`, with `ns_init.py` as the namespace's first process): when the
server exits or is killed, the kernel kills every process left in its namespace. `unshare` needs
root, or unprivileged user namespaces (then `--user --map-current-user` is added). Where neither is
available, the fallback is the server's process group plus a sweep of /proc at stop: its
descendants (by parent PID) and every process that still holds one of its protocol pipes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from rlfactory.tools import process

log = logging.getLogger("rlfactory.tools.stdio")

NS_INIT = str(Path(__file__).with_name("ns_init.py"))
_UNSHARE_FLAGS = ["--pid", "--fork", "--kill-child", "--mount-proc"]
_UNPROBED = object()
_prefix: object = _UNPROBED


async def namespace_prefix() -> list[str] | None:
    """The command prefix that runs a program in a fresh PID namespace, or None where that fails.

    Probed once per process, by running `true` that way (a few milliseconds).
    """
    global _prefix
    if _prefix is _UNPROBED:
        _prefix = await _try_unshare()
    return _prefix  # type: ignore[return-value]


async def _try_unshare() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        log.info("no `unshare` here: MCP servers are stopped by process group and /proc sweep only")
        return None
    flags = _UNSHARE_FLAGS if os.geteuid() == 0 else ["--user", "--map-current-user", *_UNSHARE_FLAGS]
    prefix = [unshare, *flags, sys.executable, "-I", "-S", NS_INIT]
    try:
        proc = await asyncio.create_subprocess_exec(
            *prefix, "true", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 10.0)
    except (OSError, TimeoutError) as e:
        log.warning("cannot run MCP servers in their own PID namespace (%s); falling back to process groups", e)
        return None
    if proc.returncode != 0:
        why = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        log.warning("cannot run MCP servers in their own PID namespace (%s); falling back to process groups", why[0])
        return None
    return prefix


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc, zombies too (none where there is no /proc)."""
    return {pid: st.ppid for pid, st in process.process_table().items()}


def _ancestors(pid: int, parents: dict[int, int]) -> list[int]:
    out, seen = [], {pid}
    while (pid := parents.get(pid, 0)) > 1 and pid not in seen:
        out.append(pid)
        seen.add(pid)
    return out


def leftovers(server_pid: int, pipes: set[int], server_alive: bool) -> list[int]:
    """Processes a server left behind, found in /proc: its descendants (by parent PID, while the
    server itself is alive: afterwards its PID may be reused) and every process that holds one of
    its protocol pipes (`pipes`: inodes) and is not this process or another child of it (a worker
    this process forked holds the pipes too, and is none of the server's business)."""
    parents = _parent_pids()
    me = os.getpid()
    found: set[int] = set()
    if server_alive:
        found.update(p for p in parents if server_pid in _ancestors(p, parents))
    for p in _pipe_holders(pipes, parents):
        line = _ancestors(p, parents)
        if p != me and (server_pid in line or me not in line):
            found.add(p)
    found.discard(server_pid)
    return sorted(found)


def _pipe_holders(inodes: set[int], parents: dict[int, int]) -> list[int]:
    """Processes with an open descriptor on one of the pipes `inodes`."""
    if not inodes:
        return []
    wanted = {f"pipe:[{i}]" for i in inodes}
    out = []
    for pid in parents:
        try:
            fds = os.scandir(f"/proc/{pid}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        out.append(pid)
                        break
                except OSError:
                    continue
    return out


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of `pids`; those already gone are skipped."""
    process.signal_each(pids, signal.SIGKILL)
