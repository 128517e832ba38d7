"""The run directory's logs: metrics.jsonl, TensorBoard events, trajectories per step.

On resume from the checkpoint of step k, whatever was logged after step k by the interrupted
process is cut away first (metrics lines, trajectory files, TensorBoard events via
`purge_step`), so a resumed run's logs read as if it had never stopped.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

from rlfactory.train.system_metrics import SystemMetrics
from rlfactory.train.loggers.base import Trackers
from rlfactory.trajectory import Trajectory, write_jsonl


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics.jsonl (a torn last line is skipped)."""
    out = []
    p = Path(path)
    if not p.is_file():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class RunLog:
    """Appends one metrics record per step to metrics.jsonl, TensorBoard and the experiment
    trackers (rlfactory/train/loggers: a tracker that fails is dropped, the run goes on)."""

    def __init__(self, run_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True,
                 trackers: Trackers | None = None) -> None:
        self.trackers = trackers if trackers is not None else Trackers([])
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.eval_path = self.dir / "eval.jsonl"
        self.traj_dir = self.dir / "trajectories"
        if resume_step is not None:
            self._truncate(resume_step)
        else:
            for p in (self.metrics_path, self.eval_path):
                p.unlink(missing_ok=True)
            for p in self.traj_dir.glob("step_*.jsonl") if self.traj_dir.is_dir() else []:
                p.unlink()
        self._system = SystemMetrics()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=purge)

    def _truncate(self, step: int) -> None:
        for path in (self.metrics_path, self.eval_path):
            kept = [r for r in read_metrics(path) if int(r.get("step", 0)) <= step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, path)
        if self.traj_dir.is_dir():
            for p in self.traj_dir.glob("step_*.jsonl"):
                if int(p.stem.split("_")[1]) > step:
                    p.unlink()

    def log(self, step: int, metrics: dict[str, float], kind: str = "train") -> None:
        """Append `metrics` for `step` (kind "train" -> metrics.jsonl, "eval" -> eval.jsonl), with
        `wall_time` (unix seconds; the studio's time axis) and, for "train", the system metrics
        of the step (system_metrics.py; they go to TensorBoard too)."""
        if kind == "train":
            metrics = {**metrics, **self._system.sample()}
        record = {"step": step, "wall_time": round(time.time(), 3), **{k: _clean(v) for k, v in metrics.items()}}
        path = self.metrics_path if kind == "train" else self.eval_path
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if self._tb is not None:
            prefix = "" if kind == "train" else "eval/"
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(prefix + k, v, step)
            self._tb.flush()
        self.trackers.log(step, metrics, kind)

    def has_eval(self, step: int) -> bool:
        """Whether eval.jsonl holds an evaluation of `step`."""
        return any(int(r.get("step", -1)) == step for r in read_metrics(self.eval_path))

    def trajectories(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        self.traj_dir.mkdir(exist_ok=True)
        write_jsonl(self.traj_dir / f"step_{step:06d}.jsonl", list(trajectories), mode="w")
        self.trackers.trajectories(step, trajectories)

    def close(self, status: str = "finished") -> None:
        """Close TensorBoard and end the trackers' runs (`status`: finished, stopped or failed)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self.trackers.close(status)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
