"""`rlfactory eval CONFIG --model DIR [--split test] [--out FILE.json]`: evaluate a policy."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfactory.cli.common import allow_overrides_after_options

if TYPE_CHECKING:
    from rlfactory.config import RunConfig
    from rlfactory.train.session import RolloutSession


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a model on an env's split: accuracy, reward terms, tool calls, turns",
        description="Roll out every row of a split (greedy unless --sample), score it with the config's reward, "
        "and report per question and on average.",
    )
    p.add_argument("config", help="run config (YAML): env, tools, reward, rollout limits")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. rollout.max_turns=3")
    p.add_argument("--model", required=True, help="a Hugging Face folder (e.g. a checkpoint's model/), a LoRA "
                   "adapter folder, a .gguf file, smollm2:135m, or tiny:1m / tiny:10m")
    p.add_argument("--split", default="test", help="dataset split (default: test)")
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--n", type=int, default=1, help="samples per question (default 1)")
    p.add_argument("--limit", type=int, help="evaluate only the first N rows")
    p.add_argument("--sample", action="store_true", help="sample with the config's settings instead of greedy")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    report = asyncio.run(evaluate_model(cfg, args.model, args.split, n=args.n, limit=args.limit, greedy=not args.sample))
    avg = report["averages"]
    print(f"{int(avg['questions'])} questions ({args.split}): accuracy {avg['accuracy']:.3f}, "
          f"reward {avg['reward/mean']:.4f}, tool calls {avg['traj/tool_calls']:.2f}, turns {avg['traj/turns']:.2f}")
    for k, v in avg.items():
        if k.startswith("reward/") and k not in ("reward/mean", "reward/std"):
            print(f"  {k}: {v:.4f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(f"report written to {args.out}", file=sys.stderr)
    return 0


async def evaluate_model(cfg: RunConfig, model: str, split: str, *, n: int = 1, limit: int | None = None,
                         greedy: bool = True) -> dict[str, Any]:
    """Evaluate `model` (HF folder, LoRA adapter folder or tiny spec) on `split` of cfg's env."""
    from rlfactory.train.session import open_rollout
    from rlfactory.train.prepare import command_checks
    from rlfactory.train.evaluate import evaluate

    adapter = Path(model) / "adapter_config.json"
    if adapter.is_file():
        cfg.model.path = json.loads(adapter.read_text())["base_model_name_or_path"]
    else:
        cfg.model.path = model
    checks = command_checks("eval", cfg, split)
    async with open_rollout(cfg, reward_mode=checks.reward_mode, check_splits=checks.check_splits) as session:
        if adapter.is_file():
            from peft import PeftModel

            PeftModel.from_pretrained(session.model, model)  # injects the adapters in place
        await _send_to_servers(cfg, session, model)
        env = session.env
        rows = list(env.load_split(split))
        if limit is not None:
            rows = rows[:limit]
        return await evaluate(session.engine, session.reward, rows, n=n, greedy=greedy)


async def _send_to_servers(cfg: RunConfig, session: RolloutSession, model: str) -> None:
    """With generation servers, evaluate `model`'s weights: push them to every server first."""
    from rlfactory.train.weight_sync import make_weight_sync

    if cfg.generator.backend != "server":
        return
    sync = make_weight_sync(cfg, session.generator)
    if sync is None:
        print("rlfactory eval: generator.weight_sync is none, so the servers' own weights are evaluated, not "
              f"{model}", file=sys.stderr)
        return
    meta = Path(model).parent / "meta.json"  # a checkpoint's model folder: its policy version
    version = int(json.loads(meta.read_text()).get("policy_version", 0)) if meta.is_file() else 0
    metrics = await sync.push(session.model, version)
    if metrics["weight_sync/failed"]:
        print(f"rlfactory eval: {int(metrics['weight_sync/failed'])} server(s) did not take the weights of {model}; "
              "they get no turns", file=sys.stderr)
