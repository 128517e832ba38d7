"""The Playground's server side: one rollout at a time in a worker process (playground_worker.py),
its events kept in order for the page's event stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rlfactory.tools import process


class PlaygroundRun:
    def __init__(self, request: dict[str, Any], cwd: Path) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.finished = False
        self.stderr: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfactory.studio.playground_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=cwd, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.close()
        threading.Thread(target=self._read, daemon=True, name=f"playground-{self.id}").start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            with self.cond:
                self.events.append(event)
                self.cond.notify_all()
        rc = self.proc.wait()
        with self.cond:
            if not self.events or self.events[-1].get("type") != "done":
                tail = " | ".join(self.stderr[-3:])
                self.events.append({"type": "error", "message": f"the rollout process ended (exit {rc}) {tail}".strip()})
                self.events.append({"type": "done"})
            self.finished = True
            self.cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").strip()
            if line:
                self.stderr.append(line[-300:])
                del self.stderr[:-20]

    def wait_events(self, start: int, timeout: float) -> list[dict[str, Any]]:
        with self.cond:
            if len(self.events) <= start and not self.finished:
                self.cond.wait(timeout)
            return self.events[start:]

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        tree = process.descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        end = time.monotonic() + 5
        while any(process.alive(p, s) for p, s in tree) and time.monotonic() < end:
            time.sleep(0.1)
        process.signal_each([p for p, s in tree if process.alive(p, s)], signal.SIGKILL)


class Playground:
    """At most one rollout runs; starting another stops the one before."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.runs: dict[str, PlaygroundRun] = {}

    def start(self, request: dict[str, Any]) -> PlaygroundRun:
        self.stop_all()
        run = PlaygroundRun(request, self.cwd)
        self.runs = {run.id: run}
        return run

    def get(self, run_id: str) -> PlaygroundRun:
        run = self.runs.get(run_id)
        if run is None:
            raise KeyError(f"no playground rollout {run_id!r}")
        return run

    def stop_all(self) -> None:
        for run in list(self.runs.values()):
            run.stop()
