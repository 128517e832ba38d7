"""One cgroup per sandbox, so that its limits hold for all of its processes together (see
rlfactory.envs.sandbox).

An rlimit holds per process: six forks of 400 MB each pass a `memory_mb` of 512 MB. A cgroup holds
the sum. Each sandbox gets a cgroup of its own, made inside the trainer's own cgroup (so the
trainer's limits still hold above it), joined by the sandbox's first process between fork and exec,
and removed when the call returns:

- cgroup v2 (the unified hierarchy, where the trainer's cgroup may hand the memory controller to
  children): `memory.max`, `memory.swap.max` 0, `memory.oom.group` 1 (the kernel kills every process
  of the sandbox at once), `pids.max`;
- cgroup v1 (a `memory` hierarchy, and `pids` where mounted): `memory.limit_in_bytes` (and
  `memsw` where swap accounting is on), `pids.max`; the kernel's OOM killer takes one process and
  the caller then kills the rest.

Where neither can be made (no write access, a v2 cgroup that holds processes and so cannot hand
controllers to children), `cgroup_home()` says why in one line and the caller falls back to
splitting the limit among fewer processes.
"""

from __future__ import annotations

import functools
import os
import signal
import uuid
from dataclasses import dataclass

from rlfactory.tools.process import signal_each

PREFIX = "rlfactory-sandbox-"  # + the trainer's pid + a random part


@dataclass(frozen=True)
class CgroupHome:
    """Where sandbox cgroups are made: the trainer's own cgroup directory in each hierarchy."""

    version: int  # 2: one unified directory; 1: separate memory (and pids) hierarchies
    memory: str
    pids: str | None  # v1: the pids hierarchy's directory, None where not mounted; v2: == memory or None


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(root inside the filesystem, mount point, fs type, super options) of each mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, rest = pre.split(), post.split()
            if len(fields) >= 5 and len(rest) >= 3:
                out.append((fields[3], fields[4], rest[0], set(rest[2].split(","))))
    return out


def _own_dir(hierarchy: str, fstype: str, option: str | None) -> str | None:
    """The directory of this process's cgroup in `hierarchy` ("" is v2; else a v1 controller name)."""
    with open("/proc/self/cgroup") as f:
        paths = {}
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    own = paths.get(hierarchy)
    if own is None:
        return None
    for root, point, fs, opts in _mountinfo():
        if fs == fstype and (option is None or option in opts) and (own + "/").startswith(root.rstrip("/") + "/"):
            return os.path.normpath(os.path.join(point, own[len(root.rstrip("/")):].lstrip("/")))
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _v2_home() -> CgroupHome | str:
    own = _own_dir("", "cgroup2", None)
    if own is None:
        return "no cgroup v2 hierarchy"
    available = _read(os.path.join(own, "cgroup.controllers")).split()
    if "memory" not in available:
        return f"cgroup v2: no memory controller in {own}"
    wanted = [c for c in ("memory", "pids") if c in available]
    enabled = _read(os.path.join(own, "cgroup.subtree_control")).split()
    missing = [c for c in wanted if c not in enabled]
    if missing:
        try:
            _write(os.path.join(own, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing))
        except OSError as e:  # EBUSY: the cgroup holds processes (the trainer's), so no controllers for children
            return f"cgroup v2: cannot hand {'+'.join(missing)} to children of {own}: {e.strerror}"
    return CgroupHome(2, own, own if "pids" in wanted else None)


def _v1_home() -> CgroupHome | str:
    memory = _own_dir("memory", "cgroup", "memory")
    if memory is None:
        return "no cgroup v1 memory hierarchy"
    return CgroupHome(1, memory, _own_dir("pids", "cgroup", "pids"))


@functools.lru_cache(maxsize=1)
def cgroup_home() -> CgroupHome | str:
    """Where this process can make sandbox cgroups, or one line saying why it cannot. Probed once, by
    making (and removing) one."""
    reasons = []
    for find in (_v2_home, _v1_home):
        try:
            home = find()
        except OSError as e:
            home = f"{find.__name__[1:3]}: {e}"
        if isinstance(home, str):
            reasons.append(home)
            continue
        try:
            SandboxCgroup(home, memory_bytes=64 * 2**20, max_pids=4).remove()
            _remove_stale(home)
        except OSError as e:
            reasons.append(f"cgroup v{home.version}: cannot make a cgroup in {home.memory}: {e.strerror or e}")
            continue
        return home
    return "; ".join(reasons)


def _remove_stale(home: CgroupHome) -> None:
    """Remove the (empty) cgroups that trainers killed mid-call left behind: their names hold the pid
    of a process that is gone."""
    for parent in {home.memory, home.pids} - {None}:
        for name in os.listdir(parent):
            if name.startswith(PREFIX) and not os.path.exists(f"/proc/{name[len(PREFIX):].split('-')[0]}"):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:  # still holds a process (a sandbox of a trainer in another pid namespace)
                    pass


class SandboxCgroup:
    """One sandbox's cgroup (one directory per hierarchy in v1): made with its limits, joined by the
    sandbox's first process (`join`, between fork and exec), read (`oom_kills`), emptied and removed."""

    def __init__(self, home: CgroupHome, *, memory_bytes: int, max_pids: int | None) -> None:
        name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.version, self.memory_bytes = home.version, memory_bytes
        self.memory = os.path.join(home.memory, name)
        self.dirs = [self.memory]
        pids = os.path.join(home.pids, name) if home.pids and max_pids else None
        if pids and pids != self.memory:
            self.dirs.append(pids)
        self._procs = [os.path.join(d, "cgroup.procs").encode() for d in self.dirs]
        os.mkdir(self.memory)
        try:
            if pids and pids != self.memory:
                os.mkdir(pids)
            if self.version == 2:
                self._set("memory.max", memory_bytes)
                self._set("memory.swap.max", 0, optional=True)
                self._set("memory.oom.group", 1)
            else:
                self._set("memory.limit_in_bytes", memory_bytes)
                self._set("memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # only with swap accounting
            if pids:
                _write(os.path.join(pids, "pids.max"), str(max_pids))
        except OSError:
            self.remove()
            raise

    def _set(self, name: str, value: int, optional: bool = False) -> None:
        path = os.path.join(self.memory, name)
        if optional and not os.path.exists(path):
            return
        _write(path, str(value))

    def join(self) -> None:
        """Move the calling process into the cgroup (every child it makes is born there). Called in
        the child between fork and exec, while it still has the trainer's privileges."""
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def oom_kills(self) -> int:
        """How many processes the kernel has killed for passing the memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            lines = _read(os.path.join(self.memory, name)).splitlines()
        except OSError:
            return 0
        counts = dict(line.split() for line in lines if len(line.split()) == 2)
        return int(counts.get("oom_kill", 0)) + int(counts.get("oom_group_kill", 0))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in _read(os.path.join(self.memory, "cgroup.procs")).split()]
        except OSError:
            return []

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup, `setsid` daemons included; returns once it holds none
        that are alive (a v1 kill is a loop: a process may fork while the list is read)."""
        kill_file = os.path.join(self.memory, "cgroup.kill")
        if self.version == 2 and os.path.exists(kill_file):
            _write(kill_file, "1")
        for _ in range(1000):
            alive = self.pids()
            if not alive:
                return
            signal_each(alive, signal.SIGKILL)

    def remove(self) -> None:
        """Remove the cgroup's directories; an error names the one that stayed (it still holds a process)."""
        for d in reversed(self.dirs):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
