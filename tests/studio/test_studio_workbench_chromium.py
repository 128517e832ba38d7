"""New run, Tools, Rewards, Data and Playground pages in real headless Chromium: launching and
stopping a real training run, real MCP tool servers, real scoring, real parquet, a real rollout."""

from __future__ import annotations

import json
import time

import pytest

from rlfactory.tools import process as procs

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def _pick_source(page, label):
    page.select_option("#source", label=label)
    page.wait_for_function(f"document.querySelector('#yaml').value.includes({json.dumps('rollout_calculator')})")


def test_an_older_config_check_answering_late_does_not_hide_a_newer_verdict(page, studio):
    """Checks run in a thread pool, so answers may arrive out of order: the verdict shown is the
    answer to the latest check sent (the check of the loaded YAML, held back here until the
    check with the overrides has been answered and shown, must not overwrite it)."""
    held = []

    def hold_the_first(route):
        if not held and "trainer.stepz" not in (route.request.post_data or ""):
            held.append(route)
        else:
            route.continue_()

    page.goto(f"{studio.url}/#/new")
    page.wait_for_selector("#config-ok, #config-errors, #config-checking")
    page.route("**/api/config/check", hold_the_first)
    _pick_source(page, "examples/rollout_calculator.yaml")  # its check is held
    deadline = time.monotonic() + 30
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the check of the loaded YAML was never sent"
    page.fill("#overrides", "trainer.stepz=3")
    page.wait_for_selector("#config-errors li[data-key='trainer.stepz']")
    answered = int(page.get_attribute("#verdict", "data-answers") or 0)
    held[0].continue_()  # the older check answers now: "valid"
    page.wait_for_function(f"Number(document.querySelector('#verdict').dataset.answers) > {answered}")
    assert page.query_selector("#config-errors li[data-key='trainer.stepz']") is not None
    assert page.query_selector("#config-ok") is None
    page.unroute("**/api/config/check")


def test_new_run_shows_config_errors_inline_launches_stops_and_resumes(page, studio, runs_root):
    page.goto(f"{studio.url}/#/new")
    page.wait_for_selector("#config-ok, #config-errors, #config-checking")
    _pick_source(page, "examples/rollout_calculator.yaml")
    page.fill("#overrides", "trainer.stepz=3\nalgo.group_size=0")
    page.wait_for_selector("#config-errors li[data-key='trainer.stepz']")
    errors = page.inner_text("#config-errors")
    assert "unknown key" in errors and "algo" in errors
    text = page.input_value("#yaml")
    page.fill("#overrides", "")
    page.fill("#yaml", text.replace("rollout:\n", "rollout:\n  max_new_tokenz: 5\n"))
    page.wait_for_selector("#config-errors li[data-key='rollout.max_new_tokenz']")
    line = text.splitlines().index("rollout:") + 2
    assert f"line {line}" in page.inner_text("#config-errors")
    assert page.get_attribute(f"#gutter div:nth-child({line})", "class") == "bad"
    page.click("#launch")  # refused: nothing starts
    page.wait_for_selector("#verdict .error-box:has-text('launch refused')")
    assert not (runs_root / page.input_value("#run-name")).exists()

    page.fill("#yaml", text)
    overrides = ["reward.terms={numeric: 1.0, format: 0.1}", "algo.group_size=2", "trainer.prompts_per_step=2",
                 "rollout.max_new_tokens=12", "rollout.max_total_tokens=1500", "trainer.steps=200", "trainer.save_every=1",
                 "tools.mcp=mcp_tools.json"]  # two stdio MCP servers (calculator, time) beside the python tool
    page.fill("#overrides", "\n".join(overrides))
    page.wait_for_selector("#config-ok", timeout=120000)  # after the command's own checks (MCP servers started)
    page.fill("#run-name", "launched")
    page.click("#launch")
    page.wait_for_selector("#job-state .badge.running")
    job_id = page.get_attribute("#job [data-job]", "data-job")
    run = runs_root / "launched"
    deadline = time.time() + 180
    while not (run / "checkpoints").is_dir() or not any((run / "checkpoints").iterdir()):
        assert time.time() < deadline, page.inner_text("#job-log")
        time.sleep(0.3)
    page.wait_for_function("document.querySelector('#job-log').textContent.length > 0")
    job = studio.api(f"/api/job?id={job_id}").json()["job"]
    tree = [(job["pid"], job["pid_start"]), *procs.descendants(job["pid"])]
    assert len(tree) >= 3  # the trainer and its two MCP servers at least
    page.click("#stop")
    page.wait_for_selector("#job-state .badge.stopped", timeout=90000)
    info = page.inner_text("#stop-info")
    assert "SIGINT" in info and "none left" in info and "no escalation needed" in info
    assert not any(procs.alive(p, s) for p, s in tree)  # its servers are gone too
    job = studio.api(f"/api/job?id={job_id}").json()["job"]
    assert job["returncode"] == 130 and job["stop"]["survivors"] == [] and job["stop"]["escalated"] == []

    page.goto(f"{studio.url}/#/run/launched")
    page.wait_for_selector("#run-status .badge.stopped")
    page.click("#resume")
    page.wait_for_selector("#job-state .badge.running")
    assert "--resume" in page.inner_text("#job")
    page.click("#stop")
    page.wait_for_selector("#job-state .badge.stopped", timeout=90000)


