"""The run-management routes against the real app (no browser): tags and notes kept beside the
logs, deletion refused unless confirmed and never for a running run, config diffs, a run's job,
and the "what changed" view matching one prompt across two steps."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from rlfactory.studio.app import StudioSettings, create_app
from rlfactory.studio.run_meta import NOTES_FILE

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "unit-test-token-0123456789"
OLD = time.time() - 3600


def _run(runs: Path, name: str, config: str, steps: int = 2) -> Path:
    run = runs / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n"
                                               for s in range(1, steps + 1)))
    for f in run.iterdir():
        os.utime(f, (OLD, OLD))
    return run


def _traj(group: str, k: int, prompt_ids: list[int], prompt: str, answer: str, reward: float,
          status: str = "ok") -> dict:
    return {"id": f"{group}-{k}", "group": group, "status": status, "reward": reward, "turns": 1,
            "info": {"question": prompt}, "tool_calls": [],
            "segments": [{"role": "prompt", "token_ids": prompt_ids, "text": prompt},
                         {"role": "model", "token_ids": [7, 8, 9], "text": answer, "logprobs": [-1.0, -1.0, -1.0]}]}


@pytest.fixture
def client(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "a", "model: {path: tiny:1m}\ntrainer: {steps: 2, lr: 1.0e-05}\nalgo: {group_size: 4}\n")
    _run(runs, "b", "model: {path: tiny:1m}\ntrainer: {steps: 2, lr: 3.0e-05}\nalgo: {group_size: 4}\nextra: [1, 2]\n")
    app = create_app(StudioSettings(runs=runs, token=TOKEN, workspace=ROOT))
    with TestClient(app, base_url="http://127.0.0.1:7860") as c:
        c.cookies.set("rlfactory_studio", TOKEN)
        yield c


def _runs(client) -> Path:
    return client.app.state.studio.runs


def test_tags_and_notes_live_in_their_own_file_and_bad_ones_write_nothing(client):
    run = _runs(client) / "a"
    metrics = (run / "metrics.jsonl").read_bytes()
    r = client.post("/api/run/notes", json={"run": "a", "tags": [" baseline ", "lr-sweep", "baseline"],
                                            "notes": "first try"})
    assert r.status_code == 200 and r.json()["tags"] == ["baseline", "lr-sweep"]
    assert json.loads((run / NOTES_FILE).read_text()) == {"tags": ["baseline", "lr-sweep"], "notes": "first try"}
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert client.get("/api/runs/notes").json()["notes"] == {"a": {"tags": ["baseline", "lr-sweep"], "notes": "first try"},
                                                            "b": {"tags": [], "notes": ""}}
    for bad, why in ((["x" * 41], "at most 40"), (["a,b"], "no commas"), ([3], "list of strings"),
                     ({"t": 1}, "list of strings"), ([f"t{i}" for i in range(21)], "at most 20")):
        r = client.post("/api/run/notes", json={"run": "a", "tags": bad, "notes": "changed"})
        assert r.status_code == 400 and why in r.json()["error"], (bad, r.json())
    r = client.post("/api/run/notes", json={"run": "a", "tags": [], "notes": 5})
    assert r.status_code == 400 and "notes" in r.json()["error"]
    assert json.loads((run / NOTES_FILE).read_text())["notes"] == "first try"  # unchanged
    assert client.post("/api/run/notes", json={"run": "../a", "tags": []}).status_code == 400


def test_delete_needs_the_run_id_repeated_and_removes_only_that_run(client):
    runs = _runs(client)
    r = client.post("/api/run/delete", json={"run": "a"})
    assert r.status_code == 400 and "not confirmed" in r.json()["error"] and (runs / "a").is_dir()
    r = client.post("/api/run/delete", json={"run": "a", "confirm": "b"})
    assert r.status_code == 400 and (runs / "a").is_dir()
    r = client.post("/api/run/delete", json={"run": "a", "confirm": "a"})
    assert r.status_code == 200 and not (runs / "a").exists() and (runs / "b").is_dir()
    assert [x["id"] for x in client.get("/api/runs").json()["runs"]] == ["b"]
    for bad in ("..", ".", ""):
        r = client.post("/api/run/delete", json={"run": bad, "confirm": bad})
        assert r.status_code == 400, bad
    assert runs.is_dir() and (runs / "b").is_dir()


def test_a_running_run_is_never_deleted(client):
    runs = _runs(client)
    # a `rlfactory train` started elsewhere says so in run_state.json; this process stands in for it
    (runs / "b" / "run_state.json").write_text(json.dumps({"state": "running", "pid": os.getpid(),
                                                             "host": socket.gethostname(), "at": time.time()}))
    r = client.post("/api/run/delete", json={"run": "b", "confirm": "b"})
    assert r.status_code == 409 and "is running" in r.json()["error"] and "stop it first" in r.json()["error"]
    assert (runs / "b" / "metrics.jsonl").is_file()


def test_config_diff_lists_only_the_keys_that_differ(client):
    d = client.get("/api/runs/diff", params=[("run", "a"), ("run", "b")]).json()
    assert d["runs"] == ["a", "b"]
    assert d["differ"] == [{"key": "extra", "values": [None, [1, 2]]}, {"key": "trainer.lr", "values": [1e-05, 3e-05]}]
    assert d["same"] == 3
    r = client.get("/api/runs/diff", params={"run": "a"})
    assert r.status_code == 400 and "2 to 10 runs" in r.json()["error"]
    assert client.get("/api/runs/diff", params=[("run", "a"), ("run", "../x")]).status_code == 400


def test_a_run_started_elsewhere_has_no_job(client):
    assert client.get("/api/run/job", params={"run": "a"}).json() == {"job": None}


def _write_step(run: Path, step: int, trajs: list[dict]) -> None:
    (run / "trajectories").mkdir(exist_ok=True)
    (run / "trajectories" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajs))


def test_what_changed_matches_a_prompt_by_its_tokens_not_its_group_name(client):
    run = _runs(client) / "a"
    _write_step(run, 1, [_traj("0", 0, [1, 2, 3], "2+2?", "five", 0.0),
                         _traj("0", 1, [1, 2, 3], "2+2?", "5", 0.0, "truncated"),
                         _traj("1", 0, [4, 5], "3*3?", "9", 1.0), _traj("1", 1, [4, 5], "3*3?", "6", 0.0)])
    # step 2: "2+2?" comes back under another group name; "0" is now a different prompt
    _write_step(run, 2, [_traj("0", 0, [6], "1+1?", "2", 1.0), _traj("0", 1, [6], "1+1?", "2", 1.0),
                         _traj("1", 0, [1, 2, 3], "2+2?", "4", 1.0), _traj("1", 1, [1, 2, 3], "2+2?", "four", 0.5)])
    d = client.get("/api/run/changes", params={"run": "a", "a": 1, "b": 2}).json()
    assert [(c["group_a"], c["group_b"], c["label"]) for c in d["common"]] == [("0", "1", "2+2?")]
    assert d["only_a"] == 1 and d["only_b"] == 1
    p = d["picked"]
    assert p["question"] == "2+2?" and p["a"]["group"] == "0" and p["b"]["group"] == "1"
    assert p["a"]["stats"]["reward_mean"] == 0.0 and p["b"]["stats"]["reward_mean"] == 0.75
    assert p["a"]["stats"]["statuses"] == {"ok": 1, "truncated": 1} and p["b"]["stats"]["ok"] == 1.0
    assert [m["transcript"] for m in p["b"]["members"]] == [[{"role": "model", "text": "4", "cut": False}],
                                                           [{"role": "model", "text": "four", "cut": False}]]
    assert [m["index"] for m in p["b"]["members"]] == [2, 3]  # the trajectory viewer opens them by index
    r = client.get("/api/run/changes", params={"run": "a", "a": 1, "b": 2, "key": "0" * 16})
    assert r.status_code == 404 and "not rolled out at both" in r.json()["error"]
    assert client.get("/api/run/changes", params={"run": "a", "a": 1}).status_code == 400
    r = client.get("/api/run/changes", params={"run": "a", "a": 1, "b": 9})
    assert r.status_code == 404 and "step 9" in r.json()["error"]


def test_what_changed_says_when_no_prompt_recurs(client):
    run = _runs(client) / "a"
    _write_step(run, 1, [_traj("0", 0, [1], "p", "x", 0.0)])
    _write_step(run, 2, [_traj("0", 0, [2], "q", "y", 1.0)])
    d = client.get("/api/run/changes", params={"run": "a", "a": 1, "b": 2}).json()
    assert d["common"] == [] and d["picked"] is None and d["only_a"] == 1 and d["only_b"] == 1


def test_hostile_notes_and_a_symlink_out_of_the_runs_folder_change_nothing(client, tmp_path):
    runs = _runs(client)
    r = client.post("/api/run/notes", json={"run": "a", "tags": ["ok"], "notes": "x" * 20001})
    assert r.status_code == 400 and "at most 20000" in r.json()["error"]
    r = client.post("/api/run/notes", json={"run": "a", "tags": ["bell\x07"], "notes": ""})
    assert r.status_code == 400 and "control characters" in r.json()["error"]
    for tags, notes in ((["x"], "\ud800 lone"), (["\udfff"], "")):
        r = client.post("/api/run/notes", content=json.dumps({"run": "a", "tags": tags, "notes": notes}),
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "lone surrogate" in r.json()["error"]
    assert not (runs / "a" / NOTES_FILE).exists()
    (runs / "a" / NOTES_FILE).write_text("{not json")  # a damaged file reads as no tags, no notes
    assert client.get("/api/runs/notes").json()["notes"]["a"] == {"tags": [], "notes": ""}
    outside = tmp_path / "outside-run"
    outside.mkdir()
    (outside / "config.yaml").write_text("model: {path: tiny:1m}\n")
    (runs / "link").symlink_to(outside)
    r = client.post("/api/run/delete", json={"run": "link", "confirm": "link"})
    assert r.status_code == 400 and "outside" in r.json()["error"]
    r = client.post("/api/run/notes", json={"run": "link", "tags": ["x"]})
    assert r.status_code == 400
    assert (outside / "config.yaml").is_file() and not (outside / NOTES_FILE).exists()
