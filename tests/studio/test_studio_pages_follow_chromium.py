"""What a user met in an hour with the studio (issue 25): the run header follows the run, tick
labels tell ticks apart, a trajectory opens in view, previews show whole lines and words, the
token colours have a legend, the playground and the Tools page take the example configs as they
are written, the Data page lists datasets only, the Rewards page's section survives a change of
source. Real `rlfactory ui`, headless Chromium."""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import CALC

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def _run(runs_root, name: str, records: list[dict], steps_total: int = 100, old: bool = False):
    run = runs_root / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(CALC.read_text().replace("rollout:", f"trainer:\n  steps: {steps_total}\nrollout:"))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if old:
        t = time.time() - 3600
        for f in run.iterdir():
            os.utime(f, (t, t))
    return run


def test_the_header_follows_the_steps_and_tick_labels_differ(page, studio, runs_root):
    entropy = [7.6012, 7.6015, 7.6018]  # a narrow range: one significant digit would print 7.6e+0 three times
    run = _run(runs_root, "following", [{"step": 1, "reward/mean": 0.1, "policy/entropy": entropy[0]}])
    page.goto(f"{studio.url}/#/run/following")
    page.wait_for_selector(".chart[data-title='Entropy']")
    assert "step 1 / 100" in page.inner_text("#run-summary")
    with open(run / "metrics.jsonl", "a") as f:  # the run goes on
        for s, v in ((2, entropy[1]), (3, entropy[2])):
            f.write(json.dumps({"step": s, "reward/mean": 0.1 * s, "policy/entropy": v}) + "\n")
    page.wait_for_function("document.querySelector(\".chart[data-title='Entropy']\").dataset.points === '3'")
    page.wait_for_function("document.querySelector('#run-summary').textContent.includes('step 3 / 100')", timeout=10000)
    labels = page.get_attribute(".chart[data-title='Entropy']", "data-yticks").split("|")
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    assert all(float(x) == pytest.approx(7.6015, abs=1e-3) for x in labels), labels

    _run(runs_root, "one-step", [{"step": 1, "reward/mean": 0.1}])
    page.goto(f"{studio.url}/#/run/one-step")
    page.wait_for_selector("#metrics-note")
    assert page.inner_text("#metrics-note") == "1 step."


def _many_trajectories(trained_run, runs_root):
    """A step of 24 groups (from a real run's trajectories), one of them with a long model text."""
    records = [json.loads(line) for line in (trained_run / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    run = _run(runs_root, "many", [{"step": 1, "reward/mean": 0.5}], steps_total=1, old=True)
    (run / "trajectories").mkdir(exist_ok=True)
    out = []
    for g in range(24):
        for k in range(2):
            r = json.loads(json.dumps(records[k]))
            r["group"], r["id"] = f"g{g:02d}", f"g{g:02d}-{k}"
            out.append(r)
    long_text = "\n".join(f"line {i}: the model thinks aloud about the sum of seventeen and twenty-five" for i in range(8))
    for seg in out[0]["segments"]:
        if seg["role"] == "model":
            seg["text"] = long_text
    (run / "trajectories" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    return long_text


def test_a_card_opens_its_trajectory_in_view_with_whole_line_previews_and_a_colour_legend(page, studio, trained_run, runs_root):
    long_text = _many_trajectories(trained_run, runs_root)
    page.goto(f"{studio.url}/#/run/many?tab=traj&step=1")
    page.wait_for_selector("#groups .member[data-index='47']")
    preview = page.query_selector("#groups .member[data-index='0'] .preview")
    text = preview.inner_text()
    assert text.startswith("… ") and long_text.endswith(text[2:])
    first_word = text[2:].split()[0]
    assert f" {first_word}" in long_text or f"\n{first_word}" in long_text  # starts at a word
    lines = page.evaluate("""el => { const lh = parseFloat(getComputedStyle(el).lineHeight);
        return [el.clientHeight / lh, el.firstElementChild.getBoundingClientRect().height > el.clientHeight]; }""", preview)
    assert lines[1] and abs(lines[0] - round(lines[0])) < 0.05, lines  # clipped at a line boundary

    page.click("#groups .member[data-index='0']")
    page.wait_for_selector("#segments .seg.model")
    page.wait_for_function(f"(t => t >= 0 && t < {page.viewport_size['height'] - 100})"
                           "(document.querySelector('#traj-detail').getBoundingClientRect().top)")  # the detail is on screen
    assert "model token (in the loss)" in page.inner_text("#color-legend")
    page.select_option("#color-by", "diff")
    assert "trainer lower" in page.inner_text("#color-legend")


def test_the_data_page_lists_no_tool_config_as_a_dataset(page, studio):
    page.goto(f"{studio.url}/#/data")
    page.wait_for_selector("#data-file")
    labels = [o.inner_text() for o in page.query_selector_all("#data-file option")]
    assert "examples/rollout_calculator.jsonl" in labels
    assert "examples/mcp_tools.json" not in labels


def test_tools_page_loads_the_python_tools_of_a_run_config_as_written(page, studio):
    page.goto(f"{studio.url}/#/tools")
    page.select_option("#tool-file", label="examples/rollout_calculator.yaml")  # tools.python: [rollout_calculator_tools:calculate]
    page.click("#tool-load")
    page.wait_for_selector(".toolitem[data-tool='calculate']", timeout=60000)
    page.click(".toolitem[data-tool='calculate']")
    page.fill("#tool-raw", '{"expression": "17+25"}')
    page.click("#tool-call")
    page.wait_for_selector("#tool-output")
    assert page.inner_text("#tool-output").strip() == "42"


def test_the_playground_runs_the_demo_config_with_its_own_turn_limit(page, studio):
    page.goto(f"{studio.url}/#/playground")
    page.select_option("#pg-config", label="examples/demo.yaml")  # env.options.max_turns: 4
    page.fill("#pg-question", "Where was Ada born?")
    page.click("#pg-run")
    page.wait_for_selector("#pg-done, #pg-state .error-box", timeout=180000)
    assert page.query_selector("#pg-state .error-box") is None, page.inner_text("#pg-state")


def test_the_rewards_section_lands_on_the_runs_config_and_survives_a_change_of_source(page, studio, trained_run):
    page.goto(f"{studio.url}/#/rewards")
    page.select_option("#pick-run", "calc")
    page.wait_for_selector("#pick-step option[value='2']", state="attached")
    page.select_option("#pick-step", "2")
    page.check("input[data-term='tool_errors']")
    page.fill("input[data-weight='tool_errors']", "0.5")
    page.click("#score")
    page.click("#use-reward")
    page.wait_for_function("document.querySelector('#yaml') && document.querySelector('#yaml').value.includes('tool_errors: 0.5')")
    assert page.input_value("#source") == "run:calc"  # the run the trajectory came from
    page.select_option("#source", "examples/rollout_calculator.yaml")
    page.wait_for_function("document.querySelector('#yaml').value.includes('rollout_calculator')")
    page.wait_for_function("document.querySelector('#yaml').value.includes('tool_errors: 0.5')")
    page.click("#drop-reward")
    page.wait_for_function("!document.querySelector('#yaml').value.includes('tool_errors')")
