"""The tracker controls in real headless Chromium against a real `rlfactory ui` and real tiny
training runs: chart smoothing, log scale, time axis, zoom and pan, PNG and CSV downloads; the
system metrics charts; the Runs page's search, sort, tags and notes, delete and config diff; Stop
on the run's page; the "what changed" view of one prompt at two steps."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import socket
import time

import pytest

from conftest import CALC, SMALL_CALC, train

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


@pytest.fixture(scope="module")
def views_run(runs_root):
    """2 steps, every prompt of the 4-row dataset at each step (so each prompt recurs)."""
    run = runs_root / "views"
    if not (run / "metrics.jsonl").is_file():
        train(run, "trainer.steps=2", "trainer.prompts_per_step=4")
    return run


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _ema(values, w):
    """TensorBoard's debiased EMA, written out again here from its definition."""
    last, n, out = 0.0, 0, []
    const = len(set(values)) == 1
    for v in values:
        if const:
            out.append(v)
            continue
        last = last * w + (1 - w) * v
        n += 1
        out.append(last / (1 - w ** n))
    return out


def _download(page, selector):
    with page.expect_download() as info:
        page.click(selector)
    d = info.value
    return d.suggested_filename, open(d.path(), "rb").read()


def _plot_box(page, title):
    box = page.query_selector(f".chart[data-title='{title}'] canvas").bounding_box()
    left = box["x"] + 48  # the plot starts after the y labels (chart.js _geom: l=48, r=10)
    return left, box["x"] + box["width"] - 10, box["y"] + box["height"] / 2


def _data(page, title, key):
    return page.get_attribute(f".chart[data-title='{title}']", f"data-{key}")


def test_chart_math_matches_its_definitions(page, studio):
    got = page.evaluate("""async () => {
      const m = await import('/static/js/chart_math.js');
      return { ema: m.ema([1, 2, null, 3], 0.5), flat: m.ema([2, 2, 2], 0.9), none: m.ema([1, 5], 0),
               log: m.logTicks(-1.2, 0.5), logWide: m.logTicks(-3.5, 2.2),
               dur: [0, 59, 90, 3600, 3725, 90061].map(m.duration),
               times: m.relativeTimes([100.5, 102, null], null), cum: m.relativeTimes(null, [2, 3, null, 1]),
               csv: m.toCsv([{ name: 'a', steps: [1, 2], values: [1, 3], times: [0, 5] },
                             { name: 'b,c', steps: [2], values: [7], times: [5] }], 0.5) };
    }""")
    assert got["ema"][0] == 1 and got["ema"][1] == pytest.approx(1.25 / 0.75) and got["ema"][2] is None
    assert got["ema"][3] == pytest.approx(_ema([1, 2, 3], 0.5)[2])
    assert got["flat"] == [2, 2, 2] and got["none"] == [1, 5]
    assert got["log"] == pytest.approx([0.1, 0.2, 0.5, 1, 2])
    assert got["logWide"] == pytest.approx([0.001, 0.01, 0.1, 1, 10, 100])
    assert got["dur"] == ["0s", "59s", "1m30s", "1h00m", "1h02m", "1d01h"]
    assert got["times"] == [0, 1.5, None] and got["cum"] == [2, 5, 5, 6]
    assert got["csv"] == 'step,time_s,a,a (smoothed),"b,c","b,c (smoothed)"\n1,0,1,1,,\n2,5,3,2.3333333333333335,7,7\n'


