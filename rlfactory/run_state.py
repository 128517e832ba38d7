"""`run_state.json` in a run folder: what the training process is doing, for its readers.

`rlfactory train` writes it (atomically: a temp file renamed over it) when its loop starts,
{"state": "running", "pid", "host", "at"}, and when the loop ends, {"state": "finished" |
"stopped" | "failed", "reason", "pid", "host", "at"}: stopped for Ctrl-C / SIGINT or a run that
ended before `trainer.steps`, failed for an exception (named in `reason`). A process killed
outright (SIGKILL, the out-of-memory killer) cannot write anything: its readers find "running"
with a pid that is gone on that host (`describe` says so). The studio reads it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

STATE_FILE = "run_state.json"
ENDED = ("finished", "stopped", "failed")


def write_run_state(run_dir: str | Path, state: str, reason: str = "") -> None:
    """Record `state` (running, or one of ENDED with its `reason`) for this process in `run_dir`."""
    record = {"state": state, "reason": reason, "pid": os.getpid(), "host": socket.gethostname(), "at": time.time()}
    path = Path(run_dir) / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_run_state(run_dir: str | Path) -> dict[str, Any] | None:
    """The recorded state, or None when there is none (or it cannot be read)."""
    try:
        record = json.loads((Path(run_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("state"), str) else None


def describe(record: dict[str, Any]) -> tuple[str, str] | None:
    """(status, reason) from a record: an ended run as recorded; a running one on this host whose
    process is gone is `failed` (killed without a word); None when only the logs can tell (a run
    said to be running on another host)."""
    state, pid = record["state"], record.get("pid")
    if state in ENDED:
        return state, str(record.get("reason") or state)
    if state != "running" or record.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    if _alive(pid):
        return "running", f"training process {pid} is alive"
    return "failed", f"the training process (pid {pid}) is gone without a word: killed (SIGKILL, out of memory?)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie (exited, not yet reaped by its parent) is gone for our purposes
        return stat.read_text().split(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
