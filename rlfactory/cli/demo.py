"""`rlfactory demo`: the main job. On CPU, in minutes: make the tiny model (cached), warm-start it
on the search env's solver demonstrations, train it with GRPO on single- and multi-hop questions,
and evaluate before and after on held-out entities. Prints a before/after table and saves the
reward curve as a PNG."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfactory.cli.common import allow_overrides_after_options

if TYPE_CHECKING:
    from rlfactory.config import RunConfig

MARKER = ".rlfactory-demo"
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the embedded demo: warm start + GRPO on the search env, before/after evaluation",
        description="Warm-starts rlfactory's tiny model on search demonstrations, trains it with GRPO on the "
        "search env (an MCP search tool over a BM25 retriever server), and evaluates it before and after on "
        "questions about entities never seen in training.",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. trainer.steps=20")
    p.add_argument("--env", choices=("search", "visual"), default="search",
                   help="search (default): the tiny model learns to search; visual: a tiny vision-language model "
                   "learns to zoom and read a digit (examples/visual_demo.yaml), with a control run whose zoom "
                   "returns no picture")
    p.add_argument("--runs", default="pixels,control",
                   help="--env visual: which runs, comma-separated: pixels and/or control (default: both)")
    p.add_argument("--config", default=None, help=f"run config (default: {DEFAULT_CONFIG}, or "
                   "examples/visual_demo.yaml with --env visual)")
    p.add_argument("--out", default=None, help="run folder (default: runs/demo, or runs/visual_demo with --env "
                   "visual); replaced on each run")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N test questions only")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def chain_queries(env: Any, rows: list[dict[str, Any]]) -> dict[Any, list[str]]:
    """The searches the env's own solver makes for each row: the entities on the reasoning chain."""
    from rlfactory.rewards.text import normalize_answer

    out = {}
    for row in rows:
        queries = [c["function"]["arguments"]["query"] for m in env.solve(row) for c in m.get("tool_calls") or []]
        out[row.get("id")] = [normalize_answer(q) for q in queries]
    return out


def search_stats(report: dict[str, Any], rows: list[dict[str, Any]], chains: dict[Any, list[str]]) -> dict[str, float]:
    """Exact match overall / single-hop / multi-hop, searches per question, and correct searches
    (a query naming an entity of the question's chain, each entity counted once) per multi-hop question."""
    from rlfactory.rewards.text import normalize_answer

    by_hops: dict[str, list[float]] = {"all": [], "single": [], "multi": []}
    searches, correct_multi = [], []
    for row, q in zip(rows, report["questions"]):
        kind = "multi" if int((row.get("extra_info") or {}).get("hops", 1)) > 1 else "single"
        acc = q["accuracy"] or 0.0
        by_hops["all"].append(acc)
        by_hops[kind].append(acc)
        searches.append(q["tool_calls"])
        if kind == "multi":
            wanted = list(chains.get(row.get("id"), []))
            hits = 0
            for call in q["calls"][0]:
                query = normalize_answer(str((call.get("arguments") or {}).get("query", "")))
                if query in wanted:
                    wanted.remove(query)
                    hits += 1
            correct_multi.append(hits)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {
        "exact_match": mean(by_hops["all"]), "exact_match_single": mean(by_hops["single"]),
        "exact_match_multi": mean(by_hops["multi"]), "searches_per_question": mean(searches),
        "correct_searches_per_multi_hop": mean(correct_multi),
    }


def print_table(before: dict[str, float], after: dict[str, float], file=None) -> None:
    file = file or sys.stdout
    rows = [
        ("exact match, all held-out", "exact_match", True),
        ("exact match, single-hop", "exact_match_single", True),
        ("exact match, multi-hop", "exact_match_multi", True),
        ("searches per question", "searches_per_question", False),
        ("correct searches per multi-hop q.", "correct_searches_per_multi_hop", False),
    ]
    print(f"\n{'held-out entities':36s}{'warm start':>12s}{'after GRPO':>12s}{'change':>10s}", file=file)
    for label, key, pct in rows:
        b, a = before[key], after[key]
        if pct:
            print(f"{label:36s}{b * 100:11.1f}%{a * 100:11.1f}%{(a - b) * 100:+9.1f}pt", file=file)
        else:
            print(f"{label:36s}{b:12.2f}{a:12.2f}{a - b:+10.2f}", file=file)


