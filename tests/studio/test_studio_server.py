"""The studio's HTTP safety rules against the real app (no browser): the token on every request,
paths kept inside the runs folder, the upload limit, configs validated before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from rlfactory.studio.app import StudioSettings, create_app

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "unit-test-token-0123456789"


@pytest.fixture
def client(tmp_path):
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    (tmp_path / "secret.txt").write_text("not for the browser")
    app = create_app(StudioSettings(runs=runs, token=TOKEN, workspace=ROOT, max_upload_bytes=1000))
    with TestClient(app, base_url="http://127.0.0.1:7860") as c:
        yield c


def test_every_page_and_api_call_needs_the_token(client):
    for path in ("/", "/static/js/main.js", "/api/runs", "/api/run?run=a"):
        r = client.get(path)
        assert r.status_code == 401, path
    assert client.get("/api/runs", headers={"X-Studio-Token": "wrong-token-0123456789"}).status_code == 401
    assert client.get("/api/runs?token=wrong").json() == {"error": "wrong token"}
    assert client.post("/api/jobs", json={}).status_code == 401
    r = client.get("/", headers={"Accept": "text/html"})
    assert "Token needed" in r.text
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_token_in_the_url_becomes_a_cookie_and_leaves_the_url(client):
    r = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
    assert client.get("/api/runs").status_code == 200  # the cookie now carries it
    assert client.post("/api/config/check", json={"text": ""}, headers={"Origin": "http://evil.example"}).status_code == 403


def _auth(client):
    client.cookies.set("rlfactory_studio", TOKEN)


def test_run_paths_cannot_leave_the_runs_folder(client):
    _auth(client)
    assert client.get("/api/run?run=a").status_code == 200
    for bad in ("../", "../../etc", "/etc", "a/../../secret.txt", "a/../.."):
        r = client.get("/api/run", params={"run": bad})
        assert r.status_code == 400, bad
        assert "outside" in r.json()["error"] or "not a run" in r.json()["error"] or "does not exist" in r.json()["error"]
    r = client.post("/api/data/preview", json={"path": str(Path(client.app.state.studio.runs).parent / "secret.txt")})
    assert r.status_code == 400 and "outside" in r.json()["error"]


def test_uploads_over_the_limit_are_refused_and_leave_nothing(client):
    _auth(client)
    uploads = client.app.state.studio.runs / ".studio" / "uploads"
    r = client.post("/api/upload?name=big.jsonl", content=b"x" * 2000)
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert not uploads.exists() or not any(uploads.rglob("*.jsonl"))
    assert client.post("/api/upload?name=../evil.jsonl", content=b"{}").status_code == 400
    r = client.post("/api/upload?name=ok.jsonl", content=b'{"question": "q", "answer": "a"}\n')
    assert r.status_code == 201 and Path(r.json()["path"]).read_text().startswith('{"question"')


def test_a_bad_config_is_refused_with_its_key_and_line_and_starts_nothing(client):
    _auth(client)
    text = "model:\n  path: tiny:1m\ntrainer:\n  stepz: 3\n  lr: fast\n"
    r = client.post("/api/config/check", json={"text": text, "overrides": ["algo.group_size=0"]})
    issues = {i["key"]: i for i in r.json()["issues"]}
    assert not r.json()["ok"]
    assert issues["trainer.stepz"]["message"] == "unknown key" and issues["trainer.stepz"]["line"] == 4
    assert issues["trainer.lr"]["line"] == 5 and "algo" in issues
    jobs = client.app.state.studio.runs / ".studio" / "jobs"
    r = client.post("/api/jobs", json={"command": "train", "text": text, "name": "x"})
    assert r.status_code == 400 and r.json()["error"].startswith("launch refused")
    assert {i["key"] for i in r.json()["issues"]} >= {"trainer.stepz", "trainer.lr"}
    r = client.post("/api/jobs", json={"command": "rm", "text": "", "name": "x"})
    assert r.status_code == 400 and "command" in r.json()["error"]
    r = client.post("/api/jobs", json={"command": "train", "text": "{}", "name": "../escape"})
    assert r.status_code == 400 and "run name" in r.json()["error"]
    assert not jobs.exists() or not any(jobs.iterdir())
    assert not (client.app.state.studio.runs / "x").exists()
