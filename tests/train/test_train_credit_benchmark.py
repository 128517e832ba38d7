"""benchmarks/credit.py (outcome-only GRPO against turn-level variants on the demo's search env)
runs its whole code path at a tiny size with --smoke: a warm start, two variants, every figure
printed and written. The full comparison is not run by the tests (about 1.5 CPU hours)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_credit_benchmark_smoke_runs_the_whole_path(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "credit.py"), "--smoke", "--out", str(tmp_path / "runs"),
                           "--variants", "grpo", "turn_grpo+hit", "--seeds", "0", "--eval-limit", "4", "--eval-every", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mean over seeds" in proc.stdout and "turn_grpo+hit" in proc.stdout
    report = json.loads(out.read_text())
    assert report["smoke"] and report["held_out_questions"] == 4
    for name in ("grpo", "turn_grpo+hit"):
        r = report["results"][name]["0"]
        assert r["steps"] == 1 and 0.0 <= r["exact_match"] <= 1.0 and r["searches_per_question"] >= 0.0
    metrics = (tmp_path / "runs" / "turn_grpo_hit" / "seed0" / "metrics.jsonl").read_text()
    assert '"adv/mean"' in metrics
    evals = (tmp_path / "runs" / "grpo" / "seed0" / "eval.jsonl").read_text().splitlines()
    assert len(evals) == 1  # every step: what steps_to_70 reads


def test_the_report_gives_each_variant_its_seeds_mean_spread_and_ratio_to_grpo(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import io

    from credit import print_report, steps_to

    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": a}) + "\n"
                                                 for s, a in [(10, 0.5), (20, 0.71), (30, 0.9)]))
    assert steps_to(tmp_path, 0.7) == 20 and steps_to(tmp_path, 0.95) is None
    run = lambda em, steps: {"exact_match": em, "exact_match_single": em, "exact_match_multi": em,  # noqa: E731
                             "searches_per_question": 1.0, "steps_to_70": steps}
    buf = io.StringIO()
    print_report({"grpo": {0: run(0.5, 40.0), 1: run(0.7, 60.0)}, "gigpo": {0: run(0.9, 20.0), 1: run(0.9, None)}}, buf)
    text = buf.getvalue()
    assert "0.600±0.100 x1.00" in text  # grpo: the mean of 0.5 and 0.7, half their spread
    assert "0.900±0.000 x1.50" in text  # gigpo's exact match is 1.5 x grpo's in the same run
    assert "20.000±0.000 x0.40 (1/2)" in text  # one seed of two reached 70%, at step 20 (grpo: 50)


def test_merge_joins_one_file_per_run_and_refuses_a_run_twice(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from credit import merge

    def write(name: str, variant: str, seed: int, em: float) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"results": {variant: {str(seed): {"exact_match": em}}}}))
        return str(path)

    a, b, c = write("a.json", "gigpo", 1, 0.5), write("b.json", "grpo", 0, 0.7), write("c.json", "gigpo", 0, 0.6)
    merged = merge([a, b, c])
    assert list(merged) == ["grpo", "gigpo"] and list(merged["gigpo"]) == [0, 1]  # VARIANTS' order, seeds sorted
    assert merged["gigpo"][1]["exact_match"] == 0.5
    with pytest.raises(SystemExit, match="gigpo seed 1 is in two files"):
        merge([a, write("d.json", "gigpo", 1, 0.9)])


def test_forms_group_questions_without_their_names(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import io

    from credit import print_forms, question_form

    assert question_form("When was Mavi Mobe born?") == question_form("When was Tete Vola born?") == "When was born?"
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"questions": [
        {"question": "When was Mavi Mobe born?", "accuracy": 0.0, "tool_calls": 1.0},
        {"question": "When was Tete Vola born?", "accuracy": 1.0, "tool_calls": 1.0},
        {"question": "Who does Kaso Dega work for?", "accuracy": 1.0, "tool_calls": 2.0}]}))
    out = io.StringIO()
    print_forms([str(report)], file=out)
    rows = {line[:40].strip(): line[40:].split() for line in out.getvalue().splitlines()[3:]}
    assert rows == {"When was born?": ["2", "1.00", "0.500"], "Who does work for?": ["1", "2.00", "1.000"]}