def save_reward_curve(metrics_path: Path, png: Path, before: float, after: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlfactory.train.runlog import read_metrics

    rows = [r for r in read_metrics(metrics_path) if "reward/mean" in r]
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["reward/mean"] for r in rows], label="train reward (mean)")
    ax.plot(steps, [r["accuracy"] for r in rows], label="train exact match", alpha=0.7)
    ax.axhline(before, color="gray", linestyle="--", label=f"held-out EM, warm start ({before:.2f})")
    ax.axhline(after, color="green", linestyle="--", label=f"held-out EM, after GRPO ({after:.2f})")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1.02)
    ax.set_title("rlfactory demo: search env, tiny model on CPU")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


async def run_demo(cfg: RunConfig, out: Path, eval_limit: int | None) -> dict[str, Any]:
    from rlfactory.cli.eval import evaluate_model
    from rlfactory.cli.common import train_from
    from rlfactory.cli.sft import run_sft
    from rlfactory.envs.registry import env_from_config
    from rlfactory.generation.heap import give_back_freed_memory
    from rlfactory.tiny import resolve_model

    times: dict[str, float] = {}
    t = time.perf_counter()
    base = resolve_model(cfg.model.path)
    times["tiny model"] = time.perf_counter() - t
    print(f"[demo] model: {cfg.model.path} -> {base}", file=sys.stderr)

    t = time.perf_counter()
    cfg.sft.out = str(out / "sft")
    await run_sft(cfg)
    give_back_freed_memory()  # the phase's freed temporaries, before the next (generation/heap.py)
    warm = str(out / "sft" / "model")
    times["warm start (sft)"] = time.perf_counter() - t

    with env_from_config(cfg.env, family=cfg.model.family) as env:
        rows = list(env.load_split("test"))[:eval_limit]
        multi = [r for r in rows if int((r.get("extra_info") or {}).get("hops", 1)) > 1]
        chains = chain_queries(env, multi)

    t = time.perf_counter()
    before = search_stats(await evaluate_model(cfg.model_copy(deep=True), warm, "test", limit=eval_limit), rows, chains)
    times["eval before"] = time.perf_counter() - t
    print(f"[demo] warm start: held-out exact match {before['exact_match']:.3f}", file=sys.stderr)

    t = time.perf_counter()
    history, trained = await train_from(cfg, warm, out / "grpo")
    give_back_freed_memory()
    times["grpo"] = time.perf_counter() - t

    t = time.perf_counter()
    after = search_stats(await evaluate_model(cfg.model_copy(deep=True), trained, "test", limit=eval_limit), rows, chains)
    times["eval after"] = time.perf_counter() - t

    save_reward_curve(out / "grpo" / "metrics.jsonl", out / "reward_curve.png", before["exact_match"], after["exact_match"])
    result = {"before": before, "after": after, "times_s": times, "steps": len(history),
              "held_out_questions": len(rows), "warm_start_model": warm, "trained_model": trained}
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    visual = args.env == "visual"
    if visual:
        from rlfactory.cli import visual_demo

        try:
            visual_demo.parse_runs(args.runs)
        except ValueError as e:
            print(f"rlfactory demo: {e}", file=sys.stderr)
            return 2
    cfg = load_run_config(args.config or str(visual_demo.DEFAULT_CONFIG if visual else DEFAULT_CONFIG), args.overrides)
    out = Path(args.out or ("runs/visual_demo" if visual else "runs/demo"))
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            print(f"rlfactory demo: {out} exists and is not a demo folder; pick another --out", file=sys.stderr)
            return 2
        shutil.rmtree(out)  # an earlier demo run: replaced
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by rlfactory demo; the next demo run replaces this folder\n")
    if visual:
        return visual_demo.run(args, cfg, out)
    t0 = time.perf_counter()
    result = asyncio.run(run_demo(cfg, out, args.eval_limit))
    total = time.perf_counter() - t0
    print_table(result["before"], result["after"])
    print(f"\n{result['held_out_questions']} held-out questions about entities never seen in training; "
          f"{result['steps']} GRPO steps.")
    print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in result["times_s"].items()) + f"; total {total / 60:.1f} min")
    print(f"reward curve: {out / 'reward_curve.png'}   results: {out / 'results.json'}")
    return 0
