"""Launching and stopping rlfactory's own commands from the studio.

A job is one `python -m rlfactory.cli.main {train|sft|eval} CONFIG ...` subprocess. Before
anything starts, the config is validated exactly as the command line does (configs.check_config,
then `load_config` on the file written); the run's output folder is forced inside the runs folder
(`<runs>/<name>`). The job's record, its config and its output live in `<runs>/.studio/jobs/<id>/`.

Stop = SIGINT to the command (what Ctrl-C does); it shuts its tool servers down itself. The
studio then checks that every process the command had started is gone; stragglers get SIGTERM,
then SIGKILL, and the record says so. Jobs run in their own session, so they keep running when
the studio stops; a restarted studio finds them again from their records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlfactory.studio.configs import ConfigIssue, check_config, resolved_yaml
from rlfactory.studio.paths import BadPath, safe_name
from rlfactory.studio.preflight import Preflight, command_env
from rlfactory.tools import process
from rlfactory.train.history import RESTART_FLAG, start_over_refusal

COMMANDS = ("train", "sft", "eval")
STOP_WAIT_S = 60.0
INTERRUPTED = (130, -signal.SIGINT)


@dataclass
class Job:
    id: str
    command: str
    argv: list[str]
    run_id: str
    run_dir: str
    log_path: str
    started: float
    pid: int | None = None
    pid_start: int | None = None
    state: str = "running"  # running | finished | failed | stopped
    reason: str = ""
    returncode: int | None = None
    ended: float | None = None
    stop: dict[str, Any] = field(default_factory=dict)
    base_dir: str | None = None
    """The folder the config's module:function names import from (the source config's); a resume keeps it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LaunchRefused(ValueError):
    """The launch was refused before anything started; `issues` say why, by key."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        super().__init__("; ".join(f"{i.key}: {i.message}" for i in issues))
        self.issues = issues


class NeedsConfirmation(ValueError):
    """Acting would delete a run's history: the message says what (the command line's own words)."""


class JobManager:
    def __init__(self, runs: Path, workspace: Path) -> None:
        self.runs = runs.resolve()
        self.workspace = workspace.resolve()
        self.folder = self.runs / ".studio" / "jobs"
        self.jobs: dict[str, Job] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self.preflight = Preflight(self.runs / ".studio" / "checks", self.workspace)
        self._load()

    # ---- records ------------------------------------------------------------------------------

    def _load(self) -> None:
        for rec in sorted(self.folder.glob("*/job.json")) if self.folder.is_dir() else []:
            try:
                job = Job(**json.loads(rec.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            if job.state == "running" and not (job.pid and process.alive(job.pid, job.pid_start)):
                self._ended_elsewhere(job)
            self.jobs[job.id] = job

    def _save(self, job: Job) -> None:
        folder = self.folder / job.id
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "job.json.tmp"
        tmp.write_text(json.dumps(job.to_json(), indent=1))
        os.replace(tmp, folder / "job.json")

    def _ended_elsewhere(self, job: Job) -> None:
        """A job that ended while no studio watched it: judge from its output."""
        tail = log_tail(Path(job.log_path), 4000)
        job.ended = job.ended or time.time()
        if "rlfactory: interrupted" in tail:
            job.state, job.reason = "stopped", "interrupted"
        elif "Traceback" in tail or "error" in tail.lower():
            job.state, job.reason = "failed", _last_line(tail)
        else:
            job.state, job.reason = "finished", _last_line(tail)
        self._save(job)

    def list(self) -> list[Job]:
        with self._lock:
            return sorted(self.jobs.values(), key=lambda j: j.started, reverse=True)

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job {job_id!r}")
        if job.state == "running" and job.id not in self._procs and not process.alive(job.pid or -1, job.pid_start):
            self._ended_elsewhere(job)
        return job

    def latest_for(self, run_path: Path) -> Job | None:
        key = str(run_path.resolve())
        for job in self.list():
            if job.run_dir == key:
                return self.get(job.id)
        return None

    # ---- launch -------------------------------------------------------------------------------

    def launch(self, command: str, text: str, overrides: list[str], base_dir: Path | None, name: str,
               model: str | None = None, limit: int | None = None) -> Job:
        """Validate, then start `rlfactory COMMAND` on the config; LaunchRefused names the keys."""
        if command not in COMMANDS:
            raise LaunchRefused([ConfigIssue("command", f"{command!r} is not one of {', '.join(COMMANDS)}")])
        try:
            name = safe_name(name, "run name")
        except BadPath as e:
            raise LaunchRefused([ConfigIssue("run name", str(e))]) from None
        out_dir = self.runs / name
        if out_dir.exists() and any(out_dir.iterdir()):  # a run's logs are never overwritten from here
            raise LaunchRefused([ConfigIssue("run name", f"{name} already exists in the runs folder: pick another run name"
                                             + (", or resume that run from its page" if command == "train" else ""))])
        placed = {"train": [f"trainer.run_dir={out_dir}"], "sft": [f"sft.out={out_dir}"], "eval": []}[command]
        checked = check_config(text, [*overrides, *placed], base_dir)
        if not checked.ok:
            raise LaunchRefused(checked.issues)
        extra: list[str] = []
        if command == "eval":
            extra = self._eval_args(model, limit, out_dir)
        return self._start(command, resolved_yaml(checked.config), extra, out_dir, base_dir)

    def _eval_args(self, model: str | None, limit: int | None, out_dir: Path) -> list[str]:
        model = (model or "").strip()
        if not model:
            raise LaunchRefused([ConfigIssue("--model", "eval needs a model: a checkpoint's model folder or tiny:1m")])
        if not model.startswith("tiny:"):
            p = Path(model) if Path(model).is_absolute() else self.workspace / model
            p = p.resolve()
            if not p.is_dir() or not (p.is_relative_to(self.runs) or p.is_relative_to(self.workspace)):
                raise LaunchRefused([ConfigIssue("--model", f"{model}: not a model folder under the runs or work folder")])
            model = str(p)
        args = ["--model", model, "--out", str(out_dir / "eval.json")]
        if limit:
            args += ["--limit", str(int(limit))]
        return args

    def resume(self, run_path: Path, restart: bool = False) -> Job:
        """`rlfactory train <run>/config.yaml --resume` (plus `--restart` when `restart`).
        Without a checkpoint to continue from and with logs that starting over would delete,
        NeedsConfirmation carries the command's own refusal until asked with `restart`."""
        cfg = run_path / "config.yaml"
        if not cfg.is_file():
            raise LaunchRefused([ConfigIssue("run", f"{run_path.name} has no config.yaml to resume from")])
        current = self.latest_for(run_path)
        if current is not None and current.state == "running":
            raise LaunchRefused([ConfigIssue("run", f"{run_path.name} is already running (job {current.id})")])
        refusal = None if restart else start_over_refusal(run_path, resume=True)
        if refusal is not None:
            raise NeedsConfirmation(refusal)
        checked = check_config(cfg.read_text(encoding="utf-8"), [f"trainer.run_dir={run_path}"], run_path)
        if not checked.ok:
            raise LaunchRefused(checked.issues)
        # the tools and env of a run launched here import from its source config's folder, as they did then
        base = Path(current.base_dir) if current is not None and current.base_dir else None
        return self._start("train", resolved_yaml(checked.config), ["--resume", *([RESTART_FLAG] if restart else [])],
                           run_path, base)

    def _start(self, command: str, config_text: str, extra: list[str], out_dir: Path, base_dir: Path | None) -> Job:
        from rlfactory.config import ConfigError, load_config
        from rlfactory.config import RunConfig

        job_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        folder = self.folder / job_id
        folder.mkdir(parents=True)
        cfg_path = folder / "config.yaml"
        cfg_path.write_text(config_text, encoding="utf-8")
        try:
            load_config(RunConfig, cfg_path)  # the file the command will read passes its own check
        except ConfigError as e:
            raise LaunchRefused([ConfigIssue("config", str(e))]) from None
        argv = [sys.executable, "-m", "rlfactory.cli.main", command, str(cfg_path), *extra]
        env = command_env(base_dir)  # module:function names in the config import from its folder
        # The run's folder and config exist from the launch on: a command that fails before it
        # writes anything is still a run on the Runs page, with its job's error (train rewrites it).
        out_dir.mkdir(parents=True, exist_ok=True)
        if not (out_dir / "config.yaml").exists():
            (out_dir / "config.yaml").write_text(config_text, encoding="utf-8")
        log_path = folder / "output.log"
        job = Job(id=job_id, command=command, argv=argv[2:], run_id=out_dir.relative_to(self.runs).as_posix(),
                  run_dir=str(out_dir.resolve()), log_path=str(log_path), started=time.time(),
                  base_dir=str(base_dir) if base_dir is not None else None)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.workspace, env=env, start_new_session=True)
        job.pid, job.pid_start = proc.pid, process.start_time(proc.pid)
        with self._lock:
            self.jobs[job_id] = job
            self._procs[job_id] = proc
        self._save(job)
        threading.Thread(target=self._watch, args=(job, proc), daemon=True, name=f"studio-job-{job_id}").start()
        return job

    def _watch(self, job: Job, proc: subprocess.Popen) -> None:
        rc = proc.wait()
        with self._lock:
            job.returncode, job.ended = rc, time.time()
            if rc == 0:
                job.state, job.reason = "finished", "exit 0"
            elif rc in INTERRUPTED or job.stop:
                job.state, job.reason = "stopped", f"interrupted (exit {rc})"
            else:
                job.state, job.reason = "failed", f"exit {rc}: {_last_line(log_tail(Path(job.log_path), 4000))}"
            self._procs.pop(job.id, None)
        self._save(job)

    # ---- stop ---------------------------------------------------------------------------------

    def stop(self, job_id: str, wait_s: float = STOP_WAIT_S) -> Job:
        """SIGINT the command, wait for it, then make sure nothing it started is left."""
        job = self.get(job_id)
        if job.state != "running" or job.pid is None:
            return job
        tree = process.descendants(job.pid)
        job.stop = {"signal": "SIGINT", "requested": time.time(), "processes": len(tree) + 1}
        self._save(job)
        process.signal_each([job.pid], signal.SIGINT)
        deadline = time.monotonic() + wait_s
        while process.alive(job.pid, job.pid_start) and time.monotonic() < deadline:
            time.sleep(0.1)
        escalated = []
        if process.alive(job.pid, job.pid_start):
            tree.append((job.pid, job.pid_start or 0))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = [(p, s) for p, s in tree if process.alive(p, s)]
            if not left:
                break
            process.signal_each([p for p, _ in left], sig)
            escalated.append({"signal": sig.name, "pids": [p for p, _ in left]})
            end = time.monotonic() + 5
            while any(process.alive(p, s) for p, s in left) and time.monotonic() < end:
                time.sleep(0.1)
        proc = self._procs.get(job.id)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        job.stop.update(escalated=escalated, survivors=[p for p, s in tree if process.alive(p, s)], done=time.time())
        if job.id not in self._procs and job.state == "running":
            job.state, job.reason = "stopped", "interrupted"
        self._save(job)
        return job

    def stop_all(self) -> None:
        for job in self.list():
            if job.state == "running" and job.id in self._procs:
                self.stop(job.id)


def log_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a log, as text."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_log(path: Path, offset: int, max_bytes: int = 1 << 20) -> tuple[str, int]:
    """Log text from byte `offset` on (complete lines only), and the new offset. Progress bars'
    carriage returns count as line ends."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max_bytes)
    except OSError:
        return "", offset
    cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
    if cut < 0:
        return "", offset
    return data[: cut + 1].decode("utf-8", errors="replace"), offset + cut + 1


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
