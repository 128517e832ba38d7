"""Launching, stopping and resuming from the studio never loses a run's history, and "valid" means
the chosen command gets past its checks (issue 25). Real `rlfactory ui`, real training runs,
headless Chromium."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import CALC, SMALL_CALC
from rlfactory.train.checkpoint import list_checkpoints
from rlfactory.train.runlog import read_metrics

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def _launch(studio, name: str, *overrides: str) -> dict:
    r = studio.api("/api/jobs", method="POST", json={"command": "train", "text": CALC.read_text(), "name": name,
                                                     "source": "examples/rollout_calculator.yaml",
                                                     "overrides": [*SMALL_CALC, *overrides]})
    assert r.status_code == 201, r.text
    return r.json()["job"]


def _wait_steps(studio, run: Path, n: int, timeout: float = 240) -> None:
    """Until metrics.jsonl holds `n` steps, while the latest job runs (its log when it does not)."""
    deadline = time.monotonic() + timeout
    while len(read_metrics(run / "metrics.jsonl")) < n:
        job = studio.api("/api/jobs").json()["jobs"][0]
        if job["state"] != "running" or time.monotonic() > deadline:
            log = studio.api(f"/api/job?id={job['id']}").json()["log"]
            raise AssertionError(f"{run} logged fewer than {n} steps; job {job['state']}: {log[-3000:]}")
        time.sleep(0.2)


def test_stop_then_resume_continues_and_keeps_every_logged_step(page, studio, runs_root):
    """The issue's journey: save_every 0, Stop after a few steps, Resume."""
    run = runs_root / "stop-resume"
    job = _launch(studio, "stop-resume", "trainer.steps=200")  # SMALL_CALC has trainer.save_every=0
    _wait_steps(studio, run, 2)
    stopped = studio.api("/api/job/stop", method="POST", json={"id": job["id"]}).json()["job"]
    assert stopped["state"] == "stopped" and stopped["returncode"] == 130
    logged = read_metrics(run / "metrics.jsonl")
    assert [s for s, _ in list_checkpoints(run)] == [logged[-1]["step"]]  # the Stop's own checkpoint

    page.goto(f"{studio.url}/#/run/stop-resume")
    page.wait_for_selector("#run-status .badge.stopped")
    page.click("#resume")
    page.wait_for_selector("#job-state .badge.running")
    assert "--resume" in page.inner_text("#job") and "--restart" not in page.inner_text("#job")
    _wait_steps(studio, run, len(logged) + 1)
    assert read_metrics(run / "metrics.jsonl")[:len(logged)] == logged  # nothing logged was lost
    page.click("#stop")
    page.wait_for_selector("#job-state .badge.stopped", timeout=90000)


def test_resume_without_a_checkpoint_asks_first_and_cancel_deletes_nothing(page, studio, runs_root):
    run = runs_root / "no-checkpoint"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text(CALC.read_text().replace("rollout:", "trainer:\n  steps: 100\nrollout:"))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.2}) + "\n" for s in (1, 2, 3)))
    for s in (1, 2, 3):
        (run / "trajectories" / f"step_{s:06d}.jsonl").write_text("{}\n")
    old = time.time() - 3600  # written an hour ago: a stopped run, not a running one
    for f in (run / "config.yaml", run / "metrics.jsonl"):
        os.utime(f, (old, old))
    before = (run / "metrics.jsonl").read_text()
    jobs_before = len(studio.api("/api/jobs").json()["jobs"])
    page.goto(f"{studio.url}/#/run/no-checkpoint")
    page.click("#resume")
    refusal = page.wait_for_selector("#resume-refusal").inner_text()
    assert "no checkpoint to resume from" in refusal and "3 logged steps (metrics.jsonl) and 3 trajectory files" in refusal
    assert "--restart" in refusal
    page.click("#cancel-restart")
    assert page.query_selector("#resume-refusal") is None
    assert (run / "metrics.jsonl").read_text() == before
    assert len(studio.api("/api/jobs").json()["jobs"]) == jobs_before  # nothing started


def test_valid_means_the_chosen_command_would_pass_its_own_checks(page, studio):
    page.goto(f"{studio.url}/#/new")
    page.wait_for_selector("#config-ok, #config-errors, #config-checking")
    assert page.input_value("#source") == "examples/demo.yaml"  # the default: a train config that runs on a CPU
    page.select_option("#source", "examples/rollout_calculator.yaml")
    page.wait_for_function("document.querySelector('#yaml').value.includes('rollout_calculator')")
    page.select_option("#command", "train")
    page.wait_for_selector("#config-errors li[data-key='reward']", timeout=90000)  # train needs a reward
    assert "nothing configured" in page.inner_text("#config-errors")
    page.select_option("#command", "sft")
    page.wait_for_selector("#config-ok[data-command='sft']", timeout=90000)  # sft does not
    page.select_option("#command", "train")
    page.fill("#overrides", "reward.terms={numeric: 1.0, format: 0.1}")
    page.wait_for_selector("#config-ok[data-command='train']", timeout=90000)


def test_a_launch_that_fails_at_start_is_a_run_with_its_error_and_its_log_is_shown_once(page, studio, runs_root):
    events = []
    page.on("request", lambda r: events.append(r.url) if "/api/job/events" in r.url else None)
    page.goto(f"{studio.url}/#/new")
    page.wait_for_selector("#config-ok, #config-errors, #config-checking")
    page.select_option("#source", "examples/rollout_calculator.yaml")
    page.wait_for_function("document.querySelector('#yaml').value.includes('rollout_calculator')")
    page.fill("#run-name", "fails-at-start")
    page.click("#launch")  # no reward: `rlfactory train` stops at its checks
    page.wait_for_selector("#job-state .badge.failed", timeout=120000)
    ended = time.monotonic()
    # EventSource reconnects 3 s after a stream ends unless the page closes it
    while time.monotonic() - ended < 4.5:
        page.wait_for_timeout(250)
    log = page.inner_text("#job-log")
    assert log.count("nothing configured") == 1, log
    assert len(events) == 1, events

    page.goto(f"{studio.url}/#/runs")
    row = page.wait_for_selector("#runs-table tr[data-run='fails-at-start']")
    assert "failed" in row.inner_text()
    page.goto(f"{studio.url}/#/run/fails-at-start")
    page.wait_for_selector("#run-status .badge.failed")
    assert "nothing configured" in page.inner_text("#run-reason")
