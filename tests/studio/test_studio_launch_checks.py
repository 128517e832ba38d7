"""The New run page's config check is the chosen command's own (a subprocess running
rlfactory.train.prepare.check_command), Resume asks before it would delete a run's history,
and launching never writes into an existing run. Real app, real check subprocesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from rlfactory.studio.app import StudioSettings, create_app
from rlfactory.studio.preflight import issue_of

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "unit-test-token-0123456789"
CALC = ROOT / "examples" / "rollout_calculator.yaml"


@pytest.fixture
def client(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    app = create_app(StudioSettings(runs=runs, token=TOKEN, workspace=ROOT, max_upload_bytes=1000))
    with TestClient(app, base_url="http://127.0.0.1:7860") as c:
        c.get(f"/?token={TOKEN}")
        yield c


def _check(client, command, overrides=()):
    return client.post("/api/config/check", json={"text": CALC.read_text(), "overrides": list(overrides),
                                                  "source": "examples/rollout_calculator.yaml", "command": command}).json()


def test_the_check_is_the_commands_own_train_needs_a_reward_sft_does_not(client):
    r = _check(client, "train")
    assert not r["ok"]
    (issue,) = r["issues"]
    assert issue["key"] == "reward" and "nothing configured" in issue["message"]
    assert _check(client, "train", ["reward.terms={numeric: 1.0}"])["ok"]
    assert _check(client, "sft")["ok"]
    r = _check(client, "train", ["tools.python=[rollout_calculator_tools:no_such_fn]"])
    assert not r["ok"] and r["issues"][0]["key"] == "tools.python[0]" and r["issues"][0]["line"] == 15
    assert client.post("/api/config/check", json={"text": "", "command": "rm"}).status_code == 400


def test_issue_of_keys_a_commands_line():
    assert issue_of("env.name: building env 'x' failed").key == "env.name"
    assert issue_of("something odd happened").key == "(command check)"


def _stopped_run(runs: Path, name: str, steps: int) -> Path:
    run = runs / name
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text(CALC.read_text().replace("rollout:", "trainer:\n  steps: 100\nrollout:"))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1}) + "\n" for s in range(1, steps + 1)))
    for s in range(1, steps + 1):
        (run / "trajectories" / f"step_{s:06d}.jsonl").write_text("{}\n")
    return run


def test_resume_without_a_checkpoint_asks_first_with_the_commands_words(client):
    runs = client.app.state.studio.runs
    run = _stopped_run(runs, "stopped", 3)
    before = (run / "metrics.jsonl").read_text()
    r = client.post("/api/run/resume", json={"run": "stopped"})
    assert r.status_code == 409
    msg = r.json()["error"]
    assert "no checkpoint to resume from" in msg and "3 logged steps (metrics.jsonl) and 3 trajectory files" in msg
    assert "--restart" in msg
    assert (run / "metrics.jsonl").read_text() == before and client.get("/api/jobs").json()["jobs"] == []


def test_launching_into_an_existing_run_name_is_refused(client):
    runs = client.app.state.studio.runs
    _stopped_run(runs, "taken", 2)
    r = client.post("/api/jobs", json={"command": "train", "text": CALC.read_text(), "name": "taken",
                                       "overrides": ["reward.terms={numeric: 1.0}"], "source": "examples/rollout_calculator.yaml"})
    assert r.status_code == 400 and "taken already exists" in r.json()["error"]
    assert len((runs / "taken" / "metrics.jsonl").read_text().splitlines()) == 2


def test_the_default_config_is_the_demo(client):
    assert client.get("/api/configs").json()["default"] == "examples/demo.yaml"