def test_tools_page_lists_schemas_and_calls_a_tool_from_its_form(page, studio):
    page.goto(f"{studio.url}/#/tools")
    page.select_option("#tool-file", label="examples/mcp_tools.json")
    page.click("#tool-load")
    page.wait_for_selector(".toolitem[data-tool='evaluate']", timeout=60000)
    assert "tool(s) from" in page.inner_text("#tool-status")
    page.click(".toolitem[data-tool='evaluate']")
    page.fill("#tool-form input[name='expression']", "6*7")
    page.click("#tool-call")
    page.wait_for_selector("#tool-output")
    assert page.inner_text("#tool-output").strip() == "42"
    assert page.inner_text("#tool-latency").endswith("ms")
    page.click(".toolitem[data-tool='divide']")
    page.fill("#tool-form input[name='a']", "1")
    page.fill("#tool-form input[name='b']", "0")
    page.click("#tool-call")
    page.wait_for_selector("#tool-output.error-box")
    page.click(".toolitem[data-tool='add']")
    page.fill("#tool-raw", '{"a": "x"}')  # wrong type: the runner's schema check answers
    page.click("#tool-call")
    page.wait_for_selector("#tool-result .badge.invalid_arguments")


def test_rewards_page_scores_a_run_trajectory_term_by_term_and_hands_the_section_to_new_run(page, studio, trained_run):
    page.goto(f"{studio.url}/#/rewards")
    page.select_option("#pick-run", "calc")
    page.wait_for_selector("#pick-step option[value='2']", state="attached")
    page.select_option("#pick-step", "2")
    page.check("input[data-term='tool_errors']")
    page.fill("input[data-weight='tool_errors']", "0.5")
    page.click("#score")
    page.wait_for_selector("#score-terms")
    terms = {r.get_attribute("data-term") for r in page.query_selector_all("#score-terms tr[data-term]")}
    assert terms == {"exact_match", "format", "tool_errors"}
    assert "tool_errors: 0.5" in page.inner_text("#reward-yaml")
    page.fill("#pasted", "{not json")
    page.click("#score")
    page.wait_for_selector("#score-result .error-box:has-text('trajectory')")
    page.fill("#pasted", "")
    page.click("#score")
    page.wait_for_selector("#use-reward")
    page.click("#use-reward")
    page.wait_for_function("document.querySelector('#yaml') && document.querySelector('#yaml').value.includes('tool_errors: 0.5')")


def test_data_page_previews_and_converts_to_search_r1_parquet(page, studio, tmp_path):
    csv = tmp_path / "qa.csv"
    csv.write_text('question,answer\nWhat is 2+2?,4\nCapital of Peru?,"[""Lima"", ""lima""]"\n')
    page.goto(f"{studio.url}/#/data")
    page.set_input_files("#data-upload", str(csv))
    page.wait_for_selector("#preview-panel h3:has-text('qa.csv')")
    assert "2 rows" in page.inner_text("#preview-panel")
    page.select_option("#q-col", "question")
    page.select_option("#a-col", "answer")
    page.fill("#out-name", "peru")
    page.click("#convert")
    page.wait_for_selector("#convert-ok")
    assert (studio.runs / "data" / "peru.parquet").is_file()
    assert page.query_selector("#converted-searchr1") is not None
    prompt = page.inner_text("#converted-layout tr[data-column='prompt']")
    assert "user:" in prompt and "What is 2+2?" in prompt
    assert '"4"' in page.inner_text("#converted-layout tr[data-column='golden_answers']")
    page.fill("#template", "no placeholder")
    page.click("#convert")
    page.wait_for_selector("#convert-out .error-box:has-text('{question}')")


def test_playground_streams_one_rollout_turn_by_turn(page, studio):
    page.goto(f"{studio.url}/#/playground")
    page.select_option("#pg-config", label="examples/mcp_tools.json")
    page.fill("#pg-question", "What is 6*7?")
    page.fill("#pg-answer", "42")
    page.click("summary:has-text('scripted turns')")
    page.fill("#pg-script", '<tool_call>\n{"name": "evaluate", "arguments": {"expression": "6*7"}}\n</tool_call>\n---\n<answer>42</answer>')
    page.click("#pg-run")
    page.wait_for_selector("#pg-live .seg.prompt", timeout=120000)
    page.wait_for_selector("#pg-done", timeout=120000)
    kinds = [e.get_attribute("data-kind") for e in page.query_selector_all("#pg-turns-log pre")]
    assert kinds == ["model", "call", "result", "model"]
    assert page.inner_text("#pg-turns-log pre[data-kind='result']").strip() == "42"
    assert "ok" in page.inner_text("#pg-state") and "reward 1.1" in page.inner_text("#pg-state")
    roles = [s.get_attribute("data-role") for s in page.query_selector_all("#pg-live .seg")]
    assert roles == ["prompt", "model", "observation", "model"]
