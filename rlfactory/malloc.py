"""Keeping freed memory in the process (glibc malloc), so that each training step on CPU reuses the
pages of the last one instead of faulting fresh ones in.

torch allocates CPU tensors with malloc. glibc serves a block above its mmap threshold (128 KiB,
raised up to 32 MiB as blocks are freed) with a fresh mmap and returns it to the kernel on free,
and gives the top of its heaps back once more than the trim threshold is free there. A training
step allocates gigabytes of activations and gradients and frees them at the end, so the next step
touches all of those pages again: a minor page fault each, plus zeroing, and in a VM often a
fault in the host too. Measured here (benchmarks/async_train.py's update of 16 trajectories of
~560 tokens, tiny:10m, 2 cores): 0.5-1.4 million faults per step; with freed memory kept the
same update ran in 6.7 s instead of 9.4 s.

`keep_freed_memory()` sets M_MMAP_MAX to 0 (every block from a heap, none mmapped) and
M_TRIM_THRESHOLD to -1 (heaps never shrink; both as documented in mallopt(3)): the process then stays at its peak
size, which a training loop of same-sized steps reaches every step anyway. That is what PyTorch's
CUDA caching allocator does for GPU memory, and what Intel's PyTorch CPU tuning guide gets from
jemalloc or tcmalloc. It is process-wide and cannot be undone cleanly, so the trainer calls it only
for a CPU policy and only with trainer.keep_cpu_memory (default on). A no-op outside glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


@functools.lru_cache(maxsize=1)
def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    fn = getattr(libc, "mallopt", None)
    if fn is None or getattr(libc, "gnu_get_libc_version", None) is None:  # musl has no tunable mallopt
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


_kept = False


def keep_freed_memory() -> bool:
    """Make malloc keep freed memory in the process from now on (see the module doc). Returns True
    if it is in effect (glibc); idempotent."""
    global _kept
    fn = _mallopt()
    if fn is None:
        return False
    if not _kept:
        _kept = bool(fn(M_MMAP_MAX, 0)) and bool(fn(M_TRIM_THRESHOLD, -1))
    return _kept
