"""The local generator on the CPU keeps freed temporaries in the heap (generation/heap.py): a
decode step's few-MB allocations stop faulting in fresh pages. Measured in a fresh process (the
setting is process-wide) by its minor page faults."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import resource, sys
    import torch
    sys.path.insert(0, {tests!r})
    from generation_fakes import tiny_random_lm
    from rlfactory.generation.local import LocalGenerator

    def faults():  # minor page faults while 30 temporaries of 2 x 4 MiB come and go, as in sampling
        x = torch.rand(512, 2048)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(30):
            x.double().cumsum(-1)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    plain = faults()
    LocalGenerator(tiny_random_lm(), pad_id=0).close()
    print(plain, faults())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap thresholds")
def test_cpu_generator_keeps_freed_temporaries_in_the_heap():
    tests = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    plain, kept = map(int, out.stdout.split()[-2:])
    # Without it each 4 MiB block is mmap'd afresh (1024 faults of 4 KiB pages each, per block);
    # with it, only the first pass grows the heap.
    assert plain > 30 * 1024, plain
    assert kept < plain / 10, (plain, kept)
