"""Turn-level credit on the demo's search env: outcome-only GRPO against per-turn variants, from
one shared warm start, with the same budget (steps, prompts, group size), several seeds each.

    .venv/bin/python benchmarks/credit.py --json benchmarks/results/credit.json \
        | tee benchmarks/results/credit.txt

Variants (each is examples/demo.yaml plus the overrides in VARIANTS):
  grpo          outcome only (the demo's default until the figures of benchmarks/results/credit.txt
                made it gigpo): the baseline every ratio is taken against
  turn_grpo+hit turn-discounted returns (turn_gamma 0.95) with a retrieval-hit process reward
                (a search turn whose results contain the reference answer, weight 0.3)
  gigpo         GiGPO (Feng et al. 2025): episode-level GRPO plus the step-level advantage within
                anchor states (turns that read identical search results), turn_gamma 0.95
  turn_loo+hit  the length-unbiased per-turn baseline with the retrieval-hit process reward

Figures per run (all on the held-out test split, whose entities never appear in training): exact
match overall, single-hop and multi-hop, searches per question (after the last step), and the
first step whose held-out exact match (evaluated every --eval-every steps) reaches 70%. Printed
per seed, as mean and spread over seeds, and as the ratio to grpo's mean in this same run.

`--merge A.json B.json ...` prints one report from runs made one (variant, seed) per invocation
(each with its own --json): their results side by side. `--forms EVAL.json ...` prints held-out
exact match and searches per question form (the question with its names taken out) from
`rlfactory eval --out` reports: where a variant's misses are.

`--smoke` runs the whole code path at a tiny size (a few demonstrations and steps, 1 seed, a
few held-out questions): what tests/train/test_train_credit_benchmark.py runs. Its figures mean
nothing. The full run takes about 1.5 hours of quiet 2-core CPU (a warm start of ~9 minutes,
then 4 variants x 3 seeds of ~5 minutes of training and ~1.5 minutes of evaluation each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
HIT = "reward.turn_terms={retrieval_hit: 0.3}"
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algo.advantage=grpo"],
    "turn_grpo+hit": ["algo.advantage=turn_grpo", "algo.turn_gamma=0.95", HIT],
    "gigpo": ["algo.advantage=gigpo", "algo.turn_gamma=0.95"],  # the demo's default now
    "turn_loo+hit": ["algo.advantage=turn_loo", "algo.turn_gamma=0.95", HIT],
}
SMOKE = ["env.options.n_train_entities=60", "env.options.n_test_entities=10", "sft.demos=32", "sft.steps=4",
         "sft.full_text_steps=2", "sft.batch_size=8", "trainer.steps=1", "trainer.prompts_per_step=2",
         "algo.group_size=2", "rollout.max_new_tokens=12", "trainer.progress=false"]
FIGURES = ["exact_match", "exact_match_single", "exact_match_multi", "searches_per_question", "steps_to_70"]
TARGET = 0.70


def steps_to(run_dir: Path, target: float) -> float | None:
    """The first step whose held-out evaluation (eval.jsonl) reached `target` exact match."""
    from rlfactory.train.runlog import read_metrics

    path = run_dir / "eval.jsonl"
    for rec in read_metrics(path) if path.is_file() else []:
        if rec.get("accuracy", 0.0) >= target:
            return float(rec["step"])
    return None


async def one_run(config: str, overrides: list[str], warm: str, out: Path, rows: list[dict], chains: dict,
                  eval_limit: int | None) -> dict[str, Any]:
    from rlfactory.cli.common import load_run_config, train_from
    from rlfactory.cli.demo import search_stats
    from rlfactory.cli.eval import evaluate_model

    cfg = load_run_config(config, overrides)
    t0 = time.perf_counter()
    history, trained = await train_from(cfg, warm, out)
    train_s = time.perf_counter() - t0
    report = await evaluate_model(cfg.model_copy(deep=True), trained, "test", limit=eval_limit)
    stats = search_stats(report, rows, chains)
    return {**stats, "steps_to_70": steps_to(out, TARGET), "steps": len(history), "train_s": train_s}


def _fmt(key: str, v: float | None) -> str:
    if v is None:
        return "   never"
    return f"{v:8.0f}" if key == "steps_to_70" else f"{v:8.3f}"


def print_report(results: dict[str, dict[int, dict[str, Any]]], file=sys.stdout) -> None:
    print(f"\n{'variant':14s}{'seed':>5s}" + "".join(f"{k[:12]:>14s}" for k in FIGURES), file=file)
    for name, seeds in results.items():
        for seed, r in seeds.items():
            print(f"{name:14s}{seed:5d}" + "".join(f"{_fmt(k, r[k]):>14s}" for k in FIGURES), file=file)
    base = results.get("grpo")
    print("\nmean over seeds (± half the spread: (max - min) / 2); ratio to grpo's mean in this run", file=file)
    for name, seeds in results.items():
        cells = []
        for k in FIGURES:
            vals = [r[k] for r in seeds.values() if r[k] is not None]
            if not vals:
                cells.append(f"{'never':>22s}")
                continue
            mean, spread = statistics.fmean(vals), max(vals) - min(vals)
            base_vals = [r[k] for r in base.values() if r[k] is not None] if base else []
            ratio = mean / statistics.fmean(base_vals) if base_vals and statistics.fmean(base_vals) else None
            reached = "" if len(vals) == len(seeds) else f" ({len(vals)}/{len(seeds)})"
            cells.append(f"{mean:.3f}±{spread / 2:.3f}" + (f" x{ratio:.2f}" if ratio is not None else "") + reached)
        print(f"{name:14s}" + "  ".join(f"{c:>22s}" for c in cells), file=file)
    print("columns: " + ", ".join(FIGURES), file=file)


def merge(paths: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """The results of several --json files (one per invocation) as one; a (variant, seed) twice is an error."""
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for path in paths:
        for name, seeds in json.loads(Path(path).read_text())["results"].items():
            for seed, r in seeds.items():
                if int(seed) in results.get(name, {}):
                    raise SystemExit(f"credit.py --merge: {name} seed {seed} is in two files ({path})")
                results.setdefault(name, {})[int(seed)] = r
    order = [v for v in VARIANTS if v in results]
    return {name: dict(sorted(results[name].items())) for name in order}


def question_form(question: str) -> str:
    """A question with its names taken out (the demo's names are capitalised made-up words)."""
    return " ".join(w for w in question.split() if w[0].islower() or w in ("When", "Where", "Who", "In", "What"))


def print_forms(paths: list[str], file=sys.stdout) -> None:
    for path in paths:
        qs = json.loads(Path(path).read_text())["questions"]
        forms: dict[str, list[dict[str, Any]]] = {}
        for q in qs:
            forms.setdefault(question_form(q["question"]), []).append(q)
        print(f"\n{path}: {len(qs)} questions, exact match {statistics.fmean(q['accuracy'] for q in qs):.3f}", file=file)
        print(f"{'question form':40s}{'n':>5s}{'searches':>10s}{'exact':>8s}", file=file)
        for form in sorted(forms):
            group = forms[form]
            print(f"{form:40s}{len(group):5d}{statistics.fmean(q['tool_calls'] for q in group):10.2f}"
                  f"{statistics.fmean(q['accuracy'] for q in group):8.3f}", file=file)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from rlfactory.cli.common import load_run_config
    from rlfactory.cli.demo import chain_queries
    from rlfactory.cli.sft import run_sft
    from rlfactory.envs.registry import env_from_config

    base = (SMOKE if args.smoke else []) + [f"trainer.eval_every={args.eval_every}", "trainer.save_every=0"]
    if args.eval_limit:
        base.append(f"trainer.eval_limit={args.eval_limit}")
    out = Path(args.out)
    cfg = load_run_config(args.config, base)
    warm = args.warm
    if warm is None:
        cfg.sft.out = str(out / "sft")
        await run_sft(cfg)
        warm = str(out / "sft" / "model")
    with env_from_config(cfg.env, family=cfg.model.family) as env:
        rows = list(env.load_split("test"))[: args.eval_limit]
        chains = chain_queries(env, [r for r in rows if int((r.get("extra_info") or {}).get("hops", 1)) > 1])
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for name in args.variants:
        for seed in args.seeds:
            overrides = base + VARIANTS[name] + [f"trainer.seed={seed}"]
            print(f"[credit] {name} seed {seed}", file=sys.stderr)
            r = await one_run(args.config, overrides, warm, out / name.replace("+", "_") / f"seed{seed}", rows, chains,
                              args.eval_limit)
            results.setdefault(name, {})[seed] = r
    return {"warm_start": warm, "variants": {k: VARIANTS[k] for k in args.variants}, "results": results,
            "held_out_questions": len(rows), "target": TARGET, "smoke": args.smoke}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(DEMO))
    p.add_argument("--out", default="runs/credit")
    p.add_argument("--warm", default=None, help="a warm-start model folder to reuse (default: train one with sft)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every N steps (steps to 70%%)")
    p.add_argument("--eval-limit", type=int, default=None, help="the first N held-out questions only")
    p.add_argument("--smoke", action="store_true", help="the whole code path at a tiny size (figures mean nothing)")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON", help="report the results of these --json files")
    p.add_argument("--forms", nargs="+", default=None, metavar="EVAL_JSON",
                   help="exact match by question form from `rlfactory eval --out` reports")
    args = p.parse_args(argv)
    if args.merge or args.forms:
        if args.merge:
            print_report(merge(args.merge))
        if args.forms:
            print_forms(args.forms)
        return 0
    t0 = time.perf_counter()
    report = asyncio.run(main_async(args))
    print_report(report["results"])
    print(f"\n{report['held_out_questions']} held-out questions; total {(time.perf_counter() - t0) / 60:.1f} min")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
