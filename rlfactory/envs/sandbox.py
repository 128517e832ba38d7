"""Run untrusted (model-written) Python in a sandbox.

Two modes, chosen by name (`mode`; the code env's `sandbox` option):

`strict` (the default) runs each program in a fresh `python -I` inside bubblewrap (`bwrap`, Debian's
`bubblewrap` package; `scripts/setup.sh` installs it), which gives the program

- its own user, PID, mount, network, IPC, UTS (and cgroup) namespaces: it sees only its own
  processes (the trainer and every other host process are invisible and cannot be signalled), has
  no capabilities, cannot create further user namespaces, and has no network: a network namespace
  holding only a loopback of its own (the host's 127.0.0.1 is not reachable);
- an unprivileged user: when the trainer runs as root the sandbox runs as uid 65534 (nobody);
- a read-only view of only what Python needs (`/usr`, the Python installation and the virtual
  environment, a few files of `/etc`): no home directories, no repository, no host `/tmp`;
- its own writable `/tmp` (cwd, HOME, TMPDIR), a tmpfs of `max_disk_mb`, and a 4 MiB `/dev/shm`;
  everything else is read-only; nothing is written on the host;
- rlimits: address space (`memory_mb` per process, MemoryError past it), CPU seconds, file size
  (`max_file_mb`), processes and threads (`max_processes`), no core dumps;
- `memory_mb` for all its processes together: a cgroup of its own per call (v2, or v1's memory and
  pids hierarchies; rlfactory.envs.sandbox_cgroup), inside the trainer's cgroup, limited to
  `memory_mb` plus what its tmpfs may hold (`max_disk_mb` + 4 MiB: tmpfs files are memory). Past it
  the kernel's OOM killer acts inside that cgroup only, and the whole sandbox is killed: the result
  says so (`killed`, "out of memory: ..."), the trainer is untouched. Where no cgroup can be made,
  `memory_mb` is split into 128 MB shares: bwrap and each of at most `memory_mb` / 128 - 1
  processes or threads (`max_processes` if lower) get one, so the sum still holds;
- an environment of its own (PATH, HOME, TMPDIR, locale, one BLAS thread): none of the trainer's
  variables (secrets) reach it;
- a kill of everything it started: the program is the child of the namespace's init; when the
  program exits, or the time limit kills the init, the kernel kills every process left in the
  namespace (`setsid` and double forks included) before the call returns; if the trainer dies, the
  sandbox dies with it (`--die-with-parent`).

Not covered: there is no seccomp filter (the program may make any system call an unprivileged
process in a user namespace may, so a kernel bug there is the remaining risk); CPU is bounded per
process in time, not in share; the number of (empty) files in `/tmp` is bounded only by time. The
program can learn the host paths of the Python installation and the virtual environment
(`sys.prefix`, module paths, `/proc/self/mountinfo`): a bind mount shows its source path in
mountinfo even at a neutral mount point, so bubblewrap cannot hide them cheaply (their contents are
what it sees, read-only).

Where `bwrap` is missing or the kernel refuses the namespaces, `strict` refuses to run anything
(`SandboxUnavailable`, one line naming the cause). `weak` must be chosen by name: a `python -I`
process with the same rlimits, a minimal environment, a fresh temp dir, the per-call cgroup where
one can be made, a supervisor that kills everything the program left behind (`setsid` children
holding stdout included) before the call returns, and where the kernel allows them a network
namespace and a mount namespace in which all but its temp dir is read-only (rlfactory.envs.sandbox_weak).
It is not a security boundary: the program can read what the trainer's user can read and see and
signal its processes. `check_sandbox("weak")` prints one warning line saying so and what holds here
(files read-only or writable, network, memory).

Output kept: the first `max_output_chars` of stdout, the last of stderr (the traceback end).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import shutil
import signal
import subprocess
import sys

from rlfactory.config import ConfigError
from rlfactory.envs.sandbox_bwrap import SHM_BYTES, bwrap_command, enter_layout, sandbox_layout
from rlfactory.envs.sandbox_proc import (RUN_PROGRAM, SANDBOX_ENV, SandboxResult, budget_summary, has_cgroup,
                                         make_budget, rlimits, set_rlimits, supervise)
from rlfactory.envs.sandbox_weak import arun_weak, weak_summary
from rlfactory.tools.process import signal_group

__all__ = ["SANDBOX_MODES", "SandboxResult", "SandboxUnavailable", "arun_python", "check_sandbox", "run_python",
           "sandbox_support"]

SANDBOX_MODES = ("strict", "weak")
BWRAP = "bwrap"  # looked up on PATH
_BOOTSTRAP = """
import sys
if {nproc}:
    import resource
    resource.setrlimit(resource.RLIMIT_NPROC, ({nproc}, {nproc}))
