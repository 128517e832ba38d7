"""A run directory's history is never deleted unless asked: Ctrl-C (SIGINT) writes the checkpoint
of the last finished step whatever trainer.save_every says, and `rlfactory train` without a
checkpoint to continue from refuses a directory with logs (one line saying what would go) unless
given --restart. Real `rlfactory train` processes on tiny:1m."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfactory.cli.main import main
from rlfactory.run_state import read_run_state
from rlfactory.train.checkpoint import list_checkpoints
from rlfactory.train.history import logged_history, start_over_refusal
from rlfactory.train.runlog import read_metrics
from train_fixtures import run_config

HERE = Path(__file__).parent


def _fake_history(run: Path, steps: int) -> None:
    """What a run killed before its first checkpoint leaves: logs, no checkpoint."""
    (run / "trajectories").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(1, steps + 1)))
    for s in range(1, steps + 1):
        (run / "trajectories" / f"step_{s:06d}.jsonl").write_text("{}\n")


def test_logged_history_counts_and_describes(tmp_path):
    assert logged_history(tmp_path).empty and start_over_refusal(tmp_path, resume=True) is None
    _fake_history(tmp_path, 3)
    h = logged_history(tmp_path)
    assert (h.steps, h.evaluations, h.trajectory_files, h.checkpoints) == (3, 0, 3, 0)
    assert h.describe() == "3 logged steps (metrics.jsonl) and 3 trajectory files"
    line = start_over_refusal(tmp_path, resume=True)
    assert "no checkpoint to resume from" in line and "3 logged steps" in line and "--restart" in line
    assert "\n" not in line


def test_resume_without_a_checkpoint_refuses_and_deletes_nothing(tmp_path, capsys):
    cfg = run_config(tmp_path, trainer={"steps": 1, "save_every": 0})
    run = tmp_path / "run"
    _fake_history(run, 3)
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "no checkpoint to resume from" in err and "would delete its 3 logged steps (metrics.jsonl) and 3 trajectory files" in err
    assert "--restart" in err
    assert (run / "metrics.jsonl").read_text() == before and len(list((run / "trajectories").iterdir())) == 3
    assert main(["train", cfg]) == 2  # nor without --resume
    assert "--restart to delete them" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == before

    assert main(["train", cfg, "--resume", "--restart"]) == 0  # asked to start over
    assert "--restart: deleted 3 logged steps" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]


def test_restart_deletes_the_old_checkpoints_so_a_later_resume_cannot_pick_them(tmp_path, capsys):
    cfg = run_config(tmp_path, trainer={"steps": 2, "save_every": 1})
    assert main(["train", cfg]) == 0
    run = tmp_path / "run"
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]
    assert main(["train", cfg, "trainer.steps=1"]) == 2
    assert "pass --resume to continue, pass --restart" in capsys.readouterr().err
    assert main(["train", cfg, "trainer.steps=1", "--restart"]) == 0
    assert [s for s, _ in list_checkpoints(run)] == [1]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]


def train_until_two_steps(cfg: str, run: Path, preexec) -> subprocess.Popen:
    """A real `rlfactory train` process of `cfg` (into `run`), once it has logged two steps."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "train", cfg], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    deadline = time.monotonic() + 180
    while len(read_metrics(run / "metrics.jsonl")) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    return proc


def as_in_a_terminal() -> None:
    # A test suite started in the background of a shell without job control (as a CI runner may
    # start it) inherits SIGINT *ignored*, and so would the child: the Ctrl-C below would never
    # reach it. A terminal's foreground process has the default disposition; give it that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_writes_a_checkpoint_whatever_save_every_says_and_resume_keeps_the_history(tmp_path, capsys):
    cfg = run_config(tmp_path, trainer={"steps": 200, "save_every": 0})
    run = tmp_path / "run"
    proc = train_until_two_steps(cfg, run, as_in_a_terminal)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C and the studio's Stop send
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    logged = read_metrics(run / "metrics.jsonl")
    steps = [r["step"] for r in logged]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2
    ((saved, _),) = list_checkpoints(run)
    assert saved == steps[-1], err  # the last finished step, although save_every is 0
    assert f"stopped at step {saved} of 200; checkpoint" in err

    capsys.readouterr()
    assert main(["train", cfg, f"trainer.steps={saved + 1}", "--resume"]) == 0
    assert "trained 1 step(s)" in capsys.readouterr().out
    after = read_metrics(run / "metrics.jsonl")
    assert after[:len(logged)] == logged and after[-1]["step"] == saved + 1  # nothing logged was lost
    assert len(list((run / "trajectories").glob("step_*.jsonl"))) == saved + 1


def as_a_background_job_of_a_script() -> None:
    # `rlfactory train ... &` in a script without job control: SIGINT inherited ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["kill_-INT", "kill"])
def test_a_run_started_in_the_background_stops_on_sigint_or_sigterm_with_its_checkpoint(tmp_path, sig):
    """SIGINT reaches a run whose launcher left it ignored (the studio's Stop, `kill -INT`), and
    SIGTERM (`kill`, a scheduler's preemption) stops it as Ctrl-C does: the last finished step
    checkpointed, the run's state "stopped", not the default's end with the step's work unsaved."""
    cfg = run_config(tmp_path, trainer={"steps": 200, "save_every": 0})
    run = tmp_path / "run"
    proc = train_until_two_steps(cfg, run, as_a_background_job_of_a_script)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)  # a stop takes a step at most; the 200 steps take far longer
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{sig.name} did not stop the run: it went on training") from None
    assert proc.returncode == 130, err[-2000:]
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    ((saved, _),) = list_checkpoints(run)
    assert saved == steps[-1] < 200 and f"stopped at step {saved} of 200; checkpoint" in err
    assert read_run_state(run)["state"] == "stopped"
