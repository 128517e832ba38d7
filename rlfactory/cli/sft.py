"""`rlfactory sft CONFIG [KEY=VALUE ...]`: warm-start a model on the env's solver demonstrations."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from rlfactory.cli.common import allow_overrides_after_options


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sft",
        help="warm-start a model by fine-tuning on demonstrations the env's solver writes",
        description="Writes sft.demos demonstrations with the env's own solver (real tool calls and results), "
        "fine-tunes model.path on their model tokens for sft.steps steps, and saves the model to sft.out.",
    )
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. sft.steps=100")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


async def run_sft(cfg) -> list[dict]:
    """Demonstrations -> fine-tuned model in cfg.sft.out. Returns the per-step metrics."""
    from rlfactory.rollout.build import open_rollout, pad_id_of
    from rlfactory.rollout.prepare import command_checks
    from rlfactory.train.sft import save_model_atomically, sft_train, write_demonstrations

    out = Path(cfg.sft.out)
    checks = command_checks("sft", cfg)
    async with open_rollout(cfg, reward_mode=checks.reward_mode, check_splits=checks.check_splits) as session:
        specs = session.runner.specs()
        demos = write_demonstrations(session.env, session.tool_manager, specs, cfg.sft.demos)
        tokens = sum(len(d.input_ids) for d in demos)
        per_step = min(cfg.sft.batch_size, len(demos)) * tokens / len(demos)
        print(f"sft: {len(demos)} demonstrations, {tokens} tokens (mean {tokens / len(demos):.0f}); "
              f"{cfg.sft.steps} steps of {min(cfg.sft.batch_size, len(demos))} demos, about "
              f"{per_step * cfg.sft.steps:,.0f} tokens in all", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        clock = _StepClock(cfg.sft.steps)
        with open(out / "sft_metrics.jsonl", "w", encoding="utf-8") as f:
            def log(row: dict) -> None:
                f.write(json.dumps(row) + "\n")
                estimate = clock.tick(row["step"], row["tokens_per_s"])
                if estimate:
                    print(estimate, file=sys.stderr)
                if row["step"] % 25 == 0 or row["step"] == cfg.sft.steps:
                    print(f"sft step {row['step']}/{cfg.sft.steps}: loss {row['loss']:.4f} "
                          f"token acc {row['token_acc']:.3f}", file=sys.stderr)

            history = sft_train(session.model, demos, pad_id_of(session.tokenizer, session.model), cfg.sft, log)
        save_model_atomically(session.model, session.tokenizer, out / "model")
    return history


class _StepClock:
    """Times the first steps and, once (after step 2, the first without start-up costs), says how
    long all `steps` will take at the measured rate."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.last = time.perf_counter()
        self.said = False

    def tick(self, step: int, tokens_per_s: float) -> str | None:
        now, took = time.perf_counter(), time.perf_counter() - self.last
        self.last = now
        if self.said or step < 2 or self.steps <= 2:
            return None
        self.said = True
        total_s = took * self.steps
        advice = ("; to go faster: fewer sft.steps, a smaller sft.batch_size, or fewer demo tokens "
                  "(shorter tool descriptions, smaller rollout budgets)") if total_s > 300 else ""
        return (f"sft: {took:.2f} s/step ({tokens_per_s:,.0f} tokens/s measured on step {step}): "
                f"about {_duration(total_s)} for {self.steps} steps{advice}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    history = asyncio.run(run_sft(cfg))
    model = Path(cfg.sft.out) / "model"
    print(f"sft: {len(history)} steps, final loss {history[-1]['loss']:.4f}; model saved to {model} "
          f"(train from it with model.path={model})")
    return 0
