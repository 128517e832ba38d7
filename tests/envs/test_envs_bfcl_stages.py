"""benchmarks/bfcl_stages.py: BFCL accuracy per category and stage of the BFCL experiment, from its
eval_*.json files, and the issue's two figures (single-turn pooled, irrelevance) with PASS/FAIL."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bfcl_stages import category, report  # noqa: E402


def write(folder: Path, name: str, right: dict[str, int], per: int = 4) -> None:
    """An eval report with `per` entries in each category, the first right[category] of them correct."""
    qs = [{"id": f"{cat}_{i}", "accuracy": float(i < n), "tool_calls": 1.0, "statuses": ["ok" if i else "truncated"]}
          for cat, n in right.items() for i in range(per)]
    (folder / name).write_text(json.dumps({"averages": {}, "questions": qs}))


def test_category_strips_the_entry_number_only():
    assert category("simple_python_12") == "simple_python"
    assert category("parallel_multiple_0") == "parallel_multiple"
    assert category("irrelevance_7") == "irrelevance"


def test_pooled_figures_and_verdicts(tmp_path):
    cats = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
    write(tmp_path, "eval_base.json", dict.fromkeys(cats, 0))
    write(tmp_path, "eval_warm_start.json", {**dict.fromkeys(cats[:4], 1), "irrelevance": 4})
    write(tmp_path, "eval_after_GRPO.json", {"simple_python": 2, "multiple": 2, "parallel": 1, "parallel_multiple": 1,
                                             "irrelevance": 3})
    buf = io.StringIO()
    figures = report(tmp_path, buf)
    text = buf.getvalue()
    assert figures["warm start"] == {"single_turn": 4 / 16, "irrelevance": 1.0}
    assert figures["after GRPO"] == {"single_turn": 6 / 16, "irrelevance": 0.75}
    assert "PASS  GRPO over the warm start, single-turn: +12.5 points" in text
    assert "FAIL  irrelevance after GRPO vs the warm start: -25.0 points" in text
    assert "simple_python              4     0.500        1.00          1" in text  # after GRPO's row


def test_a_missing_stage_is_named_not_an_error(tmp_path):
    write(tmp_path, "eval_base.json", {"simple_python": 0})
    buf = io.StringIO()
    figures = report(tmp_path, buf)
    assert list(figures) == ["base"] and "eval_warm_start.json missing" in buf.getvalue()
    assert "PASS" not in buf.getvalue() and "FAIL" not in buf.getvalue()
