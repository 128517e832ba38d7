"""Sandbox start-up cost: the strict (bubblewrap) sandbox against the weak one and a bare python.

    .venv/bin/python benchmarks/sandbox.py

`weak` is the unisolated process model (a `python -I` under a small supervisor, with rlimits, the
per-call cgroup, a network and a mount namespace where the kernel allows them, a temp dir), so
strict / weak is the price of the isolation; `split` is strict without its per-call cgroup
(memory_mb split among fewer processes, as where none can be made), so strict / split is the
cgroup's price. Figures: (1) per-call latency of a trivial program, calls one after another, modes
interleaved so that load changes on the shared machine hit all of them alike; (2) a batch of
concurrent calls, as a rollout issues them; (3) where the strict overhead goes: bwrap building the
same sandbox around `true`.
Target: a strict call costs at most 2x a weak one, sequentially and in the batch.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import time

from rlfactory.envs import sandbox, sandbox_proc
from rlfactory.envs.sandbox_bwrap import bwrap_command, enter_layout, sandbox_layout

CODE = "print(123 * 456)"
ROUNDS, BATCH, BATCHES = 30, 32, 5


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


async def one(mode: str) -> float:
    t0 = time.perf_counter()
    if mode == "bare":
        proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-c", CODE, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert out == b"56088\n"
    elif mode == "split":  # strict without its cgroup: memory_mb split among fewer processes
        real = sandbox_proc.cgroup_home
        sandbox_proc.cgroup_home = lambda: "no cgroup (benchmark)"
        try:
            r = await sandbox.arun_python(CODE, mode="strict")
        finally:
            sandbox_proc.cgroup_home = real
        assert r.stdout == "56088\n", r.text()
    else:
        r = await sandbox.arun_python(CODE, mode=mode)
        assert r.stdout == "56088\n", r.text()
    return time.perf_counter() - t0


async def bwrap_true() -> float:
    """bwrap building the strict sandbox around /bin/true: the sandbox's own cost, without python."""
    layout = sandbox_layout(run_as_root=os.geteuid() == 0)
    code_fd = os.memfd_create("main.py")
    info_r, info_w = os.pipe()
    argv = bwrap_command(shutil.which("bwrap"), layout, code_fd=code_fd, info_fd=info_w, disk_bytes=64 * 2**20)
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, "/bin/true", preexec_fn=lambda: enter_layout(layout),
                                                pass_fds=(code_fd, info_w), env={"PATH": "/usr/bin:/bin"})
    rc = await proc.wait()
    dt = time.perf_counter() - t0
    for fd in (code_fd, info_r, info_w):
        os.close(fd)
    assert rc == 0
    return dt


async def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load()} at start")
    print(f"bwrap: {shutil.which('bwrap')}, running as uid {os.geteuid()} "
          f"(the sandbox runs as {sandbox_layout(os.geteuid() == 0).drop_to or os.geteuid()})")
    reason = sandbox.sandbox_support()
    if reason:
        print(f"strict sandbox unavailable here: {reason}")
        return
    sandbox.check_sandbox("weak")  # prints the weak mode's warning line once
    modes = ("bare", "weak", "strict", "split")
    for m in modes:  # warm the page cache and the probes
        await one(m)
    seq = {m: [] for m in modes}
    extra = []
    for _ in range(ROUNDS):
        for m in modes:
            seq[m].append(await one(m))
        extra.append(await bwrap_true())
    med = {m: statistics.median(v) for m, v in seq.items()}
    print(f"(1) per-call latency of `{CODE}`, {ROUNDS} calls each, one after another, medians (p90)")
    for m in modes:
        print(f"    {m:6s} {med[m] * 1e3:7.1f} ms  ({statistics.quantiles(seq[m], n=10)[-1] * 1e3:.1f} ms)")
    ratio1 = med["strict"] / med["weak"]
    print(f"    strict / weak = {ratio1:.2f}  (target <= 2.0)  {'PASS' if ratio1 <= 2.0 else 'FAIL'}")
    print(f"    strict / bare python = {med['strict'] / med['bare']:.2f}")
    print(f"(2) {BATCH} concurrent calls, median wall of {BATCHES} batches (modes interleaved)")
    walls = {m: [] for m in modes}
    for _ in range(BATCHES):
        for m in modes:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(m) for _ in range(BATCH)))
            walls[m].append(time.perf_counter() - t0)
    wall = {m: statistics.median(v) for m, v in walls.items()}
    for m in modes:
        print(f"    {m:6s} {wall[m]:6.2f} s  ({BATCH / wall[m]:.0f} calls/s)")
    ratio2 = wall["strict"] / wall["weak"]
    print(f"    strict / weak = {ratio2:.2f}  (target <= 2.0)  {'PASS' if ratio2 <= 2.0 else 'FAIL'}")
    print(f"    the per-call cgroup: strict / split (strict without one) = {med['strict'] / med['split']:.2f} "
          f"one after another ({(med['strict'] - med['split']) * 1e3:+.1f} ms), "
          f"{wall['strict'] / wall['split']:.2f} in the batch")
    print("(3) where the strict overhead goes (medians)")
    print(f"    bwrap building the sandbox around /bin/true: {statistics.median(extra) * 1e3:.1f} ms "
          f"(strict - weak = {(med['strict'] - med['weak']) * 1e3:.1f} ms)")
    print(f"load average {load()} at end (other work on this machine shares the CPUs)")


if __name__ == "__main__":
    asyncio.run(main())
