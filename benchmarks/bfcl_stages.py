"""BFCL accuracy per reported category for each stage of `rlfactory experiment examples/smollm2_bfcl.yaml`
(issue 30), from the experiment folder's eval_base.json, eval_warm_start.json and eval_after_GRPO.json
(each question's `accuracy` is BFCL's own verdict, scored by the env with bfcl-eval's checker).

    .venv/bin/python benchmarks/bfcl_stages.py runs/smollm2_bfcl

Prints, per stage and category: entries, accuracy, tool calls per entry and answers that ran to the
token limit; then the issue's two figures: the single-turn categories combined (simple, multiple,
parallel, parallel_multiple: all their entries pooled) and irrelevance, with GRPO's change over the
warm start against the targets (at least +10 points; irrelevance down at most 5 points).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

STAGES = {"base": "eval_base.json", "warm start": "eval_warm_start.json", "after GRPO": "eval_after_GRPO.json"}
SINGLE_TURN = ("simple", "multiple", "parallel", "parallel_multiple")
GAIN_TARGET = 0.10
IRRELEVANCE_DROP = 0.05


def category(entry_id: str) -> str:
    """BFCL's category of an entry id: `simple_python_12` -> `simple_python`."""
    return re.sub(r"_\d+$", "", entry_id)


def single_turn(cat: str) -> bool:
    """One of the four single-turn AST categories the target pools (simple's language variants included)."""
    return cat in SINGLE_TURN or cat.startswith("simple_")


def per_category(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for q in report["questions"]:
        c = out.setdefault(category(q["id"]), {"entries": 0, "correct": 0.0, "tool_calls": 0.0, "truncated": 0})
        c["entries"] += 1
        c["correct"] += float(q["accuracy"] or 0.0)
        c["tool_calls"] += float(q["tool_calls"])
        c["truncated"] += int("truncated" in (q.get("statuses") or []))
    return out


def pooled(cats: dict[str, dict[str, float]], keep) -> float | None:
    n = sum(c["entries"] for k, c in cats.items() if keep(k))
    return sum(c["correct"] for k, c in cats.items() if keep(k)) / n if n else None


def report(folder: Path, file=None) -> dict[str, dict[str, float | None]]:
    file = file or sys.stdout
    figures: dict[str, dict[str, float | None]] = {}
    for stage, name in STAGES.items():
        path = folder / name
        if not path.is_file():
            print(f"{stage}: {path} missing (the stage did not run)", file=file)
            continue
        cats = per_category(json.loads(path.read_text(encoding="utf-8")))
        print(f"\n{stage} ({name})\n{'category':20s}{'entries':>8s}{'accuracy':>10s}{'tool calls':>12s}{'truncated':>11s}", file=file)
        for k, c in cats.items():
            n = c["entries"]
            print(f"{k:20s}{n:8d}{c['correct'] / n:10.3f}{c['tool_calls'] / n:12.2f}{c['truncated']:11d}", file=file)
        figures[stage] = {"single_turn": pooled(cats, single_turn), "irrelevance": pooled(cats, lambda k: k == "irrelevance")}
    print("\nthe issue's figures (single-turn = simple, multiple, parallel, parallel_multiple pooled)", file=file)
    for stage, f in figures.items():
        cells = ", ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in f.items())
        print(f"  {stage:12s} {cells}", file=file)
    warm, after = figures.get("warm start"), figures.get("after GRPO")
    if warm and after and None not in (warm["single_turn"], after["single_turn"]):
        gain = after["single_turn"] - warm["single_turn"]
        print(f"{'PASS' if gain >= GAIN_TARGET else 'FAIL'}  GRPO over the warm start, single-turn: {gain * 100:+.1f} points "
              f"(target >= +{GAIN_TARGET * 100:.0f})", file=file)
    if warm and after and None not in (warm["irrelevance"], after["irrelevance"]):
        drop = warm["irrelevance"] - after["irrelevance"]
        print(f"{'PASS' if drop <= IRRELEVANCE_DROP else 'FAIL'}  irrelevance after GRPO vs the warm start: {-drop * 100:+.1f} points "
              f"(target: down at most {IRRELEVANCE_DROP * 100:.0f})", file=file)
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the experiment's --out folder (default config: runs/smollm2_bfcl)")
    args = ap.parse_args(argv)
    report(Path(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
