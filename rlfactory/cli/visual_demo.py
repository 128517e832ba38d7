"""`rlfactory demo --env visual`: a tiny vision-language model learns to look (issue 31).

On CPU, in minutes: warm-start `tiny-vl:1m-compact` on the visual env's solver demonstrations
(most of which answer with a guess, without zooming), evaluate it on held-out pictures, train it
with GRPO, evaluate again; then the same for the control run, whose `zoom` answers with text only
(`env.options.tool_images: false`). Prints held-out accuracy and zoom rate for each stage: GRPO
should pay for zooming in the run that sees the zoomed pixels, and cannot in the control (its
prompts' pictures show no code: `ink: code`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfactory.config import RunConfig

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "visual_demo.yaml"
RUNS = ("pixels", "control")
"""`pixels`: zoom returns the picture; `control`: zoom returns text only (tool_images: false)."""


@dataclass
class Stage:
    """Held-out figures of one model: accuracy, share of questions it zoomed on, and accuracy on those."""

    accuracy: float
    zoom_rate: float
    accuracy_when_zoomed: float
    questions: int

    @classmethod
    def of(cls, report: dict[str, Any]) -> Stage:
        qs = report["questions"]
        zoomed = [q for q in qs if q["tool_calls"] > 0]
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        return cls(accuracy=mean([q["accuracy"] or 0.0 for q in qs]), zoom_rate=len(zoomed) / max(1, len(qs)),
                   accuracy_when_zoomed=mean([q["accuracy"] or 0.0 for q in zoomed]), questions=len(qs))


@dataclass
class RunResult:
    """One run of the demo (pixels or control): its warm start, after GRPO, and the minutes of each phase."""

    name: str
    warm_start: Stage
    after_grpo: Stage
    grpo_steps: int
    times_s: dict[str, float] = field(default_factory=dict)


def run_config(cfg: RunConfig, name: str, out: Path) -> RunConfig:
    """`cfg` for one run: the control's zoom shows no picture; each run has its own folders."""
    run = cfg.model_copy(deep=True)
    if name == "control":
        run.env.options = {**run.env.options, "tool_images": False}
    run.sft.out = str(out / name / "sft")
    run.trainer.run_dir = str(out / name / "grpo")
    return run


async def demo_run(cfg: RunConfig, name: str, out: Path, eval_limit: int | None) -> RunResult:
    """Warm start (sft) -> held-out eval -> GRPO -> held-out eval, for one run."""
    from rlfactory.cli.common import train_from
    from rlfactory.cli.eval import evaluate_model
    from rlfactory.cli.sft import run_sft

    run = run_config(cfg, name, out)
    times: dict[str, float] = {}
    t = time.perf_counter()
    await run_sft(run)
    warm = str(Path(run.sft.out) / "model")
    times["warm start (sft)"] = time.perf_counter() - t

    async def evaluate(model: str, label: str) -> Stage:
        t = time.perf_counter()
        report = await evaluate_model(run.model_copy(deep=True), model, "test", limit=eval_limit)
        times[label] = time.perf_counter() - t
        (out / name / f"{label.replace(' ', '_')}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        return Stage.of(report)

    before = await evaluate(warm, "eval before")
    print(f"[demo] {name}: warm start held-out accuracy {before.accuracy:.3f}, zoom rate {before.zoom_rate:.2f}",
          file=sys.stderr)
    t = time.perf_counter()
    history, trained = await train_from(run, warm, Path(run.trainer.run_dir))
    times["grpo"] = time.perf_counter() - t
    after = await evaluate(trained, "eval after")
    print(f"[demo] {name}: after GRPO held-out accuracy {after.accuracy:.3f}, zoom rate {after.zoom_rate:.2f}",
          file=sys.stderr)
    return RunResult(name, before, after, len(history), times)


def print_table(results: list[RunResult], file=None) -> None:
    file = file or sys.stdout
    cols = [(f"{r.name}: {label}", stage) for r in results
            for label, stage in (("warm", r.warm_start), ("GRPO", r.after_grpo))]
    print("\n" + f"{'held-out pictures':26s}" + "".join(f"{c:>17s}" for c, _ in cols), file=file)
    for label, key in (("accuracy", "accuracy"), ("zoom rate", "zoom_rate"),
                       ("accuracy when zoomed", "accuracy_when_zoomed")):
        print(f"{label:26s}" + "".join(f"{getattr(s, key) * 100:16.1f}%" for _, s in cols), file=file)
    by = {r.name: r for r in results}
    if "pixels" in by:
        p = by["pixels"].after_grpo.accuracy
        line = f"after GRPO vs warm start: {(p - by['pixels'].warm_start.accuracy) * 100:+.1f} points"
        if "control" in by:
            line += f"; vs the control after GRPO: {(p - by['control'].after_grpo.accuracy) * 100:+.1f} points"
        print(line, file=file)


async def run_visual_demo(cfg: RunConfig, out: Path, runs: list[str], eval_limit: int | None) -> list[RunResult]:
    from rlfactory.tiny import resolve_model

    print(f"[demo] model: {cfg.model.path} -> {resolve_model(cfg.model.path)}", file=sys.stderr)
    results = []
    for name in runs:
        (out / name).mkdir(parents=True, exist_ok=True)
        results.append(await demo_run(cfg, name, out, eval_limit))
        (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1), encoding="utf-8")
    return results


def parse_runs(text: str) -> list[str]:
    """`--runs pixels,control` -> the runs; a ValueError (one line) for anything else."""
    runs = [r.strip() for r in text.split(",") if r.strip()]
    if not runs or any(r not in RUNS for r in runs) or len(set(runs)) < len(runs):
        raise ValueError(f"--runs takes {' and/or '.join(RUNS)} (comma-separated), got {text!r}")
    return runs


def run(args: argparse.Namespace, cfg: RunConfig, out: Path) -> int:
    """`rlfactory demo --env visual` (demo.py has loaded `cfg`, checked --runs and made `out`, a demo folder)."""
    import asyncio

    runs = parse_runs(args.runs)
    t0 = time.perf_counter()
    results = asyncio.run(run_visual_demo(cfg, out, runs, args.eval_limit))
    total = time.perf_counter() - t0
    print_table(results)
    n = results[0].warm_start.questions
    print(f"\n{n} held-out pictures (none shares its digit, place and colour with a training one); "
          + ", ".join(f"{r.name}: {r.grpo_steps} GRPO steps" for r in results) + f"; model {cfg.model.path}.")
    for r in results:
        print(f"time, {r.name}: " + ", ".join(f"{k} {v:.0f}s" for k, v in r.times_s.items()))
    print(f"total {total / 60:.1f} min   results: {out / 'results.json'}")
    return 0
