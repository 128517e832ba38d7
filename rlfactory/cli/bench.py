"""`rlfactory bench bfcl --model M [--family F] [--categories ...] [--prompt-style tools|bfcl]
[--limit N] [--out FILE.jsonl] [KEY=VALUE ...]`: the Berkeley Function Calling Leaderboard,
single- and multi-turn."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path

from rlfactory.cli.common import allow_overrides_after_options


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmarks other people wrote, scored their way (bfcl)",
                              description="Run a public benchmark on a model with its own data and scorer.")
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    b = sub.add_parser(
        "bfcl", help="BFCL's single- and multi-turn categories, scored by the bfcl-eval package's own checkers",
        description="Roll out BFCL's entries greedily (one per entry), score each with bfcl-eval's AST and "
        "relevance checkers (single-turn) or its state and response checkers on its executable backends "
        "(multi-turn), print accuracy per category and BFCL's summary, and write every entry (the model's "
        "calls, output and BFCL's verdict) as JSON lines.")
    b.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted config overrides, e.g. rollout.max_new_tokens=256 generator.backend=server")
    b.add_argument("--model", required=True, help="a Hugging Face folder, a checkpoint's model/, a .gguf, "
                   "smollm2:135m, or tiny:1m")
    b.add_argument("--family", help="the model's tool-call family (qwen3, llama3, template, ...; default: "
                   "what model.family resolves to for the model)")
    b.add_argument("--categories", default="all", help="comma-separated BFCL categories (simple, multiple, "
                   "parallel, parallel_multiple, irrelevance, their live_ versions, live_relevance, java, "
                   "javascript, multi_turn_base, multi_turn_miss_func, multi_turn_miss_param, "
                   "multi_turn_long_context) or groups (all = the ten of the leaderboard's AST + irrelevance "
                   "columns, live, non_live, single_turn, multi_turn); default all")
    b.add_argument("--prompt-style", choices=("tools", "bfcl"), default="tools",
                   help="tools: the model's chat template with the functions as tools; bfcl: BFCL's own "
                   "system prompt, calls written as [f(a=1)], for models without tool support")
    b.add_argument("--limit", type=int, help="only the first N entries of each category")
    b.add_argument("--out", help="write one JSON line per entry here (and the summary to FILE.summary.json)")
    b.set_defaults(func=run_bfcl_command)
    allow_overrides_after_options(b)


def run_bfcl_command(args: argparse.Namespace) -> int:
    from rlfactory.envs.bfcl.data import resolve_categories
    from rlfactory.train.bfcl_bench import bfcl_config, run_bfcl

    try:
        categories = resolve_categories(args.categories, multi_turn=True)
    except (ValueError, ImportError) as e:
        print(f"rlfactory bench bfcl: {e}", file=sys.stderr)
        return 2
    if args.prompt_style != "tools" and any(c.startswith("multi_turn") for c in categories):
        print("rlfactory bench bfcl: the multi-turn categories run with --prompt-style tools only", file=sys.stderr)
        return 2
    cfg = bfcl_config(args.model, args.family, args.prompt_style, args.overrides)
    report = asyncio.run(run_bfcl(cfg, categories, limit=args.limit))
    print(f"BFCL ({report.prompt_style} prompts, family {report.family}) for {report.model}:")
    for name, c in report.categories.items():
        print(f"  {name:24s} {c['accuracy'] * 100:6.2f}%  ({int(c['correct'])}/{int(c['total'])})")
    for name, value in report.summary.items():
        print(f"  summary {name:16s} {value * 100:6.2f}%")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for entry in report.entries:
                f.write(json.dumps(asdict(entry), ensure_ascii=False, default=str) + "\n")
        summary = out.with_suffix(".summary.json")
        summary.write_text(json.dumps(report.header(), indent=1), encoding="utf-8")
        print(f"entries written to {out}, summary to {summary}", file=sys.stderr)
    return 0
