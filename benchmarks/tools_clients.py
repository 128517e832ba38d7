"""Servers and the baseline client of `benchmarks/tools.py`."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import AsyncIterator

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ECHO = {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.echo"]}
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


@contextlib.asynccontextmanager
async def sdk_session(server: dict) -> AsyncIterator[ClientSession]:
    """The mcp SDK's own client on a stdio server: `stdio_client` + `ClientSession`, initialized."""
    params = StdioServerParameters(command=server["command"], args=server["args"], env=dict(os.environ))
    with open(os.devnull, "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                yield session


def _cpu_of(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time so far of `pid` and its descendants (Linux /proc; None elsewhere).

    A stdio server runs under `unshare` and a small init when it has a PID namespace of its own,
    so the server itself is a grandchild of the pid the runner reports.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        cpu = _cpu_of(p)
        if cpu is None and p == pid:
            return None
        total += cpu or 0.0
        todo.extend(children.get(p, []))
    return total
