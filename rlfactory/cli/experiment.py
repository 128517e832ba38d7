"""`rlfactory experiment CONFIG`: base eval -> SFT warm start -> GRPO -> eval, with a table.

For any config whose env has a solver (demonstrations for the warm start): evaluates the base
model (`model.path`) on the held-out split, warm-starts it (`rlfactory sft`), evaluates again,
trains with GRPO from the warm start (`rlfactory train`), evaluates the result, and prints
held-out accuracy, tool-call rate and tool calls per question for all three, with the steps and
minutes each phase took. `examples/smollm2_calculator.yaml` is the experiment this was made for.
"""

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

MARKER = ".rlfactory-experiment"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "experiment",
        help="base eval -> SFT warm start -> GRPO -> eval of one config, with a before/after table",
        description="Evaluates model.path on the env's test split, warm-starts it on the env solver's "
        "demonstrations, evaluates, trains it with GRPO from the warm start, evaluates again, and prints "
        "held-out accuracy and tool-call rate for the base model, the warm start and the trained model.",
    )
    p.add_argument("config", help="run config (YAML) with sft: and trainer: sections")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. trainer.steps=20")
    p.add_argument("--out", default=None, help="run folder (default: the parent of trainer.run_dir); replaced on each run")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N test rows only")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def summarize(report: dict[str, Any]) -> dict[str, float]:
    """Held-out accuracy, share of questions with at least one tool call, tool calls per question."""
    qs = report["questions"]
    n = max(1, len(qs))
    return {
        "accuracy": sum(q["accuracy"] or 0.0 for q in qs) / n,
        "tool_call_rate": sum(1.0 for q in qs if q["tool_calls"] > 0) / n,
        "tool_calls": sum(q["tool_calls"] for q in qs) / n,
        "questions": float(len(qs)),
    }


def print_table(stages: dict[str, dict[str, float]], file=None) -> None:
    file = file or sys.stdout
    names = list(stages)
    print(f"\n{'held-out':28s}" + "".join(f"{n:>14s}" for n in names), file=file)
    for label, key, pct in (("accuracy", "accuracy", True), ("tool-call rate", "tool_call_rate", True),
                            ("tool calls per question", "tool_calls", False)):
        cells = [stages[n][key] for n in names]
        print(f"{label:28s}" + "".join(f"{c * 100:13.1f}%" if pct else f"{c:14.2f}" for c in cells), file=file)


async def run_experiment(cfg: RunConfig, out: Path, eval_limit: int | None) -> dict[str, Any]:
    from rlfactory.cli.eval import evaluate_model
    from rlfactory.cli.common import train_from
    from rlfactory.cli.sft import run_sft
    from rlfactory.generation.heap import give_back_freed_memory

    times: dict[str, float] = {}
    stages: dict[str, dict[str, float]] = {}

    async def evaluate(name: str, model: str) -> None:
        t = time.perf_counter()
        report = await evaluate_model(cfg.model_copy(deep=True), model, "test", limit=eval_limit)
        give_back_freed_memory()  # each phase's freed temporaries, before the next phase (generation/heap.py)
        times[f"eval {name}"] = time.perf_counter() - t
        stages[name] = summarize(report)
        (out / f"eval_{name.replace(' ', '_')}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(f"[experiment] {name}: held-out accuracy {stages[name]['accuracy']:.3f}, tool-call rate "
              f"{stages[name]['tool_call_rate']:.3f} ({times[f'eval {name}']:.0f}s)", file=sys.stderr)

    await evaluate("base", cfg.model.path)
    t = time.perf_counter()
    sft_cfg = cfg.model_copy(deep=True)
    sft_cfg.sft.out = str(out / "sft")
    await run_sft(sft_cfg)
    give_back_freed_memory()
    warm = str(out / "sft" / "model")
    times["sft"] = time.perf_counter() - t
    await evaluate("warm start", warm)

    t = time.perf_counter()
    history, trained = await train_from(cfg, warm, out / "grpo")
    give_back_freed_memory()
    times["grpo"] = time.perf_counter() - t
    await evaluate("after GRPO", trained)
    result = {"stages": stages, "times_s": times, "sft_steps": cfg.sft.steps, "grpo_steps": len(history),
              "warm_start_model": warm, "trained_model": trained}
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path(cfg.trainer.run_dir).parent
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            print(f"rlfactory experiment: {out} exists and is not an experiment folder; pick another --out", file=sys.stderr)
            return 2
        shutil.rmtree(out)  # an earlier run of the experiment: replaced
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by rlfactory experiment; the next run replaces this folder\n")
    t0 = time.perf_counter()
    result = asyncio.run(run_experiment(cfg, out, args.eval_limit))
    total = time.perf_counter() - t0
    print_table(result["stages"])
    n = int(result["stages"]["base"]["questions"])
    print(f"\n{n} held-out questions; {result['sft_steps']} SFT steps, {result['grpo_steps']} GRPO steps; "
          f"model {cfg.model.path}.")
    print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in result["times_s"].items()) + f"; total {total / 60:.1f} min")
    print(f"results: {out / 'results.json'}")
    return 0
