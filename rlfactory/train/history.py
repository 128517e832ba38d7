"""What a run directory has logged, and the one rule that guards it: nothing logged is deleted
unless the user asked to start over (`rlfactory train --restart`).

`rlfactory train` (with or without `--resume`) and the studio's Launch and Resume ask
`start_over_refusal` before they act, so the command line and the UI refuse with the same line.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rlfactory.train.checkpoint import checkpoint_dir, latest_checkpoint, list_checkpoints

RESTART_FLAG = "--restart"
"""The flag of `rlfactory train` that deletes a run directory's logs and checkpoints and starts
over (as `overwrite_output_dir` does for a Hugging Face Trainer's output folder)."""


@dataclass
class LoggedHistory:
    """What starting a run over in its directory would delete."""

    steps: int
    """Records in metrics.jsonl."""
    evaluations: int
    """Records in eval.jsonl."""
    trajectory_files: int
    checkpoints: int

    @property
    def empty(self) -> bool:
        return not (self.steps or self.evaluations or self.trajectory_files or self.checkpoints)

    def describe(self) -> str:
        """e.g. "3 logged steps (metrics.jsonl), 3 trajectory files and 1 checkpoint"."""
        parts = []
        for n, one, many in ((self.steps, "logged step (metrics.jsonl)", "logged steps (metrics.jsonl)"),
                             (self.evaluations, "evaluation (eval.jsonl)", "evaluations (eval.jsonl)"),
                             (self.trajectory_files, "trajectory file", "trajectory files"),
                             (self.checkpoints, "checkpoint", "checkpoints")):
            if n:
                parts.append(f"{n} {one if n == 1 else many}")
        if not parts:
            return "nothing"
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _records(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def logged_history(run_dir: str | Path) -> LoggedHistory:
    """Count what `run_dir` holds of a run's history (reads line counts and folder listings only)."""
    run_dir = Path(run_dir)
    traj = run_dir / "trajectories"
    return LoggedHistory(
        steps=_records(run_dir / "metrics.jsonl"), evaluations=_records(run_dir / "eval.jsonl"),
        trajectory_files=len(list(traj.glob("step_*.jsonl"))) if traj.is_dir() else 0,
        checkpoints=len(list_checkpoints(run_dir)),
    )


def start_over_refusal(run_dir: str | Path, resume: bool) -> str | None:
    """The one line that refuses to start `run_dir` over (None when nothing would be lost, or
    when `resume` finds a checkpoint to continue from). `resume`: the user asked to continue."""
    run_dir = Path(run_dir)
    if resume and latest_checkpoint(run_dir) is not None:
        return None
    history = logged_history(run_dir)
    if history.empty:
        return None
    if resume:
        return (f"{run_dir} has no checkpoint to resume from; starting over would delete its {history.describe()}: "
                f"pass {RESTART_FLAG} to start over anyway, or pick another trainer.run_dir")
    again = "pass --resume to continue, " if history.checkpoints else ""
    return (f"{run_dir} already holds {history.describe()}: {again}pass {RESTART_FLAG} to delete them and start over, "
            "or pick another trainer.run_dir")


def clear_history(run_dir: str | Path) -> LoggedHistory:
    """Delete what `logged_history` counts (logs, trajectories, checkpoints, TensorBoard events):
    `--restart`. Returns what was there."""
    run_dir = Path(run_dir)
    history = logged_history(run_dir)
    for name in ("metrics.jsonl", "eval.jsonl"):
        (run_dir / name).unlink(missing_ok=True)
    traj = run_dir / "trajectories"
    for p in traj.glob("step_*.jsonl") if traj.is_dir() else []:
        p.unlink()
    for folder in (checkpoint_dir(run_dir), run_dir / "tensorboard"):
        if folder.is_dir():
            shutil.rmtree(folder)
    return history
