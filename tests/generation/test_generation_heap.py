"""The local generator on the CPU keeps freed temporaries in the heap (generation/heap.py): blocks
under 64 MiB come from the heap instead of being mmap'd afresh (and faulted in page by page) each
time. Checked in a fresh process (the setting is process-wide) with glibc's own accounting: a 48 MiB
block is above the largest mmap threshold glibc's dynamic rule ever picks (32 MiB on 64-bit), so
without the setting it is always mmap'd, whatever the process allocated before; with it, it is not.
(Counting page faults of a torch workload instead depends on the heap's layout and glibc's dynamic
threshold: it varied 8x between runs of the same process.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    sys.path.insert(0, {tests!r})
    from generation_fakes import tiny_random_lm
    from rlfactory.generation.local import LocalGenerator

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):  # glibc < 2.33
        print("no-mallinfo2")
        raise SystemExit(0)

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mmapped_bytes_of_a_48_mib_block():
        before = libc.mallinfo2().hblkhd
        p = libc.malloc(48 << 20)
        during = libc.mallinfo2().hblkhd
        libc.free(p)
        return during - before

    plain = mmapped_bytes_of_a_48_mib_block()
    LocalGenerator(tiny_random_lm(), pad_id=0).close()
    print(plain, mmapped_bytes_of_a_48_mib_block())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap thresholds")
def test_cpu_generator_keeps_freed_temporaries_in_the_heap():
    tests = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.split()[-1] == "no-mallinfo2":
        pytest.skip("glibc without mallinfo2 (< 2.33)")
    plain, kept = map(int, out.stdout.split()[-2:])
    assert plain >= 48 << 20, plain  # glibc's default: a block this size is mmap'd
    assert kept == 0, kept  # after the generator's setting it comes from the heap
