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
- rlimits: address space (`memory_mb`, MemoryError past it), CPU seconds, file size
  (`max_file_mb`), processes and threads (`max_processes`), no core dumps;
- an environment of its own (PATH, HOME, TMPDIR, locale, one BLAS thread): none of the trainer's
  variables (secrets) reach it;
- a kill of everything it started: the program is the child of the namespace's init; when the
  program exits, or the time limit kills the init, the kernel kills every process left in the
  namespace (`setsid` and double forks included) before the call returns; if the trainer dies, the
  sandbox dies with it (`--die-with-parent`).

Not covered: there is no seccomp filter (the program may make any system call an unprivileged
process in a user namespace may, so a kernel bug there is the remaining risk); CPU is bounded per
process in time, not in share; the number of (empty) files in `/tmp` is bounded only by time.

Where `bwrap` is missing or the kernel refuses the namespaces, `strict` refuses to run anything
(`SandboxUnavailable`, one line naming the cause). `weak` must be chosen by name: a `python -I`
process with the same rlimits (except processes), a minimal environment, a fresh temp dir and a
process-group kill, plus a network namespace where the kernel allows one. It is not a security
boundary: the program can read what the trainer's user can read, see and signal its processes,
write where that user can, and keep a `setsid` child alive. `check_sandbox("weak")` prints one
warning line saying so.

Output kept: the first `max_output_chars` of stdout, the last of stderr (the traceback end).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from rlfactory.config import ConfigError
from rlfactory.envs.sandbox_bwrap import bwrap_command, enter_layout, sandbox_layout