def test_chart_smoothing_log_time_zoom_pan_and_downloads(page, studio, views_run):
    records = _records(views_run)
    page.goto(f"{studio.url}/#/run/views")
    page.wait_for_selector(".chart[data-title='Reward'] canvas")
    page.evaluate("localStorage.removeItem('rlfactory.chartView')")
    # system metrics, logged by the trainer, are charted
    for title, key in (("System: CPU (% of one core)", "system/cpu_percent"), ("System: memory (MB)", "system/rss_mb")):
        assert int(_data(page, title, "points")) == sum(key in r for r in records) == len(records)

    # CSV: the raw values of metrics.jsonl, then with smoothing the debiased EMA beside them
    name, raw = _download(page, ".chart[data-title='Reward'] .chart-btn.csv")
    assert name == "reward.csv"
    rows = list(csv.DictReader(io.StringIO(raw.decode())))
    assert [int(r["step"]) for r in rows] == [r["step"] for r in records]
    assert [float(r["reward/mean"]) for r in rows] == pytest.approx([r["reward/mean"] for r in records])
    assert "reward/mean (smoothed)" not in rows[0]
    page.fill("#smoothing", "0.6")  # a range input: fill sets its value and fires input
    assert page.inner_text("#smoothing-value") == "0.60"
    _, raw = _download(page, ".chart[data-title='System: memory (MB)'] .chart-btn.csv")
    rows = list(csv.DictReader(io.StringIO(raw.decode())))
    rss = [r["system/rss_mb"] for r in records]
    assert [float(r["system/rss_mb (smoothed)"]) for r in rows] == pytest.approx(_ema(rss, 0.6))
    assert [float(r["system/rss_mb"]) for r in rows] == pytest.approx(rss)

    # PNG: a real image of the chart with its title and legend
    name, png = _download(page, ".chart[data-title='Grad norm'] .chart-btn.png")
    assert name == "grad-norm.png" and png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000

    # log scale: the y range is in log10 units around the logged values
    # (values <= 0 cannot be drawn there: counted, not drawn)
    page.check("#log-y")
    title = "Tokens per trajectory"
    assert _data(page, title, "scale") == "log"
    tokens = [r[k] for r in records for k in ("traj/tokens", "traj/model_tokens")]
    y0, y1 = float(_data(page, title, "y0")), float(_data(page, title, "y1"))
    lo, hi = math.log10(min(tokens)), math.log10(max(tokens))
    assert y0 < lo <= hi < y1 and y1 - y0 < (hi - lo) * 1.2 + 0.1
    assert int(_data(page, "Grad norm", "dropped")) == sum(r["optim/grad_norm"] <= 0 for r in records)
    page.uncheck("#log-y")
    assert _data(page, title, "scale") == "linear" and float(_data(page, title, "y1")) > max(tokens)

    # x axis by wall time: from 0 to the seconds between the first and the last record
    page.select_option("#x-axis", "time")
    span = records[-1]["wall_time"] - records[0]["wall_time"]
    assert float(_data(page, "Reward", "x0")) == 0
    assert float(_data(page, "Reward", "x1")) == pytest.approx(span, abs=1e-6)
    page.reload()  # the view is kept (localStorage), as TensorBoard keeps its smoothing
    page.wait_for_selector(".chart[data-title='Reward'] canvas")
    assert page.input_value("#x-axis") == "time" and page.input_value("#smoothing") == "0.6"
    page.select_option("#x-axis", "step")
    page.fill("#smoothing", "0")

    # zoom: drag across the middle half; pan: Shift+drag keeps the width; double-click: all again
    left, right, y = _plot_box(page, "Reward")
    x0, x1 = float(_data(page, "Reward", "x0")), float(_data(page, "Reward", "x1"))
    page.mouse.move(left + (right - left) * 0.25, y)
    page.mouse.down()
    page.mouse.move(left + (right - left) * 0.75, y, steps=4)
    page.mouse.up()
    assert _data(page, "Reward", "zoomed") == "1"
    z0, z1 = float(_data(page, "Reward", "x0")), float(_data(page, "Reward", "x1"))
    assert z0 == pytest.approx(x0 + (x1 - x0) * 0.25, rel=0.05) and z1 == pytest.approx(x0 + (x1 - x0) * 0.75, rel=0.05)
    assert "tab=traj" not in page.url  # a drag is not a click on a step
    page.keyboard.down("Shift")
    page.mouse.move(left + (right - left) * 0.6, y)
    page.mouse.down()
    page.mouse.move(left + (right - left) * 0.4, y, steps=4)
    page.mouse.up()
    page.keyboard.up("Shift")
    p0, p1 = float(_data(page, "Reward", "x0")), float(_data(page, "Reward", "x1"))
    assert p1 - p0 == pytest.approx(z1 - z0) and p0 > z0
    page.dblclick(".chart[data-title='Reward'] canvas")
    assert _data(page, "Reward", "zoomed") == "0" and float(_data(page, "Reward", "x0")) == x0
    page.mouse.move(left + (right - left) * 0.25, y)  # zoom two charts, then reset every chart
    page.mouse.down()
    page.mouse.move(left + (right - left) * 0.5, y, steps=3)
    page.mouse.up()
    assert _data(page, "Reward", "zoomed") == "1"
    page.click("#reset-zoom")
    assert _data(page, "Reward", "zoomed") == "0"


def _fake_run(runs_root, name, reward, steps=3, config="", old=True):
    run = runs_root / name
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text(config or "model: {path: tiny:1m}\nenv: {name: code}\n"
                                     f"trainer: {{steps: 10, lr: {reward}}}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": reward}) + "\n"
                                               for s in range(1, steps + 1)))
    if old:
        t = time.time() - 7200
        for f in run.iterdir():
            os.utime(f, (t, t))
    return run


def _ids(page):
    return [tr.get_attribute("data-run") for tr in page.query_selector_all("#runs-table tbody tr[data-run]")]


