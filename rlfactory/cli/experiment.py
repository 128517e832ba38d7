"""`rlfactory experiment CONFIG`: base eval -> SFT warm start -> GRPO -> eval, with a table.

For any config whose env has a solver (demonstrations for the warm start): evaluates the base
model (`model.path`) on the held-out split, warm-starts it (`rlfactory sft`), evaluates again,
trains with GRPO from the warm start (`rlfactory train`), evaluates the result, and prints
held-out accuracy, tool-call rate and tool calls per question for all three, with the steps and
minutes each phase took. `examples/smollm2_calculator.yaml` is the experiment this was made for.

`--from-experiment DIR` reuses an earlier run's first three phases (DIR/sft/model and DIR's base and
warm-start evaluations) and runs GRPO and the last evaluation only: the warm start is deterministic
for a given config, so a rerun that changes only GRPO settings (trainer.*, algo.*, the reward's
weights) need not repeat it. That the earlier run had the same model, SFT and env settings is the
caller's to know; the reused files are named on stderr and in results.json.
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
    p.add_argument("--from-experiment", default=None, metavar="DIR",
                   help="reuse an earlier experiment folder's warm start (DIR/sft/model) and its base and warm-start "
                        "evaluations: GRPO and the last evaluation only")
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


REUSED = {"base": "eval_base.json", "warm start": "eval_warm_start.json"}
"""The evaluations `--from-experiment` takes from the earlier folder, by stage."""


def reusable(folder: Path) -> str | None:
    """Why `folder` cannot be reused by `--from-experiment` (None: it can)."""
    missing = [name for name in ["sft/model", *REUSED.values()] if not (folder / name).exists()]
    if missing:
        return f"{folder} is not a finished experiment folder (no {', '.join(missing)})"
    return None


async def run_experiment(cfg: RunConfig, out: Path, eval_limit: int | None,
                         reuse: Path | None = None) -> dict[str, Any]:
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

    if reuse is None:
        await evaluate("base", cfg.model.path)
        t = time.perf_counter()
        sft_cfg = cfg.model_copy(deep=True)
        sft_cfg.sft.out = str(out / "sft")
        await run_sft(sft_cfg)
        give_back_freed_memory()
        warm = str(out / "sft" / "model")
        times["sft"] = time.perf_counter() - t
        await evaluate("warm start", warm)
    else:  # the earlier folder's warm start and evaluations, copied beside this run's
        warm = str(reuse / "sft" / "model")
        for name, file in REUSED.items():
            text = (reuse / file).read_text(encoding="utf-8")
            (out / file).write_text(text, encoding="utf-8")
            stages[name] = summarize(json.loads(text))
        print(f"[experiment] base and warm start: reused from {reuse} ({', '.join(REUSED.values())}; warm start "
              f"{warm})", file=sys.stderr)

    t = time.perf_counter()
    history, trained = await train_from(cfg, warm, out / "grpo")
    give_back_freed_memory()
    times["grpo"] = time.perf_counter() - t
    await evaluate("after GRPO", trained)
    if reuse is not None and stages["base"].get("questions") != stages["after GRPO"].get("questions"):
        print(f"[experiment] the reused evaluations held {stages['base'].get('questions'):.0f} questions and this "
              f"one {stages['after GRPO'].get('questions'):.0f}: --eval-limit or the test split differ, so the "
              "table compares different questions", file=sys.stderr)
    result = {"stages": stages, "times_s": times, "sft_steps": cfg.sft.steps if reuse is None else None,
              "grpo_steps": len(history),
              "warm_start_model": warm, "trained_model": trained,
              "reused_from": None if reuse is None else str(reuse)}
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path(cfg.trainer.run_dir).parent
    reuse = Path(args.from_experiment).resolve() if args.from_experiment else None
    if reuse is not None:
        why = reusable(reuse)
        if why is None and (reuse == out.resolve() or out.resolve() in reuse.parents):
            why = f"--out {out} would replace the folder it reuses"
        if why is not None:
            print(f"rlfactory experiment: --from-experiment: {why}", file=sys.stderr)
            return 2
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            print(f"rlfactory experiment: {out} exists and is not an experiment folder; pick another --out", file=sys.stderr)
            return 2
        shutil.rmtree(out)  # an earlier run of the experiment: replaced
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by rlfactory experiment; the next run replaces this folder\n")
    t0 = time.perf_counter()
    result = asyncio.run(run_experiment(cfg, out, args.eval_limit, reuse))
    total = time.perf_counter() - t0
    print_table(result["stages"])
    n = int(result["stages"]["base"]["questions"])
    sft = f"{result['sft_steps']} SFT steps" if reuse is None else f"the warm start of {reuse}"
    print(f"\n{n} held-out questions; {sft}, {result['grpo_steps']} GRPO steps; model {cfg.model.path}.")
    print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in result["times_s"].items()) + f"; total {total / 60:.1f} min")
    print(f"results: {out / 'results.json'}")
    return 0
