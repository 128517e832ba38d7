"""Envs registered by installed packages (entry points `rlfactory.envs`) and `rlfactory envs list`.

The package is installed the way pip leaves one: a module plus a `.dist-info` folder with
METADATA and entry_points.txt on the path, found by importlib.metadata in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = '''
"""Envs of a package of a user's."""
from rlfactory.envs import Env


class CountEnv(Env):
    """Count to n with a tool."""

    name = "count"

    def __init__(self, n: int = 3, label: str = "x", max_turns: int = 2):
        self.n, self.label, self.max_turns = n, label, max_turns

    def reset(self, row):
        return [{"role": "user", "content": f"count to {self.n} ({self.label})"}]
'''


def _install(site: Path, entry_points: str) -> None:
    (site / "count_envs").mkdir(parents=True)
    (site / "count_envs" / "__init__.py").write_text(PACKAGE)
    info = site / "count_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: count-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def _run(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


def test_an_installed_package_registers_its_envs_and_envs_list_shows_them(tmp_path):
    _install(tmp_path, "[rlfactory.envs]\ncount = count_envs:CountEnv\nbroken = count_envs.missing:Nope\n")
    made = _run(tmp_path, "-c", "from rlfactory.envs import make_env, registered_envs\n"
                               "env = make_env('count', n=5)\n"
                               "print(env.reset({})[0]['content'], env.max_turns, 'count' in registered_envs())")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "count to 5 (x) 2 True"

    listed = _run(tmp_path, "-m", "rlfactory.cli.main", "envs", "list")
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout
    assert "count  [installed (count-envs)]  count_envs:CountEnv" in out
    assert "    Count to n with a tool." in out and "    options: n=3, label='x', max_turns=2" in out
    assert "search  [built-in]  rlfactory.envs.search.env:SearchEnv" in out  # built-in ones too
    assert "broken  [installed (count-envs)]  count_envs.missing:Nope\n    cannot be imported:" in out
    assert listed.stderr.strip() == "rlfactory envs: 1 env(s) cannot be imported: broken"

    as_json = _run(tmp_path, "-m", "rlfactory.cli.main", "envs", "list", "--json")
    entries = {e["name"]: e for e in json.loads(as_json.stdout)}
    assert entries["count"]["options"][0] == {"name": "n", "default": "3", "annotation": "int"}
    assert entries["search"]["source"] == "built-in" and entries["broken"]["error"]

    # a broken installed env named in a config is one line naming the entry point and the package
    bad = _run(tmp_path, "-c", "from rlfactory.envs import make_env\nmake_env('broken')")
    assert "env.name: the installed env 'broken' -> count_envs.missing:Nope (package count-envs) cannot be imported: " \
           "ModuleNotFoundError" in bad.stderr.strip().splitlines()[-1]
