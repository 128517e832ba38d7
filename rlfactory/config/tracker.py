"""The `trainer.tracker:` section: where the experiment trackers named in `trainer.loggers` log."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from rlfactory.config.base import Section

LoggerName = Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"]
TRACKERS: tuple[str, ...] = ("wandb", "mlflow", "trackio")
"""The loggers that are experiment trackers (an optional package each; `pip install 'rlfactory[NAME]'`)."""


class TrackerConfig(Section):
    """The experiment trackers of `trainer.loggers`; their own variables (WANDB_API_KEY, ...) work too."""

    project: str = "rlfactory"
    """W&B project, MLflow experiment, Trackio project."""
    name: str | None = None
    """Run name shown by the trackers; unset = the name of trainer.run_dir's folder."""
    wandb_mode: Literal["online", "offline"] | None = None
    """W&B: online (needs WANDB_API_KEY or `wandb login`) or offline (files under
    run_dir/wandb, uploaded later with `wandb sync`); unset = $WANDB_MODE, else online."""
    wandb_entity: str | None = None
    """W&B team or user; unset = $WANDB_ENTITY, else your default entity."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (http://host:5000 for a tracking server, sqlite:///mlflow.db, ...);
    unset = $MLFLOW_TRACKING_URI, else MLflow's own default."""
    table_rows: int = 8
    """Trajectories per step logged as a table (prompt, model text, tool calls, reward terms),
    the first ones of the step; 0 = no table. Written with trainer.log_trajectories."""

    @model_validator(mode="after")
    def _check(self) -> "TrackerConfig":
        if self.table_rows < 0:
            raise ValueError("trainer.tracker.table_rows must be >= 0 (0 = no table)")
        return self