""" + RUN_PROGRAM


class SandboxUnavailable(ConfigError):
    """The strict sandbox cannot run on this machine (the message names the cause and the opt-out,
    `env.options.sandbox: weak`); a ConfigError, so the CLI prints it as one line."""


@functools.lru_cache(maxsize=None)
def sandbox_support() -> str | None:
    """None when the strict sandbox works here; otherwise one line saying why not. Probed once, by
    running a program in it."""
    if not sys.platform.startswith("linux"):
        return f"the strict sandbox needs Linux namespaces (this is {sys.platform})"
    if shutil.which(BWRAP) is None:
        return f"bubblewrap ({BWRAP}) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        r = _run_sync(_arun_strict("print('ok')", timeout_s=30.0, memory_mb=512, max_output_chars=2000,
                                   max_file_mb=1, max_disk_mb=1, max_processes=8, stdin=""))
    except (OSError, subprocess.SubprocessError) as e:  # a failed staging mount, an unusable binary
        return f"{BWRAP} failed to start: {e}"
    if r.stdout != "ok\n":  # bwrap's own message if it gave one, else how python failed inside
        lines = r.text().strip().splitlines()
        said = [line for line in lines if line.startswith("bwrap:")] or lines[-1:]
        return f"{BWRAP} could not build the sandbox: {said[0]}"
    return None


def check_sandbox(mode: str) -> None:
    """Call at start-up. `strict`: raises SandboxUnavailable (one line: the cause and the opt-out)
    unless the strict sandbox works here. `weak`: prints one warning line to stderr (once)."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode {mode!r}: expected one of {SANDBOX_MODES}")
    if mode == "strict":
        reason = sandbox_support()
        if reason:
            raise SandboxUnavailable(
                f"refusing to run model-written code: {reason}. To run it without isolation anyway, "
                f"set env.options.sandbox: weak (unsafe)")
        _note_no_cgroup()
    else:
        _warn_weak()


@functools.lru_cache(maxsize=1)
def _note_no_cgroup() -> None:
    """Say once, at start-up, that memory_mb is split here (each process gets a share, not all of it)."""
    if not has_cgroup():
        print(f"rlfactory: sandbox: {budget_summary(True)}", file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=1)
def _warn_weak() -> None:
    print(f"rlfactory: WARNING: sandbox: weak: model-written code runs WITHOUT isolation: it can read what "
          f"this user can and see and signal this user's processes; {weak_summary()}. Use sandbox: strict "
          f"where bubblewrap and namespaces are available.", file=sys.stderr, flush=True)


async def arun_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 4000,
                      max_file_mb: int = 16, max_disk_mb: int = 64, max_processes: int = 64,
                      mode: str = "strict", stdin: str = "") -> SandboxResult:
    """Run `code` as a program in a fresh sandboxed `python -I` (see the module docstring for what
    each `mode` guarantees). Raises SandboxUnavailable in `strict` mode where it cannot be built."""
    if mode == "strict":
        if not sandbox_support.cache_info().currsize:
            await asyncio.to_thread(sandbox_support)
        check_sandbox("strict")
        return await _arun_strict(code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                                  max_file_mb=max_file_mb, max_disk_mb=max_disk_mb, max_processes=max_processes,
                                  stdin=stdin)
    if mode == "weak":
        return await arun_weak(code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                               max_file_mb=max_file_mb, max_processes=max_processes, stdin=stdin)
    raise ValueError(f"sandbox mode {mode!r}: expected one of {SANDBOX_MODES}")


