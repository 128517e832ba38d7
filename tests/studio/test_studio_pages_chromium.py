"""Runs, Live metrics and Trajectory viewer pages in real headless Chromium against a real
`rlfactory ui` process and real tiny training runs."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import TOKEN, train

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def test_a_request_without_the_token_is_refused(browser, studio):
    ctx = browser.new_context()
    pg = ctx.new_page()
    resp = pg.goto(f"{studio.url}/#/runs")
    assert resp.status == 401 and "Token needed" in pg.inner_text("h1")
    assert pg.goto(f"{studio.url}/api/runs").status == 401
    assert pg.goto(f"{studio.url}/?token=not-the-token").status == 401
    pg.goto(f"{studio.url}/?token={TOKEN}")  # the printed URL lets the browser in
    pg.wait_for_selector("#nav a.active")
    assert pg.url.endswith("/") and "token" not in pg.url
    ctx.close()


def test_runs_page_lists_statuses_and_compares_two_runs(page, studio, trained_run, runs_root):
    stale = runs_root / "stale"
    stale.mkdir(exist_ok=True)
    (stale / "config.yaml").write_text("model: {path: tiny:1m}\nenv: {name: code}\nalgo: {advantage: rloo, loss: gspo}\n"
                                       "trainer: {steps: 10}\n")
    (stale / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 4, "accuracy": 0.1 * s}) + "\n"
                                                 for s in (1, 2, 3)))
    old = time.time() - 3600
    for f in stale.iterdir():
        os.utime(f, (old, old))
    page.goto(f"{studio.url}/#/runs")
    page.wait_for_selector("#runs-table tr[data-run='stale']")
    row = page.inner_text("#runs-table tr[data-run='calc']")
    assert "finished" in row and "tiny:1m" in row and "grpo/ppo" in row and "2 / 2" in row
    row = page.inner_text("#runs-table tr[data-run='stale']")
    assert "stopped" in row and "rloo/gspo" in row and "3 / 10" in row and "0.750" in row
    page.check("tr[data-run='calc'] input[type=checkbox]")
    page.check("tr[data-run='stale'] input[type=checkbox]")
    page.click("#compare")
    chart = page.wait_for_selector("#compare-box .chart")
    page.wait_for_function("document.querySelector('#compare-box .chart').dataset.points >= 5")
    legend = chart.inner_text()
    assert "calc" in legend and "stale" in legend


def test_a_live_run_chart_grows_while_the_page_is_open(page, studio, runs_root):
    run = runs_root / "live"
    proc = train(run, "trainer.steps=40", wait=False)
    try:
        deadline = time.time() + 180
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.time() < deadline, "training did not start"
            time.sleep(0.2)
        page.goto(f"{studio.url}/#/run/live")
        page.wait_for_selector(".chart[data-title='Reward']")
        page.evaluate("window.__same_page = true")
        first = int(page.get_attribute(".chart[data-title='Reward']", "data-points"))
        assert "running" in page.inner_text("#run-status")
        page.wait_for_function(f"Number(document.querySelector(\".chart[data-title='Reward']\").dataset.points) > {first} + 2",
                               timeout=120000)
        assert page.evaluate("window.__same_page") is True  # no reload: appended over server-sent events
        lines = len((run / "metrics.jsonl").read_text().splitlines())
        shown = int(page.get_attribute(".chart[data-title='Accuracy']", "data-points"))
        assert shown >= lines - 2  # every step so far (bar the ones in flight)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)


def test_trajectory_viewer_shows_tokens_logprobs_and_moves_by_keyboard(page, studio, trained_run):
    record = json.loads((trained_run / "trajectories" / "step_000002.jsonl").read_text().splitlines()[0])
    model_seg = next(s for s in record["segments"] if s["role"] == "model")
    page.goto(f"{studio.url}/#/run/calc")
    page.wait_for_selector(".chart[data-title='Reward'] canvas")
    box = page.query_selector(".chart[data-title='Reward'] canvas").bounding_box()
    page.mouse.click(box["x"] + box["width"] - 12, box["y"] + box["height"] / 2)  # a point on the chart -> its step
    page.wait_for_selector("#groups .member")
    assert "tab=traj" in page.url and "step=2" in page.url
    assert "4 of 4 trajectories, 2 groups" in page.inner_text("#step-count")
    page.click("#groups .member[data-index='0']")
    page.wait_for_selector("#segments .seg.model .tok.m")
    assert page.query_selector_all(".seg.observation .tok.m") == []  # observation tokens are drawn apart
    page.hover("#segments .seg.model .tok.m >> nth=0")
    assert page.inner_text("#ti-id") == str(model_seg["token_ids"][0])
    sampler = float(page.inner_text("#ti-sampler"))
    trainer = float(page.inner_text("#ti-trainer"))
    assert sampler == pytest.approx(model_seg["logprobs"][0], abs=1e-4)
    assert trainer == pytest.approx(model_seg["trainer_logprobs"][0], abs=1e-4)
    assert float(page.inner_text("#ti-diff")) == pytest.approx(trainer - sampler, abs=2e-4)
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#ti-id") == str(model_seg["token_ids"][1])
    page.keyboard.press("j")
    page.wait_for_selector("#groups .member.selected[data-index='1']")
    page.keyboard.press("[")
    page.wait_for_function("document.querySelector('#step-select').value === '1'")
    page.fill("#f-text", "zzz-not-in-any-trajectory")
    page.wait_for_function("document.querySelector('#step-count').textContent.startsWith('0 of 4')")
    page.fill("#f-text", "")
    page.select_option("#f-status", record["status"])
    page.wait_for_function("!document.querySelector('#step-count').textContent.startsWith('0 of')")
    statuses = {m.get_attribute("data-status") for m in page.query_selector_all("#groups .member")}
    assert statuses == {record["status"]}
