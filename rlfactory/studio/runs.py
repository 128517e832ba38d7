"""The run directories under the runs folder: discovery, status and a config summary.

A run is a folder holding `config.yaml` or `metrics.jsonl` (at most three levels down; folders
starting with `.` are skipped). Its id is its path relative to the runs folder.

Status: a run launched from the studio has a job record (jobs.py) that says running, or how
the process ended (exit 0: finished, interrupted: stopped, anything else: failed). A run started
elsewhere says so in its `run_state.json` (rlfactory.run_state: written by `rlfactory train` when
its loop starts and ends; a run whose process is gone while it said "running" is failed). Without
one (older runs, another host), a run is finished when its last step is trainer.steps, running
while its logs changed in the last RECENT_S seconds, and stopped otherwise.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from rlfactory.run_state import describe, read_run_state
from rlfactory.studio.metrics import last_record
from rlfactory.studio.paths import BadPath, inside

RECENT_S = 120.0
MAX_DEPTH = 3


@dataclass
class RunSummary:
    id: str
    status: str  # running | finished | failed | stopped
    model: str
    env: str
    algorithm: str
    steps_done: int
    steps_total: int | None
    reward: float | None
    accuracy: float | None
    started: float | None  # unix seconds
    updated: float | None
    checkpoints: list[str]
    status_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_runs(root: Path) -> list[Path]:
    """Run folders under `root`, newest first."""
    out: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for p in entries:
            if (p / "config.yaml").is_file() or (p / "metrics.jsonl").is_file():
                out.append(p)
            elif depth < MAX_DEPTH and p.name not in ("checkpoints", "trajectories", "tensorboard", "model"):
                walk(p, depth + 1)

    if root.is_dir():
        walk(root, 1)
    return sorted(out, key=_mtime, reverse=True)


def run_dir(root: Path, run_id: str) -> Path:
    """The folder of run `run_id`, which must lie inside `root` and be a run."""
    p = inside(root, run_id)
    if not ((p / "config.yaml").is_file() or (p / "metrics.jsonl").is_file()):
        raise BadPath(f"{run_id!r} is not a run (no config.yaml or metrics.jsonl)")
    return p


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(p: Path) -> float:
    times = [f.stat().st_mtime for f in (p / "metrics.jsonl", p / "config.yaml") if f.is_file()]
    return max(times) if times else 0.0


def checkpoints(path: Path) -> list[str]:
    folder = path / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_") and (p / "model").is_dir())


def summarize(root: Path, path: Path, job: Any = None, now: float | None = None) -> RunSummary:
    """The Runs table's row for run folder `path`; `job` is its latest studio job, if any."""
    now = time.time() if now is None else now
    cfg = read_config(path)
    model = (cfg.get("model") or {}).get("path", "?")
    env = (cfg.get("env") or {}).get("name", "?")
    algo = cfg.get("algo") or {}
    algorithm = f"{algo.get('advantage', '?')}/{algo.get('loss', '?')}" if algo else "?"
    steps_total = (cfg.get("trainer") or {}).get("steps")
    last = last_record(path / "metrics.jsonl") or {}
    steps_done = int(last.get("step", 0) or 0)
    config_file = path / "config.yaml"
    started = config_file.stat().st_mtime if config_file.is_file() else None
    updated = _mtime(path) or None
    status, reason = _status(steps_done, steps_total, updated, now, job, read_run_state(path))
    return RunSummary(
        id=path.relative_to(root.resolve()).as_posix(), status=status, model=str(model), env=str(env),
        algorithm=algorithm, steps_done=steps_done, steps_total=steps_total, reward=last.get("reward/mean"),
        accuracy=last.get("accuracy"), started=started, updated=updated, checkpoints=checkpoints(path),
        status_reason=reason,
    )


def _status(done: int, total: Any, updated: float | None, now: float, job: Any,
            state: dict[str, Any] | None = None) -> tuple[str, str]:
    if job is not None:
        if job.state == "running":
            return "running", f"studio job {job.id}"
        if job.state in ("finished", "failed", "stopped"):
            return job.state, job.reason
    told = describe(state) if state is not None else None
    if told is not None:
        return told
    if isinstance(total, int) and done >= total:
        return "finished", f"step {done} of {total}"
    if updated is not None and now - updated < RECENT_S:
        return "running", f"logs changed {now - updated:.0f}s ago"
    return "stopped", f"step {done} of {total}; not written to for {(now - (updated or now)) / 60:.0f} min"


def list_steps(path: Path) -> list[int]:
    """Steps whose trajectories were logged."""
    folder = path / "trajectories"
    if not folder.is_dir():
        return []
    steps = []
    for p in folder.glob("step_*.jsonl"):
        try:
            steps.append(int(p.stem.split("_", 1)[1]))
        except ValueError:
            continue
    return sorted(steps)
