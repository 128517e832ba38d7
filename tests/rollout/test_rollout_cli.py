"""`rlfactory rollout` on the shipped example config (tiny model, Python calculator tool)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_fakes import one_torch_thread

from rlfactory.cli.main import main
from rlfactory.trajectory import read_jsonl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout_calculator.yaml"
single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_rollout_command_writes_trajectories_and_a_summary(tmp_path, capsys, mode):
    out = tmp_path / "calc.jsonl"
    rc = main(["rollout", str(EXAMPLE), "--n", "2", "--limit", "2", "--out", str(out),
               f"rollout.mode={mode}", "rollout.max_new_tokens=12"])
    assert rc == 0
    trajs = read_jsonl(out)
    assert len(trajs) == 4 and [t.group for t in trajs] == ["calc-0", "calc-0", "calc-1", "calc-1"]
    for t in trajs:
        assert t.status in ("ok", "truncated", "malformed") and t.reward is None and t.turns >= 1
        assert t.info["answer"] in ("391", "25") and t.segments[0].role == "prompt"
        assert "calculate" in t.segments[0].text  # the tool is described in the prompt
        assert all(len(s.token_ids) <= 12 for s in t.segments if s.role == "model")
    text = capsys.readouterr().out
    for word in ("status:", "turns:", "tool calls:", "tool time:", "tokens/s", f"mode: {mode}"):
        assert word in text


def test_rollout_command_reports_config_errors(tmp_path, capsys):
    rc = main(["rollout", str(EXAMPLE), "--out", str(tmp_path / "x.jsonl"), "rollout.mode=sideways"])
    assert rc == 2 and "rollout.mode" in capsys.readouterr().err


def test_calculator_example_tool():
    import sys

    sys.path.insert(0, str(EXAMPLE.parent))
    from rollout_calculator_tools import calculate

    assert calculate("(120 - 45) / 3") == "25" and calculate("2 ** 10 + 1") == "1025"
    with pytest.raises(ValueError):
        calculate("__import__('os')")
