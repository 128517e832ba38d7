"""The strict sandbox's bubblewrap command line and the filesystem view it gets (see rlfactory.envs.sandbox).

The view holds, read-only, `/usr` (and the top-level `/bin`, `/lib*`, `/sbin` links or dirs), the
Python installation and virtual environment in use, and the few `/etc` files the dynamic linker and
`time` read. When the trainer runs as root, bwrap runs as uid/gid 65534 (nobody) so that the
sandbox is an unprivileged user outside its namespace too (RLIMIT_NPROC then holds: the kernel
does not apply it to root). A Python that nobody cannot reach (say under `/root`, mode 0700) is
first bind-mounted, by the trainer's child while it is still root, into a tmpfs over `/sys` in a
private mount namespace that only that bwrap process sees; nothing changes on the host.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass

NOBODY = 65534
SHM_BYTES = 4 * 2**20
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
# Where a tmpfs holding the staged binds is mounted, in the private namespace only: a directory
# every Linux has and that neither bwrap (nor a bwrap binary's path) nor the sandbox's view needs.
_STAGE = "/sys"


@dataclass(frozen=True)
class Layout:
    """What bwrap binds, and what the trainer's child does before it execs bwrap."""

    binds: tuple[tuple[str, str], ...]  # (source as bwrap sees it, destination in the sandbox)
    symlinks: tuple[tuple[str, str], ...]  # (target, link in the sandbox)
    staged: tuple[tuple[str, str], ...]  # (host path, stage path) bind-mounted before dropping root
    drop_to: int | None  # the uid and gid bwrap runs as, when the trainer is root


def _ro_paths() -> list[str]:
    """Host paths the sandbox sees read-only, without any one inside another."""
    wanted = ["/usr", sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable)), *_ETC]
    wanted += [f"/{d}" for d in _TOP if os.path.isdir(f"/{d}") and not os.path.islink(f"/{d}")]
    named = {os.path.abspath(p) for p in wanted if os.path.exists(p)}
    kept: list[str] = []  # each path under its name and its real path (a venv's python links to the base)
    for path in sorted(named | {os.path.realpath(p) for p in named}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


@functools.lru_cache(maxsize=2)
def sandbox_layout(run_as_root: bool) -> Layout:
    paths = _ro_paths()
    symlinks = tuple((os.readlink(f"/{d}"), f"/{d}") for d in _TOP if os.path.islink(f"/{d}"))
    if not run_as_root:
        return Layout(tuple((p, p) for p in paths), symlinks, (), None)
    staged = tuple((p, f"{_STAGE}/{i}") for i, p in enumerate(paths))
    return Layout(tuple((stage, p) for p, stage in staged), symlinks, staged, NOBODY)


def enter_layout(layout: Layout) -> None:
    """In the child, before exec: stage the binds (root only) and drop to the unprivileged user."""
    if layout.staged:
        libc = ctypes.CDLL(None, use_errno=True)

        def check(rc: int, what: str) -> None:
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sandbox staging: {what}: {os.strerror(err)}")

        check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        check(libc.mount(b"tmpfs", _STAGE.encode(), b"tmpfs", 0, b"mode=0755,size=64k"), f"tmpfs on {_STAGE}")
        for src, stage in layout.staged:
            if os.path.isdir(src):
                os.mkdir(stage)
            else:
                os.close(os.open(stage, os.O_CREAT | os.O_WRONLY, 0o644))
            check(libc.mount(src.encode(), stage.encode(), None, _MS_BIND | _MS_REC, None), f"bind {src}")
    if layout.drop_to is not None:
        os.setgroups([])
        os.setgid(layout.drop_to)
        os.setuid(layout.drop_to)


def bwrap_command(bwrap: str, layout: Layout, *, code_fd: int, info_fd: int, disk_bytes: int) -> list[str]:
    """bwrap's argv up to (not including) the command: namespaces, the read-only view, `/tmp` (a
    tmpfs of `disk_bytes` holding `main.py`, read from `code_fd`), `/dev/shm`, `/proc` of its own."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--info-fd", str(info_fd)]
    # bwrap mounts in argument order, a later mount covering an earlier one: a path under /tmp
    # (a virtualenv in /tmp/...) is bound after the sandbox's own /tmp, or that would hide it.
    in_tmp = [(src, dest) for src, dest in layout.binds if dest.startswith("/tmp/")]
    for src, dest in layout.binds:
        if (src, dest) not in in_tmp:
            argv += ["--ro-bind", src, dest]
    for target, link in layout.symlinks:
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
             "--size", str(disk_bytes), "--tmpfs", "/tmp", "--file", str(code_fd), "/tmp/main.py"]
    for src, dest in in_tmp:
        argv += ["--ro-bind", src, dest]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return argv
