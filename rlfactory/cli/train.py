"""`rlfactory train CONFIG [KEY=VALUE ...] [--resume] [--restart] [--nproc N]`: train a policy with RL on a config.

Under torchrun (RANK and WORLD_SIZE set) every rank runs this command and the trainer uses the
FSDP2 learner (rlfactory.distributed.fsdp); `--nproc N` starts that launch on this machine:
`python -m torch.distributed.run --standalone --nproc-per-node N -m rlfactory.cli.main train ...`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

from rlfactory.cli.common import allow_overrides_after_options


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
    p.add_argument("--restart", action="store_true",
                   help="start over in a trainer.run_dir that holds a run: delete its logs, trajectories and checkpoints "
                   "(with --resume: only when it has no checkpoint to continue from). Without it a run directory's "
                   "history is never deleted")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train with the FSDP2 learner on N processes of this machine (starts torchrun)")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The torchrun launch that `--nproc N` runs (the same command without --nproc on each rank)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "rlfactory.cli.main", "train", args.config, *args.overrides]
    return cmd + (["--resume"] if args.resume else []) + (["--restart"] if args.restart else [])


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config
    from rlfactory.distributed.fsdp import launched_by_torchrun

    if args.nproc is not None and not launched_by_torchrun():
        if args.nproc < 1:
            print("rlfactory train: --nproc must be >= 1", file=sys.stderr)
            return 2
        from rlfactory.distributed.fsdp import check_config

        check_config(load_run_config(args.config, args.overrides), args.nproc)  # one error, before any rank starts
        return subprocess.call(torchrun_command(args))
    cfg = load_run_config(args.config, args.overrides)
    if launched_by_torchrun():
        return _run_rank(cfg, args.resume, args.restart)
    from rlfactory.train.run import train

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
        with stop_on_sigint_or_sigterm():
            history = asyncio.run(train(cfg, resume=args.resume, open_session=open_session, restart=args.restart))
    except stops as e:
        print(f"rlfactory train: {e}", file=sys.stderr)
        return 2
    _report(history, cfg)
    return 0


@contextlib.contextmanager
def stop_on_sigint_or_sigterm() -> Iterator[None]:
    """A run stops the same way on Ctrl-C (SIGINT) and on SIGTERM (`kill`, a scheduler's preemption,
    the studio's escalation): the main task is cancelled and the last finished step checkpointed
    (train/run.py), where SIGTERM's default would end the process with the step's work unsaved.

    SIGINT gets Python's own handler even when the launcher left it ignored: a job started in the
    background of a script without job control inherits SIGINT ignored, and `kill -INT` or a
    Stop button would never reach the run (the clean-clone test run started that way let a 40-step
    run of the studio's live-chart test train to its end after its SIGINT). asyncio.run, seeing
    Python's handler, turns the first SIGINT into cancelling the run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def _run_rank(cfg, resume: bool, restart: bool = False) -> int:
    """This process is one rank of a torchrun launch: train with the FSDP2 learner."""
    from rlfactory.distributed.fsdp import FsdpLearner, check_config
    from rlfactory.train.run import train

    learner = FsdpLearner(cfg.fsdp)
    finished = False
    try:
        check_config(cfg, learner.world_size)
        history = asyncio.run(train(cfg, resume=resume, parallel=learner, restart=restart))
        finished = True
    except FileExistsError as e:
        if learner.is_main:
            print(f"rlfactory train: {e}", file=sys.stderr)
        return 2
    finally:
        learner.close(synchronize=finished)
    if learner.is_main:
        _report(history, cfg)
    return 0


def _report(history: list, cfg) -> None:
    if history:
        last = history[-1]
        print(f"trained {len(history)} step(s); last reward {last['reward/mean']:.4f}, "
              f"accuracy {last['accuracy']:.3f}; run dir: {cfg.trainer.run_dir}")
    else:
        print(f"nothing to do: {cfg.trainer.run_dir} is already at step {cfg.trainer.steps}")