def test_runs_search_sort_tags_notes_and_delete(page, studio, runs_root):
    for name, reward in (("sweep-lo", 0.1), ("sweep-hi", 0.9), ("sweep-mid", 0.5), ("unrelated", 0.0)):
        _fake_run(runs_root, name, reward)
    busy = _fake_run(runs_root, "sweep-busy", 0.3)
    (busy / "run_state.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                                       "at": time.time()}))  # this test process stands in for a trainer
    page.goto(f"{studio.url}/#/runs")
    page.wait_for_selector("#runs-table tr[data-run='sweep-mid']")

    page.fill("#run-search", "sweep")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr[data-run]').length === 4")
    assert "4 of" in page.inner_text("#runs-shown")
    page.click("th[data-sort='reward']")  # first click on a number column: ascending
    assert _ids(page) == ["sweep-lo", "sweep-busy", "sweep-mid", "sweep-hi"]
    assert page.get_attribute("th[data-sort='reward']", "aria-sort") == "ascending"
    page.click("th[data-sort='reward']")
    assert _ids(page) == ["sweep-hi", "sweep-mid", "sweep-busy", "sweep-lo"]
    page.click("th[data-sort='run']")
    assert _ids(page) == ["sweep-busy", "sweep-hi", "sweep-lo", "sweep-mid"]

    # tags and notes: saved beside the logs, shown, searchable
    metrics = (runs_root / "sweep-hi" / "metrics.jsonl").read_bytes()
    page.click("tr[data-run='sweep-hi'] .edit-notes")
    page.fill("#tags-input", "best, lr-0.9")
    page.fill("#notes-input", "the one to keep\nsecond line")
    page.click("#notes-save")
    page.wait_for_selector("tr[data-run='sweep-hi'] td.tags .tag")
    assert json.loads((runs_root / "sweep-hi" / "studio_notes.json").read_text()) == {
        "tags": ["best", "lr-0.9"], "notes": "the one to keep\nsecond line"}
    assert (runs_root / "sweep-hi" / "metrics.jsonl").read_bytes() == metrics
    assert "the one to keep" in page.inner_text("tr[data-run='sweep-hi']")
    page.fill("#run-search", "keep")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr[data-run]').length === 1")
    page.fill("#run-search", "lr-0.9 best")
    assert _ids(page) == ["sweep-hi"]
    page.click("tr[data-run='sweep-hi'] .edit-notes")  # a bad tag: said in one line, nothing changed
    page.fill("#tags-input", "x" * 41)
    page.click("#notes-save")
    page.wait_for_selector("#notes-editor .error-box:has-text('at most 40')")
    assert json.loads((runs_root / "sweep-hi" / "studio_notes.json").read_text())["tags"] == ["best", "lr-0.9"]

    # delete: asked first; Cancel keeps it; a running run cannot be deleted
    page.fill("#run-search", "sweep")
    page.click("tr[data-run='sweep-lo'] .delete-run")
    assert "cannot be undone" in page.inner_text("#delete-confirm")
    page.click("#cancel-delete")
    assert page.query_selector("#delete-confirm") is None and (runs_root / "sweep-lo").is_dir()
    page.click("tr[data-run='sweep-lo'] .delete-run")
    page.click("#confirm-delete")
    page.wait_for_function("!document.querySelector(\"#runs-table tr[data-run='sweep-lo']\")")
    assert not (runs_root / "sweep-lo").exists()
    assert page.is_disabled("tr[data-run='sweep-busy'] .delete-run")
    r = studio.api("/api/run/delete", method="POST", json={"run": "sweep-busy", "confirm": "sweep-busy"})
    assert r.status_code == 409 and (busy / "metrics.jsonl").is_file()
    (busy / "run_state.json").unlink()


def test_compare_shows_the_curves_and_the_config_keys_that_differ(page, studio, runs_root):
    _fake_run(runs_root, "cmp-a", 0.2)
    _fake_run(runs_root, "cmp-b", 0.4)
    page.goto(f"{studio.url}/#/runs")
    page.fill("#run-search", "cmp-")
    page.check("tr[data-run='cmp-a'] input[type=checkbox]")
    page.check("tr[data-run='cmp-b'] input[type=checkbox]")
    page.click("#compare")
    page.wait_for_selector("#config-diff-table")
    assert page.inner_text("#config-diff-table tr[data-key='trainer.lr']").split() == ["trainer.lr", "0.2", "0.4"]
    assert len(page.query_selector_all("#config-diff-table tbody tr")) == 1
    assert "other keys have one value" in page.inner_text("#config-diff")
    page.wait_for_function("document.querySelector('#compare-box .chart').dataset.points === '6'")
    page.fill("#smoothing", "0.5")  # the compare chart has the view bar too
    assert page.inner_text("#compare-box #smoothing-value") == "0.50"


def test_stop_on_the_run_page(page, studio, runs_root):
    r = studio.api("/api/jobs", method="POST", json={
        "command": "train", "text": CALC.read_text(), "source": "examples/rollout_calculator.yaml", "name": "to-stop",
        "overrides": [*SMALL_CALC, "trainer.steps=500"]})
    assert r.status_code == 201, r.text
    job = r.json()["job"]
    run = runs_root / "to-stop"
    deadline = time.time() + 180
    while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    page.goto(f"{studio.url}/#/run/to-stop")
    page.wait_for_selector(f"#stop-run[data-job='{job['id']}']:not([disabled])")
    # the time axis follows a live run too: each new record extends it by its wall_time
    page.select_option("#x-axis", "time")
    page.wait_for_selector(".chart[data-title='Reward'][data-x1]")
    x1 = float(_data(page, "Reward", "x1") or 0)
    page.wait_for_function(f"Number(document.querySelector(\".chart[data-title='Reward']\").dataset.x1) > {x1}",
                           timeout=120000)
    shown = float(_data(page, "Reward", "x1"))
    page.select_option("#x-axis", "step")
    page.click("#stop-run")
    page.wait_for_selector("#run-status .badge.stopped", timeout=90000)
    assert studio.api(f"/api/job?id={job['id']}").json()["job"]["state"] == "stopped"
    assert page.query_selector("#stop-run") is None  # a stopped run offers Resume, not Stop
    records = _records(run)
    assert shown <= records[-1]["wall_time"] - records[0]["wall_time"] + 1e-6 and shown > 0


def test_stop_is_offered_only_for_studio_jobs(page, studio, runs_root):
    run = _fake_run(runs_root, "cli-running", 0.1)
    (run / "run_state.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                                      "at": time.time()}))
    try:
        page.goto(f"{studio.url}/#/run/cli-running")
        page.wait_for_selector("#stop-run[data-state='elsewhere']")
        assert page.is_disabled("#stop-run") and "Ctrl-C" in page.get_attribute("#stop-run", "title")
    finally:
        (run / "run_state.json").unlink()


def _groups_by_prompt(run, step):
    out = {}
    for i, line in enumerate((run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()):
        t = json.loads(line)
        prompt = next(s for s in t["segments"] if s["role"] == "prompt")
        out.setdefault(tuple(prompt["token_ids"]), []).append((i, t))
    return out


def test_what_changed_sets_one_prompt_at_two_steps_side_by_side(page, studio, views_run):
    first, last = _groups_by_prompt(views_run, 1), _groups_by_prompt(views_run, 2)
    assert set(first) == set(last) and len(first) == 4
    page.goto(f"{studio.url}/#/run/views")
    page.click("#tab-changes")
    page.wait_for_selector("#chg-stats")
    assert page.input_value("#chg-a") == "1" and page.input_value("#chg-b") == "2"
    assert len(page.query_selector_all("#chg-prompt option")) == 4
    for choice in range(4):
        page.select_option("#chg-prompt", index=choice)
        page.wait_for_function("(document.querySelector('#chg-out > [data-key]') || {dataset: {}}).dataset.key === "
                               "document.querySelector('#chg-prompt').value")
        a_idx = [int(e.get_attribute("data-index")) for e in page.query_selector_all(".chg-side[data-step='1'] .chg-member")]
        b_idx = [int(e.get_attribute("data-index")) for e in page.query_selector_all(".chg-side[data-step='2'] .chg-member")]
        prompt = next(k for k, members in first.items() if [i for i, _ in members] == a_idx)
        assert b_idx == [i for i, _ in last[prompt]]  # the same prompt's group at step 2
        mean = lambda ms: sum(t["reward"] for _, t in ms) / len(ms)  # noqa: E731
        cells = page.inner_text("#chg-stats tr[data-stat='reward_mean']").split("\t")
        assert float(cells[1]) == pytest.approx(mean(first[prompt]), abs=5e-4)
        assert float(cells[2]) == pytest.approx(mean(last[prompt]), abs=5e-4)
        model_text = "".join(s["text"] for s in last[prompt][0][1]["segments"] if s["role"] == "model")
        side_b = page.inner_text(".chg-side[data-step='2'] .chg-member >> nth=0")
        assert model_text.strip()[:40] in side_b
    page.click(".chg-side[data-step='2'] .chg-member >> nth=0 >> a:has-text('open')")
    page.wait_for_selector("#segments .seg.model")
    assert "tab=traj" in page.url and "step=2" in page.url
