"""`rlfactory train CONFIG [KEY=VALUE ...] [--resume]`: train a policy with RL on a config."""

from __future__ import annotations

import argparse
import asyncio
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy with RL (GRPO/PPO) on multi-turn tool use",
        description="Roll out, score, compute advantages and update the policy for trainer.steps steps. "
        "Writes config.yaml, metrics.jsonl, TensorBoard events, trajectories and checkpoints to trainer.run_dir.",
    )
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. trainer.lr=1e-5")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in trainer.run_dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config
    from rlfactory.train.loop import train

    cfg = load_run_config(args.config, args.overrides)
    open_session = None
    stops: tuple[type[Exception], ...] = (FileExistsError,)  # reported in one line
    if cfg.trainer.backend == "ray":
        from rlfactory.distributed import open_ray_rollout, require_ray
        from rlfactory.distributed.workers import WorkerStartError

        stops += (WorkerStartError,)
        try:
            require_ray()
        except ImportError as e:
            print(f"rlfactory train: {e}", file=sys.stderr)
            return 2
        open_session = open_ray_rollout
    try:
        history = asyncio.run(train(cfg, resume=args.resume, open_session=open_session))
    except stops as e:
        print(f"rlfactory train: {e}", file=sys.stderr)
        return 2
    if history:
        last = history[-1]
        print(f"trained {len(history)} step(s); last reward {last['reward/mean']:.4f}, "
              f"accuracy {last['accuracy']:.3f}; run dir: {cfg.trainer.run_dir}")
    else:
        print(f"nothing to do: {cfg.trainer.run_dir} is already at step {cfg.trainer.steps}")
    return 0