SANDBOX_MODES = ("strict", "weak")
BWRAP = "bwrap"  # looked up on PATH
_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_BOOTSTRAP = """
import sys
if {nproc}:
    import resource
    resource.setrlimit(resource.RLIMIT_NPROC, ({nproc}, {nproc}))
_src = open("main.py", encoding="utf-8").read()
_g = {{"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}}
del sys.argv[1:]
try:
    exec(compile(_src, "main.py", "exec"), _g)
except SystemExit:
    raise
except BaseException as _e:  # print the traceback without this bootstrap's frame
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""


class SandboxUnavailable(ConfigError):
    """The strict sandbox cannot run on this machine (the message names the cause and the opt-out,
    `env.options.sandbox: weak`); a ConfigError, so the CLI prints it as one line."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed for time; strict mode: 128 + N when killed by signal N
    timed_out: bool
    timeout_s: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def text(self) -> str:
        """What the model reads: stdout, then stderr and the exit status when there is any."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("stderr:\n" + self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append(f"error: timed out after {self.timeout_s:g} s (killed)")
        elif self.exit_code != 0:
            parts.append(f"exit status: {self.exit_code}")
        return "\n".join(parts) if parts else "(no output)"


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
    else:
        _warn_weak()


@functools.lru_cache(maxsize=1)
def _warn_weak() -> None:
    net = "blocked (network namespace)" if _weak_netns() else "OPEN"
    print(f"rlfactory: WARNING: sandbox: weak: model-written code runs WITHOUT isolation: it can read and "
          f"write what this user can, see and signal this user's processes, and leave processes behind; "
          f"network: {net}. Use sandbox: strict where bubblewrap and namespaces are available.",
          file=sys.stderr, flush=True)


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
        return await _arun_weak(code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                                max_file_mb=max_file_mb, stdin=stdin)
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


def _rlimits(memory_mb: int, timeout_s: float, max_file_mb: int) -> list[tuple[int, int]]:
    cpu = int(timeout_s) + 1
    return [(resource.RLIMIT_AS, memory_mb * 2**20), (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_FSIZE, max_file_mb * 2**20), (resource.RLIMIT_CORE, 0)]


def _set_rlimits(limits: list[tuple[int, int]]) -> None:
    for which, value in limits:
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(which, (value, hard))


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
        argv += [sys.executable, "-I", "-B", "-X", "utf8", "-c", _BOOTSTRAP.format(nproc=int(max_processes))]
        limits = _rlimits(memory_mb, timeout_s, max_file_mb)

        def preexec() -> None:  # in the child between fork and exec
            enter_layout(layout)
            _set_rlimits(limits)

        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(_SANDBOX_ENV, HOME="/tmp", TMPDIR="/tmp"), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=preexec,
            pass_fds=(code_fd, info_w), start_new_session=True)
    finally:
        os.close(code_fd)
        os.close(info_w)
    init = asyncio.ensure_future(_namespace_init(info_r))
    try:
        return await _supervise(proc, stdin, timeout_s, max_output_chars, kill=lambda: _end_namespace(proc, init))
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
                _kill_group(proc.pid)
        await proc.wait()
        if pidfd is not None:
            await asyncio.wait_for(_readable(pidfd), 10.0)
    finally:
        if pidfd is not None:
            os.close(pidfd)


async def _arun_weak(code: str, *, timeout_s: float, memory_mb: int, max_output_chars: int, max_file_mb: int,
                     stdin: str) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="rlfactory-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        limits, netns = _rlimits(memory_mb, timeout_s, max_file_mb), _weak_netns()

        def preexec() -> None:
            if netns:
                _unshare(netns)
            _set_rlimits(limits)

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-X", "utf8", "-c", _BOOTSTRAP.format(nproc=0),
            cwd=workdir, env=dict(_SANDBOX_ENV, HOME=workdir, TMPDIR=workdir), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=preexec,
            start_new_session=True)

        async def kill() -> None:
            _kill_group(proc.pid)
            await proc.wait()

        return await _supervise(proc, stdin, timeout_s, max_output_chars, kill=kill)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _supervise(proc: asyncio.subprocess.Process, stdin: str, timeout_s: float, max_output_chars: int,
                     kill) -> SandboxResult:
    """Feed stdin, wait up to `timeout_s`, run `kill()` (always: it also ends leftovers), collect output."""
    limit = max_output_chars * 4  # bytes; decoded and cut to characters below
    readers = asyncio.gather(_read_capped(proc.stdout, limit, False), _read_capped(proc.stderr, limit, True))
    try:
        proc.stdin.write(stdin.encode())
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        await kill()
    try:  # in weak mode a process that left the group could hold the pipes open: do not wait for it
        (out, out_cut), (err, err_cut) = await asyncio.wait_for(readers, 5.0)
    except asyncio.TimeoutError:
        (out, out_cut), (err, err_cut) = (b"", True), (b"output lost: the pipes stayed open", True)
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    truncated = out_cut or err_cut or len(stdout) > max_output_chars or len(stderr) > max_output_chars
    return SandboxResult(stdout=stdout[:max_output_chars], stderr=stderr[-max_output_chars:],
                         exit_code=None if timed_out else proc.returncode, timed_out=timed_out, timeout_s=timeout_s,
                         truncated=truncated)


async def _read_capped(stream: asyncio.StreamReader, limit: int, keep_tail: bool) -> tuple[bytes, bool]:
    """Drain `stream`, keeping the first (or last) `limit` bytes; never holds more than 2 * limit."""
    buf = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        buf += chunk
        if len(buf) > limit:
            truncated = True
            buf = buf[-limit:] if keep_tail else buf[:limit]
    return bytes(buf), truncated


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")


@functools.lru_cache(maxsize=1)
def _weak_netns() -> int:
    """The unshare flags that give the weak sandbox a network namespace here, or 0 when none can."""
    if not sys.platform.startswith("linux"):
        return 0
    for flags in (_CLONE_NEWNET, _CLONE_NEWUSER | _CLONE_NEWNET):
        try:
            r = subprocess.run([sys.executable, "-I", "-c", "pass"], preexec_fn=functools.partial(_unshare, flags),
                               capture_output=True, timeout=30)
            if r.returncode == 0:
                return flags
        except (OSError, subprocess.SubprocessError):
            continue
    return 0
