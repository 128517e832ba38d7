"""rlfactory.run_state: the run folder's record of what its training process is doing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from rlfactory.run_state import STATE_FILE, describe, read_run_state, write_run_state


def test_written_atomically_and_read_back(tmp_path):
    assert read_run_state(tmp_path) is None
    write_run_state(tmp_path, "running")
    record = read_run_state(tmp_path)
    assert record["state"] == "running" and record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert describe(record) == ("running", f"training process {os.getpid()} is alive")
    write_run_state(tmp_path, "failed", "ValueError: bad")
    assert describe(read_run_state(tmp_path)) == ("failed", "ValueError: bad")
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]  # no temp file left behind
    (tmp_path / STATE_FILE).write_text("{not json")
    assert read_run_state(tmp_path) is None


def test_a_running_record_whose_process_is_gone_is_failed_unless_it_ran_elsewhere(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = {"state": "running", "pid": gone.pid, "host": socket.gethostname(), "at": 0.0}
    status, reason = describe(record)
    assert status == "failed" and f"pid {gone.pid}" in reason and "killed" in reason
    assert describe({**record, "host": "another-machine"}) is None  # only the logs can tell
    (tmp_path / STATE_FILE).write_text(json.dumps(record))
    assert read_run_state(tmp_path)["pid"] == gone.pid
