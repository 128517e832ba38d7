"""rlfactory/openmp.py: a thread's OpenMP worker pool is freed once its CPU work is done, by the
generator when its batch drains and by weight loads. Each case runs in a fresh process
(tests/openmp_probe.py), where nothing else starts native threads while it counts them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory.openmp import available

pytestmark = pytest.mark.skipif(not available(), reason="torch does not run on libgomp >= 5.0 here")

PROBE = Path(__file__).resolve().parent / "openmp_probe.py"


def probe(scenario: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, str(PROBE), scenario], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_release_frees_the_calling_threads_pool():
    r = probe("thread")
    assert r["with_pool"] == r["base"] + 1  # the thread's one worker, alive while the thread is
    assert r["after"] == r["base"]


def test_generator_releases_its_pool_when_the_batch_drains():
    r = probe("generator")
    assert r["tokens"] > 0
    assert r["after"] == r["base"]  # the generation thread lives on, its pool does not


def test_versioned_update_releases_the_loading_threads_pool():
    r = probe("versioned")
    assert r["version"] == 1 and r["after"] == r["base"]
