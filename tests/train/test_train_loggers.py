"""Experiment trackers (trainer.loggers): W&B offline (its run files read back), MLflow against a
real `mlflow server` on a sqlite store (read back with its client), Trackio locally; start-up
errors are one line; a tracker failing mid-run is dropped and training goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rlfactory.cli.main import main
from rlfactory.config import ConfigError, TrackerConfig
from rlfactory.server_process import free_port
from rlfactory.train.loggers import Trackers, check_trackers, open_trackers, trajectory_rows
from rlfactory.train.runlog import RunLog, read_metrics
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory
from train_fixtures import run_config
import wandb_records

pytestmark = pytest.mark.usefixtures("one_thread")


def _traj(i: int) -> Trajectory:
    return Trajectory(id=f"g-{i}", group="g", segments=[Segment("prompt", [1, 2], "What is 2+2?"),
                                                         Segment("model", [3], "<answer>4</answer>")],
                      tool_calls=[ToolCallRecord("calc", {"x": "2+2"}, "ok", 0.1)],
                      reward=1.0, reward_terms={"accuracy": 1.0, "format": 0.5})


class _Recorder:
    """A tracker that keeps what it is given, and raises from `fail_at` on (unit tests only)."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name, self.fail_at, self.steps, self.tables, self.closed = name, fail_at, [], [], None

    def log_metrics(self, step, metrics):
        if self.fail_at is not None and step >= self.fail_at:
            raise ConnectionError("server went away")
        self.steps.append((step, metrics))

    def log_table(self, step, rows):
        self.tables.append((step, rows))

    def state(self):
        return {"id": self.name}

    def close(self, status):
        self.closed = status


def test_a_failing_tracker_is_dropped_with_one_line_and_the_others_go_on(tmp_path, capsys):
    good, bad = _Recorder("good"), _Recorder("bad", fail_at=2)
    log = RunLog(tmp_path, trackers=Trackers([good, bad], tmp_path, table_rows=1))
    for step in (1, 2, 3):
        log.log(step, {"reward/mean": 0.5 * step, "nan": float("nan"), "note": "text"})
        log.trajectories(step, [_traj(0), _traj(1)])
    log.log(3, {"accuracy": 0.25}, kind="eval")
    log.close("finished")
    err = capsys.readouterr().err
    assert err.count("tracker bad failed") == 1 and "at step 2" in err and "ConnectionError: server went away" in err
    assert [s for s, _ in good.steps] == [1, 2, 3, 3] and good.steps[0][1]["reward/mean"] == 0.5
    assert "nan" not in good.steps[0][1] and "note" not in good.steps[0][1]  # NaN and text left out
    assert good.steps[-1][1]["eval/accuracy"] == 0.25 and "accuracy" not in good.steps[-1][1]
    assert [s for s, _ in bad.steps] == [1] and bad.closed is None and good.closed == "finished"
    assert [len(rows) for _, rows in good.tables] == [1, 1, 1]  # table_rows=1
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]  # nothing lost
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"good": {"id": "good"}, "bad": {"id": "bad"}}


def test_trajectory_rows_hold_prompt_model_text_tool_calls_and_reward_terms():
    (row,) = trajectory_rows(4, [_traj(0), _traj(1)], limit=1)
    assert (row.step, row.id, row.status, row.reward) == (4, "g-0", "ok", 1.0)
    assert row.prompt == "What is 2+2?" and row.model_text == "<answer>4</answer>"
    assert json.loads(row.reward_terms) == {"accuracy": 1.0, "format": 0.5}
    assert json.loads(row.tool_calls) == [{"name": "calc", "arguments": {"x": "2+2"}, "status": "ok"}]


