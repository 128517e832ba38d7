"""`rlfactory demo --env visual` (issue 31) at smoke size: the demo's own code path (its config,
both runs: warm start, held-out eval, GRPO, eval; the control's zoom shows no picture), through
the real command, with the real tiny vision-language model, in minutes of CPU."""

from __future__ import annotations

import json
import pytest

from rlfactory.cli.main import main
from rlfactory.cli.visual_demo import DEFAULT_CONFIG, RunResult, Stage, parse_runs, print_table, run_config

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = ["env.options.n_train=16", "env.options.n_test=3", "sft.demos=8", "sft.steps=2", "sft.batch_size=4",
         "trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2"]


def test_the_visual_demo_runs_both_runs_end_to_end_at_smoke_size(tmp_path, capsys):
    out = tmp_path / "vd"
    assert main(["demo", "--env", "visual", "--out", str(out), *SMOKE]) == 0
    printed = capsys.readouterr().out
    assert "held-out pictures" in printed and "vs the control after GRPO" in printed
    results = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in results] == ["pixels", "control"]
    for r in results:
        assert r["grpo_steps"] == 1 and r["warm_start"]["questions"] == 3 and r["after_grpo"]["questions"] == 3
        assert (out / r["name"] / "sft" / "model" / "config.json").is_file()
        assert set(r["times_s"]) == {"warm start (sft)", "eval before", "grpo", "eval after"}
    for name in ("pixels", "control"):
        assert len(json.loads((out / name / "eval_before.json").read_text())["questions"]) == 3
    # a second run replaces the folder; a folder that is not a demo's is refused
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    assert main(["demo", "--env", "visual", "--out", str(other), *SMOKE]) == 2
    assert (other / "keep.txt").is_file()


def test_the_control_run_differs_only_in_its_zoom_showing_no_picture(tmp_path):
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(str(DEFAULT_CONFIG), [])
    pixels, control = run_config(cfg, "pixels", tmp_path), run_config(cfg, "control", tmp_path)
    assert pixels.env.options.get("tool_images", True) is True and control.env.options["tool_images"] is False
    assert {k: v for k, v in control.env.options.items() if k != "tool_images"} == \
        {k: v for k, v in pixels.env.options.items() if k != "tool_images"}
    assert (pixels.sft.out, control.trainer.run_dir) == (str(tmp_path / "pixels" / "sft"), str(tmp_path / "control" / "grpo"))
    assert cfg.env.options.get("tool_images", True) is True  # the loaded config is left as it was


def test_runs_are_checked_before_anything_is_removed(tmp_path, capsys):
    out = tmp_path / "vd"
    out.mkdir()
    (out / ".rlfactory-demo").write_text("")
    (out / "old.txt").write_text("x")
    assert main(["demo", "--env", "visual", "--out", str(out), "--runs", "pixels,blind"]) == 2
    assert "--runs takes pixels and/or control (comma-separated), got 'pixels,blind'" in capsys.readouterr().err
    assert (out / "old.txt").is_file()
    assert parse_runs("control") == ["control"] and parse_runs(" pixels , control") == ["pixels", "control"]
    for bad in ("", "pixels,pixels", "all"):
        with pytest.raises(ValueError):
            parse_runs(bad)


def test_the_table_prints_each_stage_and_the_two_gaps(capsys):
    def stage(acc, zoom):
        return Stage(accuracy=acc, zoom_rate=zoom, accuracy_when_zoomed=acc, questions=100)

    print_table([RunResult("pixels", stage(0.12, 0.1), stage(0.8, 1.0), 30),
                 RunResult("control", stage(0.1, 0.1), stage(0.11, 0.9), 30)])
    printed = capsys.readouterr().out
    assert "pixels: warm" in printed and "control: GRPO" in printed
    assert "after GRPO vs warm start: +68.0 points; vs the control after GRPO: +69.0 points" in printed


def test_the_demo_config_is_the_documented_one():
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(str(DEFAULT_CONFIG), [])
    o = cfg.env.options
    assert cfg.model.path == "tiny-vl:1m-compact" and cfg.env.name == "visual"
    assert (o["size"], o["view"], o["ink"], o["episode_picture"], o["solver_zoom"]) == (32, 16, "code", True, 16)
    assert (o["place_step"], o["colours"]) == (16, 100)  # one place, 100 colours: 1000 distinct pictures
    assert 0 < o["guess_rate"] < 1 and o.get("tool_images", True) is True
