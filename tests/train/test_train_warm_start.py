"""After SFT: the warm start measured against its demonstrator; demonstrations checked against the
tools; the time estimate from a moving average."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlfactory.cli.main import main
from rlfactory.tools.base import ToolCall
from rlfactory.trajectory import ToolCallRecord, Trajectory
from rlfactory.train.sft_progress import SftReporter, StepClock
from rlfactory.train.warm_start import compare

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _traj(calls: list[tuple[str, dict, str]], status: str = "ok") -> Trajectory:
    return Trajectory(id="t", group="g", status=status,
                      tool_calls=[ToolCallRecord(n, a, s, 0.0, error=None if s == "ok" else f"{n} failed: no such city")
                                  for n, a, s in calls])


def test_rates_against_the_demonstrator_by_hand():
    trajs = [
        _traj([("lookup", {"city": "Oslo"}, "ok")]),                        # name and arguments right
        _traj([("lookup", {"city": "Olso"}, "error")]),                     # right tool, wrong argument
        _traj([("search", {"q": "Lima"}, "ok")], status="truncated"),       # wrong tool, no answer
        _traj([]),                                                          # the solver cannot do this row
    ]
    demonstrated = [[ToolCall("lookup", {"city": "Oslo"})], [ToolCall("lookup", {"city": "Lima"})],
                    [ToolCall("lookup", {"city": "Lima"})], None]
    check = compare(trajs, demonstrated)
    assert check.rows == 4 and check.format_rate == 0.75
    assert check.demo_calls == 3 and check.matched_calls == pytest.approx(1 / 3)
    assert check.matched_names == pytest.approx(2 / 3)
    assert check.model_calls == 3 and check.call_success == pytest.approx(2 / 3)
    assert check.top_error == "lookup failed: no such city"
    # right tools, wrong arguments: the advice is about copying
    assert len(check.advice) == 1 and "copies their arguments only 33%" in check.advice[0]
    assert "sft.full_text_steps" in check.advice[0]
    assert check.summary() == ("format 75%; demonstrator's calls matched 33% by name and arguments (67% by name; "
                               "3 calls); its own tool calls succeeded 67% (3 calls)")


def test_low_format_wrong_tools_and_failing_calls_each_get_advice():
    trajs = [_traj([("search", {"q": "x"}, "error")], status="truncated"), _traj([], status="malformed")]
    check = compare(trajs, [[ToolCall("lookup", {"city": "Oslo"})], [ToolCall("lookup", {"city": "Lima"})]])
    assert check.format_rate == 0.0 and check.matched_names == 0.0 and check.call_success == 0.0
    text = " | ".join(check.advice)
    assert "only 0% of the answers parse" in text and "calls the demonstrator's tools only 0%" in text
    assert "most common error: 'search failed: no such city'" in text
    assert compare([_traj([("lookup", {"city": "Oslo"}, "ok")])], [[ToolCall("lookup", {"city": "Oslo"})]]).advice == []


def test_the_estimate_follows_the_step_times_as_they_change():
    now = [0.0]
    clock = StepClock(10, alpha=0.5, clock=lambda: now[0])
    for step, took in enumerate([5.0, 1.0, 1.0], start=1):  # step 1 pays start-up costs: left out
        now[0] += took
        left = clock.tick(step)
    assert left == pytest.approx(7 * 1.0)
    for step in (4, 5, 6):  # the machine gets loaded: 9 s a step
        now[0] += 9.0
        left = clock.tick(step)
    assert clock.per_step == pytest.approx(1 + 8 * (1 - 0.5 ** 3))  # 8.0: moving towards 9
    assert left == pytest.approx(clock.per_step * 4)


def test_the_reporter_prints_the_time_left_with_each_line():
    now = [0.0]
    out = io.StringIO()
    report = SftReporter(4, out, every=2, clock=lambda: now[0], bar=False)
    for step in range(1, 5):
        now[0] += 2.0
        report.step({"step": step, "loss": 1.0 / step, "token_acc": 0.5, "tokens_per_s": 100.0})
    report.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sft: 2.00 s/step (100 tokens/s measured on step 2): about 8 s for 4 steps")
    assert lines[1] == "sft step 2/4: loss 0.5000 token acc 0.500, 4 s left"
    assert lines[2] == "sft step 4/4: loss 0.2500 token acc 0.500, 0 s left"


def test_sft_measures_the_warm_start_on_held_out_rows(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", str(EXAMPLES / "custom_env" / "capitals.yaml"), "sft.steps=3", "sft.demos=4",
                 "sft.batch_size=2", f"sft.out={out}", "rollout.max_new_tokens=12"]) == 0
    err = capsys.readouterr().err
    assert "sft: warm start on 2 held-out rows (greedy): format " in err
    saved = json.loads((out / "warm_start.json").read_text())
    assert saved["rows"] == 2 and saved["demo_calls"] == 2  # the solver calls lookup_capital once per row
    assert 0.0 <= saved["matched_calls"] <= saved["matched_names"] <= 1.0
    assert saved["advice"] and all(f"sft: advice: {a}" in err for a in saved["advice"])  # 3 steps teach nothing


BAD_SOLVER = '''
from rlfactory.envs import Env, EnvTools
from rlfactory.rewards import RuleReward


async def lookup(query: str) -> str:
    """Look a word up.

    Args:
        query: The word.
    """
    return "found " + query


class SolverEnv(Env):
    def load_split(self, split):
        return [{"id": "r0", "question": "What is a?", "answer": "a"}]

    def reset(self, row):
        return [{"role": "user", "content": row["question"]}]

    def tools(self):
        return EnvTools(python=[lookup])

    def reward(self):
        return RuleReward({"exact_match": 1.0})

    def solve(self, row):
        call = {"type": "function", "function": {"name": "TOOL", "arguments": ARGS}}
        return [*self.reset(row), {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "found a"}, {"role": "assistant", "content": "<answer>a</answer>"}]
'''


@pytest.mark.parametrize("tool, args, expected", [
    ("lookpu", '{"query": "a"}', "calls tool 'lookpu', which the run's tools do not include; did you mean 'lookup'? "
                                 "(tools: lookup)"),
    ("lookup", '{"q": "a"}', "calls 'lookup' with arguments its schema refuses: "),
])
def test_demonstrations_that_call_what_the_tools_cannot_take_stop_sft(tmp_path, capsys, monkeypatch, tool, args,
                                                                       expected):
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = f"bad_solver_{tool}_{len(args)}"
    (tmp_path / f"{module}.py").write_text(BAD_SOLVER.replace("TOOL", tool).replace("ARGS", args))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        model: {{path: tiny:1m, family: qwen3}}
        env: {{name: "{module}:SolverEnv"}}
        sft: {{steps: 1, demos: 2, out: {tmp_path / 'sft'}}}
        """))
    try:
        assert main(["sft", str(cfg)]) == 2
    finally:
        sys.modules.pop(module, None)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "Loading weights" not in line]
    assert len(err) == 1, err  # (transformers' own loading bar aside)
    assert err[0].startswith(f"rlfactory: config error: env '{module}:SolverEnv': solve() of train row 0 (id 'r0') "
                             + expected)
    assert not (tmp_path / "sft" / "model").exists()


def test_sft_on_the_search_env_trains_on_counterfactual_visits_and_says_so(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", str(EXAMPLES / "demo.yaml"), "sft.steps=3", "sft.demos=16", "sft.batch_size=8",
                 "sft.full_text_steps=1", f"sft.out={out}", "sft.check_rows=0", "env.options.n_train_entities=40",
                 "env.options.n_test_entities=5", "env.options.counterfactual_rate=1.0",
                 "env.options.learn_guesses=false"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "trained on the env's variant" in x)
    visits = int(line.split(" of ")[1].split()[0])
    assert visits == 3 * 8 and 0 < int(line.split()[1]) < visits  # searched demos vary; guesses stay as written
    assert (out / "model").is_dir()