def test_startup_errors_are_one_line(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^trainer.loggers: trackio is not installed: pip install 'rlfactory\[trackio\]'"):
        check_trackers(["jsonl", "trackio"], TrackerConfig())
    monkeypatch.setattr(importlib.util, "find_spec", real)
    # an MLflow server that does not answer (nothing listens on the port)
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=r"^trainer.loggers: mlflow: no tracking server answers at " + uri) as e:
        check_trackers(["mlflow"], TrackerConfig(mlflow_uri=uri))
    assert "\n" not in str(e.value)
    # W&B online without a key (no WANDB_API_KEY, no ~/.netrc)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NETRC", raising=False)
    with pytest.raises(ConfigError, match="wandb is online but has no API key"):
        check_trackers(["wandb"], TrackerConfig())
    check_trackers(["wandb"], TrackerConfig(wandb_mode="offline"))


def test_train_refuses_an_unreachable_mlflow_server_before_any_work(tmp_path, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    cfg = run_config(tmp_path, trainer={"loggers": ["jsonl", "mlflow"], "tracker": {"mlflow_uri": uri}})
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlfactory: config error: trainer.loggers: mlflow: no tracking server answers at {uri} "
                   f"(ConnectError: [Errno 111] Connection refused); start one (`mlflow server`) or fix "
                   "trainer.tracker.mlflow_uri / MLFLOW_TRACKING_URI"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_wandb_offline_run_files_hold_config_metrics_table_and_resume_continues_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    sections = {"loggers": ["jsonl", "wandb"], "tracker": {"wandb_mode": "offline", "project": "p", "table_rows": 2},
                "eval_every": 2, "eval_limit": 2}
    cfg = run_config(tmp_path, trainer=sections)
    assert main(["train", cfg]) == 0
    run = tmp_path / "run"
    assert not (run / "tensorboard").exists()  # tensorboard left out of trainer.loggers
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    (first,) = list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    rid, config = wandb_records.run(first)
    assert rid == run_id and config["trainer"]["steps"] == 2 and config["algo"]["group_size"] == 2
    hist = wandb_records.history(first)
    records = read_metrics(run / "metrics.jsonl")
    for record in records:  # every finite metric of metrics.jsonl, at its step
        (row,) = [h for h in hist if h["_step"] == record["step"] and "reward/mean" in h]
        for key, value in record.items():
            if key not in ("step", "wall_time") and isinstance(value, (int, float)):  # trackers stamp time themselves
                assert row[key] == pytest.approx(value), key
        assert row["trajectories/_type"] == "table-file" and row["trajectories/nrows"] == 2
    (evaluation,) = read_metrics(run / "eval.jsonl")
    assert any(h.get("eval/accuracy") == pytest.approx(evaluation["accuracy"]) and h["_step"] == 2 for h in hist)
    table_file = first.parent / "files" / row["trajectories/path"]
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "id", "status", "reward", "reward_terms", "prompt", "model_text", "tool_calls"]
    assert len(table["data"]) == 2 and table["data"][0][0] == 2 and table["data"][0][5]  # the prompt's text

    # resume to step 3: the same W&B run id, logging step 3
    cfg3 = run_config(tmp_path, trainer={**sections, "steps": 3})
    assert main(["train", cfg3, "--resume"]) == 0
    runs = sorted((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(runs) == 2 and json.loads((run / "trackers.json").read_text())["wandb"]["id"] == run_id
    assert [h["_step"] for h in wandb_records.history(runs[-1]) if "reward/mean" in h] == [3]


class _MlflowServer:
    """`mlflow server` on a sqlite store, on a free port of 127.0.0.1, in a session of its own."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.log = open(root / "mlflow-server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env)
        self.root = root

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "mlflow-server.log").read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"mlflow server not up after {timeout_s} s:\n" + (self.root / "mlflow-server.log").read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = _MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        server.wait_ready(timeout_s=180)  # its first start creates the sqlite schema (tens of seconds on a busy CPU)
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_mlflow_server_holds_params_metrics_table_and_resume_continues_the_run(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    sections = {"loggers": ["jsonl", "tensorboard", "mlflow"],
                "tracker": {"mlflow_uri": mlflow_server.url, "project": "rlf-test"}}
    cfg = run_config(tmp_path, trainer=sections)
    assert main(["train", cfg]) == 0
    run_dir = tmp_path / "run"
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(mlflow_server.url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "rlf-test"
    assert run.data.params["trainer.steps"] == "2" and run.data.params["algo.group_size"] == "2"
    records = read_metrics(run_dir / "metrics.jsonl")
    for key in ("reward/mean", "accuracy", "optim/grad_norm", "policy_version"):
        history = client.get_metric_history(run_id, key)
        assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r[key])) for r in records], key
    artifacts = {a.path for a in client.list_artifacts(run_id, "trajectories")}
    assert artifacts == {"trajectories/step_000001.json", "trajectories/step_000002.json"}
    table = client.load_dict(run_id, "trajectories/step_000002.json") if hasattr(client, "load_dict") else json.loads(
        Path(client.download_artifacts(run_id, "trajectories/step_000002.json", str(tmp_path))).read_text())
    assert table["columns"][:4] == ["step", "id", "status", "reward"] and len(table["data"]) == 4

    cfg3 = run_config(tmp_path, trainer={**sections, "steps": 3})
    assert main(["train", cfg3, "--resume"]) == 0
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == run_id
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_mlflow_server_gone_mid_run_drops_the_tracker_and_logging_goes_on(tmp_path, capsys):
    server = _MlflowServer(tmp_path)
    try:
        server.wait_ready(timeout_s=180)
        from rlfactory.train.loggers import open_trackers

        trackers = open_trackers(["mlflow"], TrackerConfig(mlflow_uri=server.url), tmp_path, {"a": 1}, resume=False)
        log = RunLog(tmp_path, tensorboard=False, trackers=trackers)
        log.log(1, {"reward/mean": 1.0})
    finally:
        server.stop()
    started = time.monotonic()
    log.log(2, {"reward/mean": 2.0})
    log.log(3, {"reward/mean": 3.0})
    log.close()
    took = time.monotonic() - started
    assert not log.trackers.trackers and "mlflow" in log.trackers.dropped
    err = capsys.readouterr().err
    assert err.count("rlfactory: tracker mlflow failed to log metrics at step 2") == 1
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert took < 60, f"a dead tracking server held logging {took:.0f} s"


@pytest.mark.slow
def test_trackio_local_run_holds_config_metrics_and_table(tmp_path):
    cfg = run_config(tmp_path, trainer={"loggers": ["jsonl", "trackio"], "tracker": {"project": "rlf-test"}})
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "rlfactory.cli.main", "train", cfg], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # resumed to step 3: the same Trackio run goes on
    cfg3 = run_config(tmp_path, trainer={"loggers": ["jsonl", "trackio"], "tracker": {"project": "rlf-test"}, "steps": 3})
    done = subprocess.run([sys.executable, "-m", "rlfactory.cli.main", "train", cfg3, "--resume"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    read = ("import json, sys\nfrom trackio.sqlite_storage import SQLiteStorage as S\n"
            "print(json.dumps({'runs': S.get_runs('rlf-test'), 'logs': S.get_logs('rlf-test', 'run'), "
            "'config': S.get_run_config('rlf-test', 'run')}, default=str))")
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["runs"] == ["run"]
    assert got["config"]["trainer"]["steps"] == 3  # the resumed run's config
    assert sorted({r["step"] for r in got["logs"] if "reward/mean" in r}) == [1, 2, 3]
    for record in records:
        (row,) = [r for r in got["logs"] if r.get("step") == record["step"] and "reward/mean" in r]
        assert row["reward/mean"] == pytest.approx(record["reward/mean"])
        assert row["accuracy"] == pytest.approx(record["accuracy"])
        (table,) = [r["trajectories"] for r in got["logs"] if r.get("step") == record["step"] and "trajectories" in r]
        assert table["_type"] == "trackio.table" and len(table["_value"]) == 4
