"""The New run page's deep check: what `rlfactory COMMAND` checks before it loads a model (the env
built, tools imported and MCP servers started, the reward the command needs, the data rows),
run by the command's own function (rlfactory.train.prepare.check_command) in a subprocess set
up as a launch is (jobs.py: same working folder, the config's folder importable), so that "valid"
means the command will get past its checks.

    python -m rlfactory.studio.preflight COMMAND CONFIG.yaml    # prints {"ok": ..., "error": ...}

One check runs at a time: a newer one ends the one before (its process group, MCP servers too).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from rlfactory.studio.configs import ConfigIssue
from rlfactory.tools.process import kill_group

CHECK_TIMEOUT_S = 120.0
_KEY = re.compile(r"^([A-Za-z_][\w.\[\]]*):\s")


def command_env(base_dir: Path | None) -> dict[str, str]:
    """The environment a studio-started command runs with: unbuffered output, and the config's
    folder importable (`module:function` names in the config import from there)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if base_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(base_dir), env.get("PYTHONPATH", "")) if p)
    return env


def issue_of(error: str) -> ConfigIssue:
    """A command's one-line error as an issue keyed by the config key it starts with."""
    m = _KEY.match(error)
    return ConfigIssue(m.group(1) if m else "(command check)", error[m.end():] if m else error)


class Preflight:
    def __init__(self, folder: Path, workspace: Path) -> None:
        self.folder = folder
        self.workspace = workspace
        self._lock = threading.Lock()
        self._current: subprocess.Popen | None = None

    def check(self, command: str, config_text: str, base_dir: Path | None) -> list[ConfigIssue]:
        """The issues `rlfactory COMMAND` would stop on (empty: it would load the model and go on)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{uuid.uuid4().hex[:12]}.yaml"
        path.write_text(config_text, encoding="utf-8")
        try:
            proc = subprocess.Popen([sys.executable, "-m", "rlfactory.studio.preflight", command, str(path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                    cwd=self.workspace, env=command_env(base_dir), start_new_session=True)
            with self._lock:
                before, self._current = self._current, proc
            if before is not None:
                _end(before)
            try:
                out, err = proc.communicate(timeout=CHECK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _end(proc)
                return [ConfigIssue("(command check)", f"the check of rlfactory {command} took over {CHECK_TIMEOUT_S:.0f} s")]
            finally:
                with self._lock:
                    if self._current is proc:
                        self._current = None
        finally:
            path.unlink(missing_ok=True)
        if proc.returncode < 0:  # ended by a newer check: its answer is not wanted
            return [ConfigIssue("(command check)", "superseded by a newer check")]
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = " | ".join(err.strip().splitlines()[-3:])
            return [ConfigIssue("(command check)", f"the check ended (exit {proc.returncode}): {tail}")]
        return [] if answer.get("ok") else [issue_of(str(answer.get("error", "")))]


def _end(proc: subprocess.Popen) -> None:
    kill_group(proc)


def main(argv: list[str]) -> int:
    import asyncio

    from rlfactory.config import ConfigError, load_config
    from rlfactory.train.prepare import check_command, command_checks
    from rlfactory.config import RunConfig

    command, path = argv
    try:
        cfg = load_config(RunConfig, path)
        asyncio.run(check_command(cfg, command_checks(command, cfg)))
        answer = {"ok": True}
    except (ConfigError, FileNotFoundError, ValueError) as e:  # the command's one line (a ValueError: its traceback's last)
        answer = {"ok": False, "error": " | ".join(ln.strip() for ln in str(e).strip().splitlines()) or type(e).__name__}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
