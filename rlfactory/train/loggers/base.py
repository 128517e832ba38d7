"""What every experiment tracker does, the rows of the trajectory table, and the fan-out that
drops a tracker failing mid-run instead of stopping training.

A tracker logs the run's config once, then each step's metrics (the lines of metrics.jsonl; the
evaluations of eval.jsonl under `eval/`), and a sample of each step's trajectories as a table.
The run directory's metrics.jsonl stays the record: a tracker is a copy of it elsewhere.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from rlfactory.trajectory import Trajectory

STATE_FILE = "trackers.json"
"""In the run directory: each tracker's run id, so that `--resume` continues the same tracker run."""

TABLE_COLUMNS = ("step", "id", "status", "reward", "reward_terms", "prompt", "model_text", "tool_calls")


@dataclass
class TrajectoryRow:
    """One row of a step's trajectory table (strings and numbers only: every tracker takes them)."""

    step: int
    id: str
    status: str
    reward: float | None
    reward_terms: str  # JSON object {term: value}
    prompt: str
    model_text: str  # everything after the prompt: model turns and the observations between them
    tool_calls: str  # JSON list of {name, arguments, status}

    def values(self) -> list[Any]:
        return [getattr(self, c) for c in TABLE_COLUMNS]


def trajectory_rows(step: int, trajectories: Sequence[Trajectory], limit: int) -> list[TrajectoryRow]:
    """The first `limit` trajectories of a step as table rows."""
    rows = []
    for t in list(trajectories)[:limit]:
        prompt = t.segments[0].text if t.segments and t.segments[0].role == "prompt" else ""
        calls = [{"name": c.name, "arguments": c.arguments, "status": c.status} for c in t.tool_calls]
        rows.append(TrajectoryRow(
            step=step, id=t.id, status=t.status, reward=t.reward,
            reward_terms=json.dumps(t.reward_terms, sort_keys=True),
            prompt=prompt, model_text=t.completion_text(), tool_calls=json.dumps(calls, default=str),
        ))
    return rows


def finite_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric, finite entries of a metrics record, keys prefixed (trackers reject NaN and text)."""
    return {prefix + k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class Tracker(Protocol):
    """One experiment tracker's run. Every method may raise; `Trackers` then drops the tracker."""

    name: str

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Log finite numbers at `step` (evaluations come with keys prefixed `eval/`)."""

    def log_table(self, step: int, rows: list[TrajectoryRow]) -> None:
        """Log a step's trajectory table."""

    def state(self) -> dict[str, Any]:
        """What `--resume` needs to continue this run (kept in run_dir/trackers.json)."""

    def close(self, status: str) -> None:
        """End the run; `status` is finished, stopped or failed."""


class Trackers:
    """The trackers of one run. A call that raises drops its tracker with one line on stderr, so
    that a tracker going away mid-run never stops training (metrics.jsonl still has every step)."""

    def __init__(self, trackers: list[Tracker], run_dir: str | Path | None = None, table_rows: int = 8) -> None:
        self.trackers = list(trackers)
        self.table_rows = table_rows
        self.state_path = Path(run_dir) / STATE_FILE if run_dir is not None else None
        self.dropped: dict[str, str] = {}  # tracker name -> why
        self._save_state()

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, what: str, step: int | None, call: Any) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:  # noqa: BLE001 -- any failure of a tracker's library: drop it, say so, go on
                where = f" at step {step}" if step is not None else ""
                why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                print(f"rlfactory: tracker {tracker.name} failed to {what}{where} ({why}); it is dropped, "
                      "training goes on (metrics.jsonl has every step)", file=sys.stderr, flush=True)
                self.trackers.remove(tracker)
                self.dropped[tracker.name] = why

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        values = finite_metrics(metrics, "" if kind == "train" else f"{kind}/")
        self._each("log metrics", step, lambda t: t.log_metrics(step, values))

    def trajectories(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        if self.table_rows <= 0 or not self.trackers:
            return
        rows = trajectory_rows(step, trajectories, self.table_rows)
        self._each("log the trajectory table", step, lambda t: t.log_table(step, rows))

    def close(self, status: str = "finished") -> None:
        self._each("finish its run", None, lambda t: t.close(status))
        self.trackers = []

    def _save_state(self) -> None:
        if self.state_path is None or not self.trackers:
            return
        state = read_state(self.state_path.parent)
        state.update({t.name: t.state() for t in self.trackers})
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=str), encoding="utf-8")
        tmp.replace(self.state_path)


def read_state(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """run_dir/trackers.json: {tracker name: what its `state()` returned}; {} when absent or torn."""
    path = Path(run_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        print(f"rlfactory: {path} is unreadable ({e}); the trackers start new runs", file=sys.stderr)
        return {}
    return state if isinstance(state, dict) else {}


def table_as_dict(rows: list[TrajectoryRow]) -> dict[str, list[Any]]:
    """Column name -> values (MLflow's table layout)."""
    return {c: [asdict(r)[c] for r in rows] for c in TABLE_COLUMNS}