def run_python(code: str, **kwargs) -> SandboxResult:
    """Blocking `arun_python`; works inside a running event loop too (runs on a worker thread)."""
    return _run_sync(arun_python(code, **kwargs))


def _run_sync(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _arun_strict(code: str, *, timeout_s: float, memory_mb: int, max_output_chars: int, max_file_mb: int,
                       max_disk_mb: int, max_processes: int, stdin: str) -> SandboxResult:
    code_fd = os.memfd_create("main.py", os.MFD_CLOEXEC)
    info_r, info_w = os.pipe()
    try:
        os.write(code_fd, code.encode("utf-8"))
        os.lseek(code_fd, 0, os.SEEK_SET)
        layout = sandbox_layout(run_as_root=os.geteuid() == 0)
        argv = bwrap_command(shutil.which(BWRAP) or BWRAP, layout, code_fd=code_fd, info_fd=info_w,
                             disk_bytes=max_disk_mb * 2**20)
        budget = make_budget(memory_mb, max_processes, max_disk_mb + SHM_BYTES // 2**20, count_processes=True)
        argv += [sys.executable, "-I", "-B", "-X", "utf8", "-c", _BOOTSTRAP.format(nproc=budget.max_processes)]
        limits = rlimits(budget.memory_mb_each, timeout_s, max_file_mb)

        def preexec() -> None:  # in the child between fork and exec
            if budget.cgroup is not None:
                budget.cgroup.join()  # first: enter_layout hides /sys and drops root
            enter_layout(layout)
            set_rlimits(limits)

        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=dict(SANDBOX_ENV, HOME="/tmp", TMPDIR="/tmp"), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=preexec,
                pass_fds=(code_fd, info_w), start_new_session=True)
        except BaseException:
            if budget.cgroup is not None:
                budget.cgroup.remove()
            raise
    finally:
        os.close(code_fd)
        os.close(info_w)
    init = asyncio.ensure_future(_namespace_init(info_r))
    try:
        return await supervise(proc, stdin, timeout_s, max_output_chars, kill=lambda: _end_namespace(proc, init),
                               budget=budget)
    finally:
        init.cancel()
        os.close(info_r)


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _namespace_init(info_r: int) -> int | None:
    """A pidfd of the sandbox's init (pid 1 of its PID namespace), read from bwrap's --info-fd,
    which bwrap writes right after starting it; None if bwrap ends without one."""
    os.set_blocking(info_r, False)
    buf = b""
    while True:
        await _readable(info_r)
        chunk = os.read(info_r, 65536)
        if not chunk:
            return None
        buf += chunk
        try:
            pid = json.loads(buf)["child-pid"]
        except (ValueError, KeyError):
            continue
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            return None


async def _end_namespace(proc: asyncio.subprocess.Process, init: asyncio.Future) -> None:
    """Kill the sandbox's init if bwrap is still running (the kernel then kills every process in the
    namespace) and return once the init is gone. bwrap itself may exit before its init does (it
    reports the program's exit status first), so wait on the init: its pidfd turns readable only
    after the kernel has killed and reaped every other process of the namespace."""
    pidfd = None
    if proc.returncode is None and not init.done():
        init.cancel()  # still starting up: killing bwrap takes its init down too (--die-with-parent)
    else:
        try:
            pidfd = await asyncio.wait_for(init, 10.0)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
    try:
        if proc.returncode is None:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                try:
                    await asyncio.wait_for(proc.wait(), 10.0)
                except asyncio.TimeoutError:
                    pass
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        if pidfd is not None:
            await asyncio.wait_for(_readable(pidfd), 10.0)
    finally:
        if pidfd is not None:
            os.close(pidfd)


