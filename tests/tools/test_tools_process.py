"""rlfactory.tools.process on real process trees: signalling groups and pids, stopping politely then
by force, and what /proc says (descendants, start times, command lines)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rlfactory.tools import process

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")

# A parent that starts a child which starts a grandchild, prints "parent child grandchild" pids and
# waits. IGNORE_TERM=1 makes every one of them ignore SIGTERM (only SIGKILL ends them).
TREE = r"""
import os, signal, subprocess, sys, time
if os.environ.get("IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
level = int(sys.argv[1])
if level < 2:
    kid = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(level + 1), sys.argv[2]], stdout=subprocess.PIPE)
    below = kid.stdout.readline().decode().strip()
else:
    below = ""
print(" ".join([str(os.getpid()), below]).strip(), flush=True)
time.sleep(600)
"""


def _tree(ignore_term: bool = False) -> tuple[subprocess.Popen, list[int]]:
    env = dict(os.environ, IGNORE_TERM="1" if ignore_term else "0")
    proc = subprocess.Popen([sys.executable, "-c", TREE, "0", TREE], stdout=subprocess.PIPE, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3 and pids[0] == proc.pid
    return proc, pids


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(process.alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False


def test_descendants_start_times_and_cmdline_of_a_real_tree():
    proc, (parent, child, grandchild) = _tree()
    try:
        tree = process.descendants(parent)
        assert [p for p, _ in tree] == [child, grandchild]
        assert all(start == process.start_time(p) for p, start in tree)
        assert process.alive(child, process.start_time(child))
        assert not process.alive(child, (process.start_time(child) or 0) + 1)  # same pid, another process
        assert "IGNORE_TERM" in process.cmdline(parent) and process.cmdline(2**22 + 1) == ""
        table = process.process_table()
        assert table[os.getpid()].ppid == os.getppid() and table[grandchild].ppid == child
    finally:
        process.kill_group(proc)
    assert _gone([parent, child, grandchild])
    assert process.descendants(parent) == [] and process.start_time(parent) is None


def test_stop_group_ends_the_whole_group_with_sigterm():
    proc, pids = _tree()
    t0 = time.monotonic()
    process.stop_group(proc, grace_s=5.0)
    assert proc.returncode == -signal.SIGTERM and time.monotonic() - t0 < 5.0
    assert _gone(pids)


def test_stop_group_escalates_to_sigkill_after_the_grace_period():
    proc, pids = _tree(ignore_term=True)
    t0 = time.monotonic()
    process.stop_group(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - t0 >= 0.5
    assert _gone(pids)
    process.stop_group(proc, grace_s=0.5)  # stopping a stopped process is a no-op


def test_signals_skip_what_is_gone():
    proc, (parent, child, grandchild) = _tree()
    try:
        tree = process.descendants(parent)
        assert process.signal_each([grandchild], signal.SIGKILL) == [grandchild]
        assert _gone([grandchild])
        # the grandchild is a zombie until its parent reaps it (it never does): not alive, nor a descendant
        assert [p for p, _ in process.descendants(parent)] == [child]
        assert process.signal_each([p for p, s in tree if process.alive(p, s)], signal.SIGKILL) == [child]
    finally:
        process.kill_group(proc)
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()  # reaped, and it started nothing: its group is empty
    assert process.signal_group(done.pid, signal.SIGKILL) is False
    assert process.signal_each([done.pid], signal.SIGKILL) == []
    process.kill_group(done)  # already reaped: a no-op
