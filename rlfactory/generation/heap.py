"""Keeping freed memory in the process heap while the local generator runs on the CPU.

A decode step or prefill on the CPU allocates and frees dozens of temporaries of a few MB each
(the [B, V] logits and their float64 cumulative sums in sampling, attention and MLP activations,
the copies of a row's kept cache). glibc serves such blocks with mmap and returns them to the
kernel with munmap when freed (or trims the top of the heap once more than M_TRIM_THRESHOLD is
free there), so each allocation touches fresh pages, and every page is a minor page fault and a
zeroing by the kernel. Its dynamic threshold (raised to the size of the largest block freed so
far, up to 32 MiB) does not stop it: two freed 2 MiB blocks at the top of the heap pass the trim
threshold it sets beside it, and are trimmed. Measured on the 2-core CPU (tiny:1m, 1 torch thread,
load ~7): `probs.double().cumsum(-1)` for [128, 2048] 8.5 ms -> 1.5 ms; a decode step of 128 rows
-10%; a prefill of 108 rows on kept caches -15 to -35%.

So `keep_freed_memory()` fixes the thresholds: blocks under 64 MiB come from the heap and go back
to it when freed, and the heap's top is given back only past 512 MiB free. The decode cache's
buffers (hundreds of MB) stay mmap'd, so `LocalGenerator.free_cache` still returns them to the
kernel. Process-wide and glibc only: a no-op (returning False) elsewhere.

The price is that a freed block in the middle of the heap stays in the process until the heap's top
is trimmed: a long process that runs phases of very different shapes one after another (an
evaluation, then SFT, then another evaluation, as `rlfactory experiment` and `rlfactory demo` do)
keeps each phase's freed temporaries as fragments the next phase's blocks do not fit. The BFCL
experiment (SmolLM2-135M, 100 prompts of ~600 tokens) was OOM-killed at 23 GiB entering its second
evaluation, which run alone peaks at about 9.4 GiB. `give_back_freed_memory()` between such phases
returns the free pages of the whole heap to the kernel (glibc's `malloc_trim(0)`, after a garbage collection).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20
"""Blocks under this size come from the heap (freed ones are reused)."""
TRIM_THRESHOLD = 512 << 20
"""Free memory at the top of the heap beyond this goes back to the kernel."""

log = logging.getLogger("rlfactory.generation")


@functools.lru_cache(maxsize=1)
def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (whose mallopt parameters and malloc_trim we use)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (both must exist)
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        log.debug("no mallopt in %s: the heap thresholds stay the allocator's", name)
        return None
    if not hasattr(libc, "gnu_get_libc_version"):  # another libc's mallopt may take other parameters
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); True when they were set."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def give_back_freed_memory() -> bool:
    """Collect garbage, then return every free page of the heap to the kernel (between a long
    process's phases); True when glibc's malloc_trim ran."""
    gc.collect()
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
