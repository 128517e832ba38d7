"""MLflow: `trainer.loggers: [..., mlflow]` (`pip install 'rlfactory[mlflow]'`: mlflow-skinny, the
client; `mlflow server` also needs the packages of that extra's server list, or the full `mlflow`).

Logs through `MlflowClient` (no global active run): the config as params (and config.json), each
step's metrics in one batch, each step's trajectory table as trajectories/step_NNNNNN.json
(columns + data, the layout of `mlflow.log_table`)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import httpx

from rlfactory.config import ConfigError, TrackerConfig
from rlfactory.train.loggers.base import TABLE_COLUMNS, TrajectoryRow

# MLflow retries a failed request 7 times with backoff 2 (minutes in all) and waits 120 s for a
# reply: a tracking server gone mid-run would hold every training step that long. Our defaults
# fail within seconds, so the tracker is dropped and training goes on; the user's values win.
_CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
_PARAM_BATCH = 100  # MLflow's limit of params per log_batch
_METRIC_BATCH = 1000  # and of metrics
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # MLflow's allowed characters in a key


def mlflow_uri(cfg: TrackerConfig) -> str | None:
    return cfg.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def check_mlflow(cfg: TrackerConfig) -> None:
    """A tracking server that does not answer is one line now, not a stack of retries later."""
    uri = mlflow_uri(cfg)
    if not uri or not uri.startswith(("http://", "https://")):
        return
    health = uri.rstrip("/") + "/health"
    try:
        reply = httpx.get(health, timeout=10.0)
    except httpx.HTTPError as e:
        raise ConfigError(f"trainer.loggers: mlflow: no tracking server answers at {uri} ({type(e).__name__}: {e}); "
                          "start one (`mlflow server`) or fix trainer.tracker.mlflow_uri / MLFLOW_TRACKING_URI") from None
    if reply.status_code != 200:
        raise ConfigError(f"trainer.loggers: mlflow: {health} answered HTTP {reply.status_code}, not an MLflow "
                          "tracking server's health check; check trainer.tracker.mlflow_uri")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"trainer": {"lr": 1e-5}} -> {"trainer.lr": "1e-05"}: MLflow params are flat strings."""
    out: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]  # MLflow's longest param value
    return out


class MlflowTracker:
    name = "mlflow"

    def __init__(self, cfg: TrackerConfig, run_name: str, config: dict[str, Any], resume: dict[str, Any] | None) -> None:
        for key, value in _CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        self.uri = mlflow_uri(cfg)
        self.client = MlflowClient(tracking_uri=self.uri)
        run_id = (resume or {}).get("run_id")
        if run_id:
            self.run_id = self.client.get_run(run_id).info.run_id  # raises when the server lost it
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(cfg.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(cfg.project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), _PARAM_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _PARAM_BATCH])
        self.client.log_dict(self.run_id, config, "config.json")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(_BAD_KEY.sub("_", k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), _METRIC_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + _METRIC_BATCH])

    def log_table(self, step: int, rows: list[TrajectoryRow]) -> None:
        table = {"columns": list(TABLE_COLUMNS), "data": [r.values() for r in rows]}
        self.client.log_dict(self.run_id, table, f"trajectories/step_{step:06d}.json")

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "uri": self.uri}

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status={"finished": "FINISHED", "failed": "FAILED"}.get(status, "KILLED"))
