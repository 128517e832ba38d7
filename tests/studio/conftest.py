"""Fixtures for the studio tests: a real `rlfactory ui` server process, a real tiny training run,
and headless Chromium (Debian's `chromium`, driven by Playwright with its own browser download
skipped). Browser tests skip, saying why, only when Chromium or Playwright is not installed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "studio-test-token-0123456789"
CALC = ROOT / "examples" / "rollout_calculator.yaml"
SMALL_CALC = ["reward.terms={numeric: 1.0, format: 0.1}", "algo.group_size=2", "trainer.prompts_per_step=2",
              "rollout.max_new_tokens=12", "rollout.max_total_tokens=700", "trainer.progress=false",
              "trainer.save_every=0", "sampling.seed=0"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Studio:
    url: str  # base URL, no token
    runs: Path
    proc: subprocess.Popen

    def api(self, path: str, **kw):
        import httpx

        return httpx.request(kw.pop("method", "GET"), self.url + path, headers={"X-Studio-Token": TOKEN}, timeout=60, **kw)


def start_studio(runs: Path) -> Studio:
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "ui", "--runs", str(runs), "--port", "0",
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"open (http://\S+)/\?token=", line)
        if m:
            return Studio(m.group(1), runs, proc)
    raise RuntimeError("rlfactory ui did not start: " + "".join(lines))


def stop_studio(studio: Studio) -> None:
    studio.proc.send_signal(signal.SIGINT)
    try:
        studio.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        studio.proc.kill()
        studio.proc.wait()


def train(run_dir: Path, *extra: str, wait: bool = True) -> subprocess.Popen:
    """`rlfactory train` of the calculator example on tiny:1m into `run_dir`."""
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "train", str(CALC), *SMALL_CALC,
                             f"trainer.run_dir={run_dir}", *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(CALC.parent)))
    if wait:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    return proc


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("studio-runs")


@pytest.fixture(scope="session")
def trained_run(runs_root) -> Path:
    """A finished 2-step run (real training on tiny:1m) in the shared runs folder."""
    run = runs_root / "calc"
    train(run, "trainer.steps=2")
    return run


@pytest.fixture(scope="session")
def studio(runs_root) -> Studio:
    s = start_studio(runs_root)
    yield s
    stop_studio(s)


@pytest.fixture(scope="module")  # Playwright's sync API holds an event loop: let it go with the module
def browser():
    exe = chromium_path()
    if exe is None:
        pytest.skip("Chromium is not installed (scripts/setup.sh installs Debian's chromium when run as root)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser, studio):
    """A logged-in page (the token given once in the URL, then kept as a cookie)."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(f"{studio.url}/?token={TOKEN}")
    pg.wait_for_selector("#runs-table, #app .panel")
    pg.studio = studio  # type: ignore[attr-defined]
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
