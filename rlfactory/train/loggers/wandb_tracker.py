"""Weights & Biases: `trainer.loggers: [..., wandb]` (`pip install 'rlfactory[wandb]'`)."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from rlfactory.config import ConfigError, TrackerConfig
from rlfactory.train.loggers.base import TABLE_COLUMNS, TrajectoryRow


def wandb_mode(cfg: TrackerConfig) -> str:
    return cfg.wandb_mode or os.environ.get("WANDB_MODE") or "online"


def check_wandb(cfg: TrackerConfig) -> None:
    """Online W&B needs a key; without one `wandb.init` would stop to ask for it on the terminal."""
    if wandb_mode(cfg) in ("offline", "disabled", "dryrun"):
        return
    if os.environ.get("WANDB_API_KEY"):
        return
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    raise ConfigError("trainer.loggers: wandb is online but has no API key: set WANDB_API_KEY or run `wandb login`, "
                      "or log offline with trainer.tracker.wandb_mode: offline (then `wandb sync`)")


class WandbTracker:
    name = "wandb"

    def __init__(self, cfg: TrackerConfig, run_dir: Path, run_name: str, config: dict[str, Any],
                 resume: dict[str, Any] | None) -> None:
        import wandb

        self._wandb = wandb
        run_id = (resume or {}).get("id")  # None: W&B makes a new one
        # console="off": W&B would otherwise wrap this process's stdout and stderr
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True)
        self.run = wandb.init(project=cfg.project, entity=cfg.wandb_entity, name=run_name, id=run_id,
                              resume="allow", dir=str(run_dir), config=config, mode=wandb_mode(cfg),
                              settings=settings, reinit="create_new")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, rows: list[TrajectoryRow]) -> None:
        table = self._wandb.Table(columns=list(TABLE_COLUMNS), data=[r.values() for r in rows])
        self.run.log({"trajectories": table}, step=step)

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project}

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status != "failed" else 1)
