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


FRAGMENTS = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    from rlfactory.generation.heap import give_back_freed_memory, keep_freed_memory

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    assert keep_freed_memory()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    blocks = []
    for _ in range(160):  # 160 blocks of 4 MiB with a small live one after each: the heap's top stays in use
        p = libc.malloc(4 << 20)
        libc.memset(p, 1, 4 << 20)
        blocks.append(p)
        pin = libc.malloc(64)
    base = rss()
    for p in blocks:
        libc.free(p)
    freed = rss()
    trim = {trim}
    if trim:
        assert give_back_freed_memory()
    print(base, freed, rss())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
@pytest.mark.parametrize("trim", [False, True])
def test_freed_fragments_stay_until_given_back(trim):
    """Blocks freed in the middle of the heap (a phase's temporaries, with later blocks still live)
    stay resident under keep_freed_memory's thresholds; give_back_freed_memory returns them."""
    out = subprocess.run([sys.executable, "-c", FRAGMENTS.format(trim=trim)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    base, freed, after = map(int, out.stdout.split()[-3:])
    assert freed > base - (64 << 20)  # freeing 640 MiB of fragments gave (almost) nothing back
    if trim:
        assert after < freed - (500 << 20), (freed, after)  # malloc_trim(0) returned their pages
    else:
        assert after > freed - (64 << 20)
