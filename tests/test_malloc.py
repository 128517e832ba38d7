"""rlfactory/malloc.py: with keep_freed_memory, memory a step frees is reused by the next without
page faults; with glibc's defaults a large block is faulted in again every time."""

import subprocess
import sys

import pytest

from rlfactory.malloc import _mallopt

pytestmark = pytest.mark.skipif(_mallopt() is None, reason="not glibc")

SCRIPT = """
import resource, sys, torch
from rlfactory.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() and keep_freed_memory()
def step():  # a 'training step': 128 MiB of blocks made and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(2**25); y = x * 2; del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(" ".join(str(step()) for _ in range(10)))
"""


def faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, timeout=120)
    return [int(x) for x in out.stdout.split()]


def test_kept_memory_is_reused_without_page_faults():
    pages = 2 * 2**27 // 4096  # both blocks, 4 KiB pages
    default, kept = faults("default"), faults("keep")
    assert all(f >= pages // 2 for f in default[-5:]), default  # mmapped and unmapped every time
    assert all(f < pages // 100 for f in kept[-5:]), kept  # once the heap has grown, reused

