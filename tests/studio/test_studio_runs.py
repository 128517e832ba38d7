"""The runs page's status of a run started outside the studio: from its run_state.json."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from rlfactory.studio.runs import summarize


def _run(root, name, state=None):
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("trainer: {steps: 10}\n")
    (path / "metrics.jsonl").write_text(json.dumps({"step": 3, "reward/mean": 0.5}) + "\n")
    if state is not None:
        (path / "run_state.json").write_text(json.dumps(state))
    return path


def test_status_of_runs_started_elsewhere(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = socket.gethostname()
    later = time.time() + 3600  # the logs are old: without run_state.json a run would read "stopped"
    failed = summarize(tmp_path, _run(tmp_path, "failed", {"state": "failed", "reason": "OSError: disk full"}), now=later)
    assert (failed.status, failed.status_reason) == ("failed", "OSError: disk full")
    killed = summarize(tmp_path, _run(tmp_path, "killed", {"state": "running", "pid": gone.pid, "host": here}), now=later)
    assert killed.status == "failed" and "gone without a word" in killed.status_reason
    alive = summarize(tmp_path, _run(tmp_path, "alive", {"state": "running", "pid": os.getpid(), "host": here}), now=later)
    assert alive.status == "running"
    old = summarize(tmp_path, _run(tmp_path, "old"), now=later)
    assert old.status == "stopped"  # no record: the logs decide, as before
