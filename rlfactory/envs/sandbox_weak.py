"""The weak sandbox (see rlfactory.envs.sandbox): a `python -I` with rlimits, no isolation from the
trainer's user, chosen by name where bubblewrap cannot run.

What it still does where the kernel lets it (probed once, `weak_confinement()`):
- namespaces: a network namespace (no network), and a mount namespace in which every mount is
  read-only except the call's temp dir (its cwd, HOME and TMPDIR) and a 4 MB `/dev/shm` of its
  own: the virtual environment, the checkout and `~/.cache` cannot be written. As root these need
  no user namespace; otherwise it takes one that maps the trainer's uid and gid to themselves;
- a supervisor: the program runs as the child of a small Python process that is a child subreaper
  (`PR_SET_CHILD_SUBREAPER`): every process the program leaves behind (`setsid` daemons holding
  stdout included) is re-parented to it and killed when the program exits or its time is up, before
  the call returns;
- a cgroup per call where one can be made (its memory and process count held together).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from rlfactory.envs.sandbox_proc import (RUN_PROGRAM, SANDBOX_ENV, SandboxResult, budget_summary, make_budget,
                                         rlimits, set_rlimits, supervise)
from rlfactory.tools.process import signal_group

_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
_PR_SET_CHILD_SUBREAPER = 36
SHM_BYTES = 4 * 2**20

# The supervisor: runs the program (RUN_PROGRAM) in a child; when it ends (or on SIGTERM, the time
# limit) kills every descendant left, re-parented here as this process is a subreaper, then exits
# with the program's status. Descendants are found by parent pid in /proc (it sees all of them).
_SUPERVISOR = """
import os, signal, sys, time
{nproc_line}
def _descendants():
    kids = {{}}
    for p in os.listdir("/proc") if os.path.isdir("/proc") else []:  # no /proc (not Linux): no leftovers found
        if p.isdigit():
            try:
                with open(f"/proc/{{p}}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [os.getpid()]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out
def _end(status):
    while True:
        for pid in _descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            os._exit(status)
        time.sleep(0.01)  # a descendant forked while the list was read: look again
_program = os.fork()
if _program == 0:
{program}
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: _end(128 + signal.SIGKILL))
for _fd in (0, 1, 2):
    os.close(_fd)
_status = os.waitstatus_to_exitcode(os.waitpid(_program, 0)[1])
_end(128 - _status if _status < 0 else _status)
"""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"weak sandbox: {what}: {os.strerror(err)}")


def _read_only(libc, path: bytes, clear: bool = False, recursive: bool = True) -> None:
    attr = (ctypes.c_uint64 * 4)(0 if clear else _MOUNT_ATTR_RDONLY, _MOUNT_ATTR_RDONLY if clear else 0, 0, 0)
    flags = _AT_RECURSIVE if recursive else 0
    _check(libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path, flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr {path.decode()}")


def confine(flags: int, workdir: str, uid: int, gid: int) -> None:
    """In the child between fork and exec: the namespaces of `flags`; with a mount namespace, every
    mount read-only except `workdir` and a fresh `/dev/shm`. Host mounts are untouched."""
    if sys.platform.startswith("linux"):
        _set_subreaper()
    if not flags:
        return
    libc = _libc()
    _check(libc.unshare(flags), "unshare")
    if flags & _CLONE_NEWUSER:  # map the trainer's ids to themselves, so files it writes have an owner
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    if flags & _CLONE_NEWNS:
        _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        _read_only(libc, b"/")
        _check(libc.mount(workdir.encode(), workdir.encode(), None, _MS_BIND, None), "bind the temp dir")
        _read_only(libc, workdir.encode(), clear=True, recursive=False)
        os.chdir(workdir)  # the cwd was entered before the bind: it would stay on the read-only mount below
        if os.path.isdir("/dev/shm"):
            options = f"size={SHM_BYTES},mode=1777".encode()
            _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, options),
                   "tmpfs on /dev/shm")


def _set_subreaper() -> None:
    _check(_libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


@functools.lru_cache(maxsize=1)
def weak_confinement() -> int:
    """The unshare flags `confine` can use here (0: none), probed once by writing inside and outside
    a temp dir from a confined python."""
    if not sys.platform.startswith("linux"):
        return 0
    probe = "import sys\nopen('ok', 'w').write('1')\ntry:\n    open(sys.argv[1], 'w')\nexcept OSError:\n    print('ro')"
    elsewhere = tempfile.mkdtemp(prefix="rlfactory-probe-")
    outside = os.path.join(elsewhere, "outside")
    uid, gid = os.getuid(), os.getgid()
    for flags in (_CLONE_NEWNS | _CLONE_NEWNET, _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET, _CLONE_NEWNET,
                  _CLONE_NEWUSER | _CLONE_NEWNET):
        workdir = tempfile.mkdtemp(prefix="rlfactory-probe-")
        try:
            r = subprocess.run([sys.executable, "-I", "-c", probe, outside], cwd=workdir, capture_output=True,
                               text=True, timeout=30, preexec_fn=functools.partial(confine, flags, workdir, uid, gid))
            works = r.returncode == 0 and os.path.exists(os.path.join(workdir, "ok"))
            if works and (r.stdout == "ro\n") == bool(flags & _CLONE_NEWNS):
                return flags
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if os.path.exists(outside):
                os.remove(outside)
    shutil.rmtree(elsewhere, ignore_errors=True)
    return 0


def weak_summary() -> str:
    """What the weak sandbox does here, for its warning line."""
    flags = weak_confinement()
    files = ("files read-only except its temp dir (a mount namespace)" if flags & _CLONE_NEWNS else
             "files: it can WRITE what this user can (the virtual environment, the checkout and ~/.cache included)")
    net = "blocked (network namespace)" if flags & _CLONE_NEWNET else "OPEN"
    return f"{files}; network: {net}; {budget_summary(bool(flags & _CLONE_NEWUSER))}"


async def arun_weak(code: str, *, timeout_s: float, memory_mb: int, max_output_chars: int, max_file_mb: int,
                    max_processes: int, stdin: str) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="rlfactory-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        flags = weak_confinement()
        budget = make_budget(memory_mb, max_processes, 0, count_processes=bool(flags & _CLONE_NEWUSER))
        limits, uid, gid = rlimits(budget.memory_mb_each, timeout_s, max_file_mb), os.getuid(), os.getgid()

        def preexec() -> None:
            if budget.cgroup is not None:
                budget.cgroup.join()
            confine(flags, workdir, uid, gid)
            set_rlimits(limits)

        nproc = budget.max_processes
        nproc_line = f"import resource\nresource.setrlimit(resource.RLIMIT_NPROC, ({nproc}, {nproc}))"
        bootstrap = _SUPERVISOR.format(
            nproc_line=nproc_line if nproc else "",
            program="\n".join("    " + line for line in RUN_PROGRAM.format().splitlines()))
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-X", "utf8", "-c", bootstrap,
                cwd=workdir, env=dict(SANDBOX_ENV, HOME=workdir, TMPDIR=workdir), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=preexec,
                start_new_session=True)
        except BaseException:
            if budget.cgroup is not None:
                budget.cgroup.remove()
            raise

        async def kill() -> None:
            if proc.returncode is None:  # the time limit: the supervisor ends the program and its leftovers
                try:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), 2.0)
                except (ProcessLookupError, asyncio.TimeoutError):
                    pass
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()

        return await supervise(proc, stdin, timeout_s, max_output_chars, kill=kill, budget=budget)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
