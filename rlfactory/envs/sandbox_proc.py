"""What both sandbox modes share (see rlfactory.envs.sandbox): the result, the program's bootstrap, the
rlimits, the memory budget (a cgroup, or the limit split among fewer processes) and the supervision
of one call (stdin, time limit, memory watch, kill, capped output)."""

from __future__ import annotations

import asyncio
import resource
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable

from rlfactory.envs.sandbox_cgroup import SandboxCgroup, cgroup_home

SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Without a cgroup, memory_mb is split into shares of this size (at least 4): the process outside
# (bwrap, or the weak mode's supervisor) and each process or thread the program may have get one.
SHARE_MB = 128

RUN_PROGRAM = """
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


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed for time; 128 + N when killed by signal N
    timed_out: bool
    timeout_s: float
    truncated: bool = False
    killed: str | None = None  # why the whole sandbox was killed before its time was up (its memory)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.killed and self.exit_code == 0

    def text(self) -> str:
        """What the model reads: stdout, then stderr and the exit status when there is any."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("stderr:\n" + self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append(f"error: timed out after {self.timeout_s:g} s (killed)")
        elif self.killed:
            parts.append(f"error: killed: {self.killed}")
        elif self.exit_code != 0:
            parts.append(f"exit status: {self.exit_code}")
        return "\n".join(parts) if parts else "(no output)"


@dataclass
class Budget:
    """How one call's memory_mb and max_processes are enforced: a cgroup holding them for all of its
    processes together, or (no cgroup here) per-process rlimits that add up to memory_mb."""

    cgroup: SandboxCgroup | None
    memory_mb_each: int  # RLIMIT_AS of every process
    max_processes: int  # RLIMIT_NPROC inside the sandbox (0: not set)
    memory_mb: int

    def killed_reason(self) -> str | None:
        if self.cgroup is not None and self.cgroup.oom_kills():
            return (f"out of memory: its processes together passed memory_mb={self.memory_mb}; "
                    f"every process of the sandbox was killed")
        return None


def make_budget(memory_mb: int, max_processes: int, files_mb: int, count_processes: bool) -> Budget:
    """The budget of one call. `files_mb`: what its own tmpfs may hold (tmpfs pages are memory the
    cgroup is charged for). `count_processes`: whether RLIMIT_NPROC counts only this sandbox's
    processes (a user namespace of its own), so that a split of memory_mb among them holds."""
    home = cgroup_home()
    if not isinstance(home, str):
        try:
            cgroup = SandboxCgroup(home, memory_bytes=(memory_mb + files_mb) * 2**20, max_pids=max_processes + 1)
            return Budget(cgroup, memory_mb, max_processes if count_processes else 0, memory_mb)
        except OSError as e:  # the probe made one, this call could not: this call splits the limit instead
            print(f"rlfactory: sandbox: no cgroup for this call ({e}); memory_mb split among fewer processes",
                  file=sys.stderr, flush=True)
    if not count_processes:
        return Budget(None, memory_mb, 0, memory_mb)
    shares = max(4, memory_mb // SHARE_MB)
    return Budget(None, memory_mb // shares, min(max_processes, shares - 1), memory_mb)


def has_cgroup() -> bool:
    return not isinstance(cgroup_home(), str)


def budget_summary(count_processes: bool) -> str:
    """One phrase: how memory_mb holds on this machine."""
    home = cgroup_home()
    if not isinstance(home, str):
        return f"memory_mb holds for all its processes together (a cgroup v{home.version} per call)"
    if count_processes:
        return (f"memory_mb is split into {SHARE_MB} MB shares among fewer processes (no cgroup here: "
                f"{home})")
    return f"memory_mb holds PER PROCESS only (no cgroup here: {home})"


def rlimits(memory_mb: int, timeout_s: float, max_file_mb: int) -> list[tuple[int, int]]:
    cpu = int(timeout_s) + 1
    return [(resource.RLIMIT_AS, memory_mb * 2**20), (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_FSIZE, max_file_mb * 2**20), (resource.RLIMIT_CORE, 0)]


def set_rlimits(limits: list[tuple[int, int]]) -> None:
    for which, value in limits:
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(which, (value, hard))


async def supervise(proc: asyncio.subprocess.Process, stdin: str, timeout_s: float, max_output_chars: int,
                    kill: Callable[[], Awaitable[None]], budget: Budget) -> SandboxResult:
    """Feed stdin, wait up to `timeout_s` (less if the cgroup runs out of memory), run `kill()`
    (always: it also ends leftovers), empty and remove the cgroup, collect output."""
    limit = max_output_chars * 4  # bytes; decoded and cut to characters below
    readers = asyncio.gather(_read_capped(proc.stdout, limit, False), _read_capped(proc.stderr, limit, True))
    try:
        proc.stdin.write(stdin.encode())
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass
    waiting = [asyncio.ensure_future(proc.wait())]
    if budget.cgroup is not None:  # v1 kills one process at a time: end the whole sandbox at the first
        waiting.append(asyncio.ensure_future(_out_of_memory(budget.cgroup)))
    try:
        done, _ = await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiting:
            w.cancel()
        await kill()
        if budget.cgroup is not None:
            budget.cgroup.kill_all()
    killed = budget.killed_reason()
    timed_out = not done and not killed
    try:
        if budget.cgroup is not None:
            await _remove(budget.cgroup)
    finally:
        try:  # a process that left the sandbox could hold the pipes open: do not wait for it
            (out, out_cut), (err, err_cut) = await asyncio.wait_for(readers, 5.0)
        except asyncio.TimeoutError:
            (out, out_cut), (err, err_cut) = (b"", True), (b"output lost: the pipes stayed open", True)
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    truncated = out_cut or err_cut or len(stdout) > max_output_chars or len(stderr) > max_output_chars
    code = proc.returncode
    return SandboxResult(stdout=stdout[:max_output_chars], stderr=stderr[-max_output_chars:],
                         exit_code=None if timed_out else (128 - code if code is not None and code < 0 else code),
                         timed_out=timed_out, timeout_s=timeout_s, truncated=truncated, killed=killed)


async def _out_of_memory(cgroup: SandboxCgroup) -> None:
    while not cgroup.oom_kills():
        await asyncio.sleep(0.05)


async def _remove(cgroup: SandboxCgroup) -> None:
    """rmdir the cgroup once its last (killed) process has been reaped; a cgroup left behind is
    said in one line, never an error of the call."""
    for attempt in range(50):
        try:
            cgroup.remove()
            return
        except OSError as e:
            if attempt == 49:
                print(f"rlfactory: sandbox: cgroup {cgroup.memory} left behind: {e.strerror}", file=sys.stderr)
                return
            cgroup.kill_all()
            await asyncio.sleep(0.02)


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
