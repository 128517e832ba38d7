"""`rlfactory train` as a function: check the config, open the rollout session, set up the run
directory, build the Trainer (loop.py), restore its checkpoint and run it, keeping run_state.json
(running, stopped, failed, finished) up to date."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from rlfactory.config import RunConfig, dump_config
from rlfactory.envs.base import Env
from rlfactory.run_state import write_run_state
from rlfactory.train.checkpoint import latest_checkpoint
from rlfactory.train.data import pin_threads
from rlfactory.train.loggers import check_trackers, open_trackers
from rlfactory.train.history import RESTART_FLAG, clear_history, start_over_refusal
from rlfactory.train.loop import Trainer
from rlfactory.train.parallel import Parallel, SingleProcess
from rlfactory.train.runlog import RunLog


def check_run_dir(cfg: RunConfig, resume: bool, restart: bool = False) -> tuple[Path, Path | None]:
    """(run_dir, checkpoint to resume). A FileExistsError (one line, history.start_over_refusal)
    when starting over would delete what run_dir has logged and `restart` is off. Writes nothing."""
    run_dir = Path(cfg.trainer.run_dir)
    ckpt = latest_checkpoint(run_dir) if resume else None
    refusal = None if restart else start_over_refusal(run_dir, resume)
    if refusal is not None:
        raise FileExistsError(refusal)
    return run_dir, ckpt


def write_run_config(cfg: RunConfig, run_dir: Path) -> None:
    """Create run_dir and write the resolved config.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")


def load_env_data(env: Env, split: str) -> list[dict]:
    try:
        return list(env.load_split(split))
    except (NotImplementedError, KeyError, FileNotFoundError, ValueError):
        if split == "train":
            raise
        return []


async def train(cfg: RunConfig, resume: bool = False, open_session: Any = None,
                parallel: Parallel | None = None, restart: bool = False) -> list[dict[str, float]]:
    """`rlfactory train`: run (or continue) the configured training; returns the new steps' metrics.

    The env, tools, reward and data are checked (rlfactory/train/prepare.py) before the run
    directory is written to. `open_session(cfg, **checks)` opens the rollout session (default:
    rlfactory.train.session.open_rollout, everything in this process; `rlfactory train` passes
    rlfactory.distributed.open_ray_rollout for `trainer.backend: ray`). `parallel`: this process's
    rank of the FSDP learner under torchrun (every rank calls this; rank 0 writes the run
    directory's files); default one process.

    Nothing logged is deleted unless `restart` (`--restart`): without a checkpoint to continue
    from, a run directory with logs is refused (history.py). With `resume` and `restart` it
    continues from the last checkpoint when there is one, else starts over. A stop (Ctrl-C,
    SIGINT) writes the checkpoint of the last finished step, whatever trainer.save_every says."""
    from rlfactory.train.session import open_rollout
    from rlfactory.train.prepare import command_checks

    parallel = parallel if parallel is not None else SingleProcess()
    pin_threads()
    # env.name agent: a user's agent through the recording gateway (rlfactory/train/gateway_agents.py)
    if open_session is None and cfg.env.name in ("agent", "rlfactory.train.gateway_agents:AgentEnv"):
        from rlfactory.train.gateway_agents import open_agent_rollout as open_session
    if open_session is None and cfg.trainer.backend != "local":
        raise ValueError(f"trainer.backend {cfg.trainer.backend!r} needs its session opener "
                         "(rlfactory train passes rlfactory.distributed.open_ray_rollout)")
    run_dir, ckpt = check_run_dir(cfg, resume, restart)
    main = parallel.is_main
    if main:  # a tracker that cannot start is one line now, before the model loads
        check_trackers(cfg.trainer.loggers, cfg.trainer.tracker)
    checks = command_checks("train", cfg)  # what the studio's config check runs too
    async with (open_session or open_rollout)(cfg, reward_mode=checks.reward_mode, check_splits=checks.check_splits) as session:
        env, reward = session.env, session.reward
        train_rows = load_env_data(env, "train")
        test_rows = load_env_data(env, "test") if cfg.trainer.eval_every else None
        if main:
            if ckpt is None and restart:
                cleared = clear_history(run_dir)
                if not cleared.empty:
                    print(f"rlfactory train: {RESTART_FLAG}: deleted {cleared.describe()} of {run_dir}; starting from step 0",
                          file=sys.stderr)
            write_run_config(cfg, run_dir)
        trainer = Trainer(cfg, session, reward, train_rows, test_rows, parallel=parallel)
        if ckpt is not None:
            trainer.restore(ckpt)
        log = RunLog(run_dir, resume_step=trainer.progress.step_done if ckpt is not None else None,
                     tensorboard="tensorboard" in cfg.trainer.loggers,
                     trackers=open_trackers(cfg.trainer.loggers, cfg.trainer.tracker, run_dir,
                                            cfg.model_dump(mode="json"), resume=ckpt is not None)) if main else None
        outcome = "finished"
        state = write_run_state if main else (lambda *args: None)
        state(run_dir, "running")
        try:
            history = await trainer.run(log)
        except (KeyboardInterrupt, asyncio.CancelledError):
            outcome = "stopped"
            saved = _checkpoint_on_stop(trainer, parallel)
            state(run_dir, "stopped", f"interrupted at step {trainer.progress.step_done} of {cfg.trainer.steps}; {saved}")
            if main:
                print(f"rlfactory train: stopped at step {trainer.progress.step_done} of {cfg.trainer.steps}; {saved}", file=sys.stderr)
            raise
        except BaseException as e:
            outcome = "failed"
            state(run_dir, "failed", f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            if log is not None:
                log.close(outcome)
        done = trainer.progress.step_done >= cfg.trainer.steps
        state(run_dir, "finished" if done else "stopped", f"step {trainer.progress.step_done} of {cfg.trainer.steps}")
        return history


def _checkpoint_on_stop(trainer: Trainer, parallel: Parallel) -> str:
    """Write the checkpoint of the last finished step on a stop (so `--resume` continues there and
    nothing logged is cut); one phrase saying what was done."""
    if trainer.progress.step_done == 0:
        return "no step finished"
    if parallel.world_size > 1:  # a collective save while ranks stop at different places could hang
        return "no checkpoint written on a stop under torchrun (the last one is trainer.save_every's)"
    path = trainer.save_finished_step()
    if path is None:
        return "no checkpoint written: the stop came during an update"
    return f"checkpoint {path} (continue with --resume)"
