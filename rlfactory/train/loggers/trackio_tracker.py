"""Trackio (local-first; `trackio show` opens the dashboard): `trainer.loggers: [..., trackio]`
(`pip install 'rlfactory[trackio]'`). Runs are kept under $TRACKIO_DIR (default
~/.cache/huggingface/trackio); a resumed run continues the Trackio run of the same name."""

from __future__ import annotations

from typing import Any

from rlfactory.train.loggers.base import TABLE_COLUMNS, TrajectoryRow
from rlfactory.config import TrackerConfig


class TrackioTracker:
    name = "trackio"

    def __init__(self, cfg: TrackerConfig, run_name: str, config: dict[str, Any], resume: dict[str, Any] | None) -> None:
        import trackio

        self._trackio = trackio
        name = (resume or {}).get("name") or run_name
        self.run = trackio.init(project=cfg.project, name=name, config=config,
                                resume="allow" if resume else "never", embed=False,
                                auto_log_gpu=False, auto_log_cpu=False)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, rows: list[TrajectoryRow]) -> None:
        self.run.log({"trajectories": self._trackio.Table(columns=list(TABLE_COLUMNS), data=[r.values() for r in rows])},
                     step=step)

    def state(self) -> dict[str, Any]:
        return {"project": self.run.project, "name": self.run.name}

    def close(self, status: str) -> None:
        self.run.finish()
