"""`rlfactory sft CONFIG [KEY=VALUE ...]`: warm-start a model on the env's solver demonstrations."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
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
    from rlfactory.train.session import open_rollout, pad_id_of
    from rlfactory.train.prepare import command_checks
    from rlfactory.train.sft import save_model_atomically, sft_train, write_demonstrations
    from rlfactory.train.batch_images import PixelSource
    from rlfactory.train.sft_progress import SftReporter

    out = Path(cfg.sft.out)
    checks = command_checks("sft", cfg)
    async with open_rollout(cfg, reward_mode=checks.reward_mode, check_splits=checks.check_splits) as session:
        specs = session.runner.specs()
        label = cfg.env.name
        demos = write_demonstrations(session.env, session.tool_manager, specs, cfg.sft.demos, label, seed=cfg.sft.seed)
        tokens = sum(len(d.input_ids) for d in demos)
        per_step = min(cfg.sft.batch_size, len(demos)) * tokens / len(demos)
        print(f"sft: {len(demos)} demonstrations, {tokens} tokens (mean {tokens / len(demos):.0f}); "
              f"{cfg.sft.steps} steps of {min(cfg.sft.batch_size, len(demos))} demos, about "
              f"{per_step * cfg.sft.steps:,.0f} tokens in all", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        report = SftReporter(cfg.sft.steps, sys.stderr)
        with open(out / "sft_metrics.jsonl", "w", encoding="utf-8") as f:
            def log(row: dict) -> None:
                f.write(json.dumps(row) + "\n")
                report.step(row)

            try:
                tm = session.tool_manager  # a vision-language one gives the demos' images their pixels
                history = sft_train(session.model, demos, pad_id_of(session.tokenizer, session.model), cfg.sft, log,
                                    pixels=tm if isinstance(tm, PixelSource) else None)
            finally:
                report.close()
        if demos.augmented:
            print(f"sft: {demos.augmented} of {demos.visits} visits trained on the env's variant of a demonstration "
                  "(augment_demo)", file=sys.stderr)
        save_model_atomically(session.model, session.tokenizer, out / "model")
        await _check_warm_start(cfg, session, out, label)
    return history


async def _check_warm_start(cfg, session, out: Path, label: str) -> None:
    """The trained model against its demonstrator on held-out rows (sft.check_rows), printed."""
    from rlfactory.train.prepare import split_rows
    from rlfactory.train.warm_start import check_warm_start

    rows = split_rows(session.env, "test", label)[: cfg.sft.check_rows]
    if not rows:
        if cfg.sft.check_rows:
            print("sft: no test rows to check the warm start on", file=sys.stderr)
        return
    check = await check_warm_start(session.engine, session.env, rows)
    (out / "warm_start.json").write_text(check.to_json(), encoding="utf-8")
    print(f"sft: warm start on {check.rows} held-out rows (greedy): {check.summary()}", file=sys.stderr)
    for line in check.advice:
        print(f"sft: advice: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    history = asyncio.run(run_sft(cfg))
    model = Path(cfg.sft.out) / "model"
    print(f"sft: {len(history)} steps, final loss {history[-1]['loss']:.4f}; model saved to {model} "
          f"(train from it with model.path={model})")
    return 0
