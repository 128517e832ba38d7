"""Experiment trackers beside metrics.jsonl and TensorBoard: `trainer.loggers` names them,
`trainer.tracker` sets them up. `check_trackers` runs before any work starts (a missing package,
a missing W&B key or a tracking server that does not answer is one line); `open_trackers` starts
(or, on `--resume`, continues) each tracker's run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rlfactory.config import TRACKERS, ConfigError, TrackerConfig
from rlfactory.train.loggers.base import Tracker, Trackers, TrajectoryRow, read_state, trajectory_rows

__all__ = ["Tracker", "Trackers", "TrajectoryRow", "check_trackers", "open_trackers",
           "read_state", "trajectory_rows"]

_PACKAGE = {"wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def _wanted(loggers: list[str]) -> list[str]:
    return [name for name in dict.fromkeys(loggers) if name in TRACKERS]


def check_trackers(loggers: list[str], cfg: TrackerConfig) -> None:
    """Raise a one-line ConfigError for a tracker that cannot start: its package is missing, W&B
    online has no key, the MLflow tracking server does not answer."""
    for name in _wanted(loggers):
        if importlib.util.find_spec(_PACKAGE[name]) is None:
            raise ConfigError(f"trainer.loggers: {name} is not installed: pip install 'rlfactory[{name}]' "
                              f"(or drop {name} from trainer.loggers)")
    if "wandb" in loggers:
        from rlfactory.train.loggers.wandb_tracker import check_wandb

        check_wandb(cfg)
    if "mlflow" in loggers:
        from rlfactory.train.loggers.mlflow_tracker import check_mlflow

        check_mlflow(cfg)


def open_trackers(loggers: list[str], cfg: TrackerConfig, run_dir: str | Path, config: dict[str, Any],
                  resume: bool) -> Trackers:
    """Start the trackers named in `loggers` for the run in `run_dir`, logging `config`. With
    `resume`, each continues the run it had (run_dir/trackers.json) where its library allows."""
    run_dir = Path(run_dir)
    state = read_state(run_dir) if resume else {}
    run_name = cfg.name or run_dir.resolve().name
    opened: list[Tracker] = []
    for name in _wanted(loggers):
        try:
            opened.append(_open(name, cfg, run_dir, run_name, config, state.get(name)))
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 -- whatever the library raises: one line, before any step runs
            for tracker in opened:
                tracker.close("failed")
            raise ConfigError(f"trainer.loggers: {name} could not start a run ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from e
    return Trackers(opened, run_dir, cfg.table_rows)


def _open(name: str, cfg: TrackerConfig, run_dir: Path, run_name: str, config: dict[str, Any],
          resume: dict[str, Any] | None) -> Tracker:
    if name == "wandb":
        from rlfactory.train.loggers.wandb_tracker import WandbTracker

        return WandbTracker(cfg, run_dir, run_name, config, resume)
    if name == "mlflow":
        from rlfactory.train.loggers.mlflow_tracker import MlflowTracker

        return MlflowTracker(cfg, run_name, config, resume)
    from rlfactory.train.loggers.trackio_tracker import TrackioTracker

    return TrackioTracker(cfg, run_name, config, resume)
