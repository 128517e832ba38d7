"""GRPO's learning signal per step, and the warning when most groups carry none."""

from __future__ import annotations

import json
from pathlib import Path

from rlfactory.cli.main import main
from rlfactory.trajectory import ToolCallRecord, Trajectory
from rlfactory.train.signal import SignalWatch, StepSignal, step_signal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _t(group: str, reward: float | None, calls: tuple[tuple[str, str | None], ...] = ()) -> Trajectory:
    return Trajectory(id=f"{group}-{reward}", group=group, reward=reward,
                      status="infra_error" if reward is None else "ok",
                      tool_calls=[ToolCallRecord("lookup", {}, status, 0.0, error=error) for status, error in calls])


def test_flat_groups_tool_success_and_the_most_common_error_by_hand():
    trajs = [
        _t("a", 0.0, (("ok", None),)), _t("a", 0.0, (("error", "no such city: 'Olso'\nat line 3"),)),
        _t("b", 1.0), _t("b", 0.0, (("error", "no such city: 'Olso'"),)),
        _t("c", 0.0), _t("c", 0.0), _t("c", None, (("crashed", "server died"),)),  # infra_error: unscored
        _t("d", 1.0),  # one scored sample: no group to compare within
    ]
    s = step_signal(trajs)
    assert (s.groups, s.flat_groups, s.flat_reward) == (3, 2, 0.0)
    assert (s.tool_calls, s.tool_ok) == (4, 1)
    assert s.top_error == "no such city: 'Olso'"
    assert s.metrics() == {"signal/zero_variance_frac": 2 / 3, "tools/success_rate": 0.25}


def test_the_warning_comes_after_patience_steps_and_then_every_few_steps():
    flat = StepSignal(groups=4, flat_groups=3, flat_reward=0.0, tool_calls=10, tool_ok=2, top_error="unknown tool 'x'")
    live = StepSignal(groups=4, flat_groups=1, flat_reward=0.0, tool_calls=10, tool_ok=9, top_error=None)
    watch = SignalWatch(threshold=0.5, patience=3, every=10)
    said = {step: watch.observe(step, s) for step, s in enumerate([flat, flat, live, flat, flat, flat], start=1)}
    assert [k for k, v in said.items() if v] == [6]  # the signal on step 3 restarts the count
    assert said[6] == ("train: step 6: 75% of groups got one reward for every sample, most of them all 0 (no learning "
                       "signal), 3 steps in a row; tool calls succeeded 20% of 10 (most common error: "
                       "\"unknown tool 'x'\"); what usually helps: a denser or shaped reward (partial credit, a small "
                       "format term), more warm start (sft.steps, sft.full_text_steps), larger groups "
                       "(algo.group_size), a higher temperature (sampling.temperature)")
    again = [step for step in range(7, 30) if watch.observe(step, flat)]
    assert again == [16, 26]


def test_a_run_without_signal_says_so_and_logs_it(tmp_path, capsys):
    run = tmp_path / "run"
    # an untrained tiny model never gets an exact match: every group scores all 0
    assert main(["train", str(EXAMPLES / "custom_env" / "capitals.yaml"), "reward.terms.exact_match=1.0",
                 "trainer.steps=3", "trainer.prompts_per_step=2", "algo.group_size=2", "rollout.max_new_tokens=8",
                 "trainer.progress=false", "trainer.save_every=0", f"trainer.run_dir={run}"]) == 0
    err = capsys.readouterr().err
    assert "train: step 3: 100% of groups got one reward for every sample, most of them all 0 (no learning signal), " \
           "3 steps in a row" in err
    assert "what usually helps: a denser or shaped reward" in err
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["signal/zero_variance_frac"] for m in steps] == [1.0, 1.0, 1.0]
    assert all(0.0 <= m["tools/success_rate"] <= 1.0 for m in steps)
