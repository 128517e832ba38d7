"""`examples/smollm2_bfcl.yaml` starts and runs: `rlfactory experiment` (base eval -> SFT warm start on
the live_ training split's possible answers -> GRPO -> eval on the non-live entries) on tiny budgets,
with rlfactory's tiny model standing in for SmolLM2 (tests/rollout/test_rollout_smollm2.py loads the
real one). The full 90-minute run is the yaml header's command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")

from rlfactory.cli.main import main  # noqa: E402
from rlfactory.config import RunConfig, load_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
YAML = Path(__file__).resolve().parents[2] / "examples" / "smollm2_bfcl.yaml"


def test_the_yaml_is_the_issues_experiment():
    cfg = load_config(RunConfig, YAML, [])
    assert cfg.model.path == "smollm2:135m" and cfg.env.name == "bfcl"
    assert all(c.startswith("live_") for c in cfg.env.options["train_categories"])
    assert not any(c.startswith("live_") for c in cfg.env.options["test_categories"])
    header = YAML.read_text().split("\nmodel:")[0]
    assert ".venv/bin/rlfactory experiment examples/smollm2_bfcl.yaml" in header
    assert f"grpo/checkpoints/step_{cfg.trainer.steps:06d}/model" in header  # the checkpoint the run writes


def test_the_experiment_starts_and_runs_a_step_on_tiny_budgets(tmp_path, capsys):
    out = tmp_path / "exp"
    rc = main(["experiment", str(YAML), "model.path=tiny:1m", "model.family=qwen3", "sft.demos=4", "sft.steps=1",
               "sft.batch_size=2", "trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2",
               "trainer.progress=false", "rollout.max_new_tokens=8", "env.options.test_limit=1", "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "warm start" in captured.out and "after GRPO" in captured.out
    assert "bfcl split:" in captured.err and "train_max_chars=3000" in captured.err
    result = json.loads((out / "results.json").read_text())
    assert result["grpo_steps"] == 1 and result["stages"]["base"]["questions"] == 5  # one per reported category
    assert Path(result["trained_model"]).is_dir()

    # GRPO again from the same warm start, its evaluations reused (--from-experiment)
    again = tmp_path / "again"
    args = ["experiment", str(YAML), "model.path=tiny:1m", "model.family=qwen3", "sft.demos=4", "sft.steps=1",
            "sft.batch_size=2", "trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2",
            "trainer.progress=false", "rollout.max_new_tokens=8", "env.options.test_limit=1", "trainer.lr=1e-3"]
    assert main(args + ["--out", str(again), "--from-experiment", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"reused from {out.resolve()}" in captured.err and "the warm start of" in captured.out
    second = json.loads((again / "results.json").read_text())
    assert second["warm_start_model"] == str(out.resolve() / "sft" / "model") and not (again / "sft").exists()
    assert second["stages"]["base"] == result["stages"]["base"]
    assert second["stages"]["warm start"] == result["stages"]["warm start"]
    assert (again / "eval_warm_start.json").read_text() == (out / "eval_warm_start.json").read_text()
    assert second["reused_from"] == str(out.resolve()) and Path(second["trained_model"]).is_dir()
    assert "sft" not in second["times_s"] and "eval base" not in second["times_s"]
    assert second["sft_steps"] is None  # this run trained no SFT: its config's sft.steps would say otherwise
    # a folder that is not a finished experiment, or one the run would replace: one line, nothing run
    assert main(args + ["--out", str(tmp_path / "x"), "--from-experiment", str(tmp_path / "nothing")]) == 2
    assert "is not a finished experiment folder" in capsys.readouterr().err
    assert main(args + ["--out", str(out), "--from-experiment", str(out)]) == 2
    assert "would replace the folder it reuses" in capsys.readouterr().err
    assert (out / "results.json").exists()
