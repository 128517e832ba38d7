"""Releasing a thread's OpenMP worker pool when its CPU work is done.

torch's CPU kernels run their parallel regions on libgomp, which gives every thread that starts one
a pool of worker threads that lives as long as that thread. Once the pools of the process hold more
threads than there are cores, libgomp throttles every barrier in the process: a waiting thread spins
100 iterations instead of 300,000 before it sleeps on a futex (`do_spin`: gomp_managed_threads >
gomp_available_cpus). A decode step is hundreds of small parallel regions, so each then pays futex
sleeps and wake-ups. rlfactory computes in several threads in turn (the generator's, the learner's,
the event loop's, weight copies), so with pools left behind by the idle ones, generation is throttled
although it runs alone: on 2 cores, a rollout of the tiny model took 4.1 s, and 6.5 s once the event
loop's thread had run one parallel op (6.6 s with GOMP_SPINCOUNT=100, the throttled count, forced).

So a thread that finishes a phase of CPU work (a generation session, an update, a weight copy)
calls `release_pool()`, which frees its pool (OpenMP 5.0 `omp_pause_resource_all(omp_pause_soft)`);
the next parallel region it starts makes a new one (one pthread_create per worker). Threads that
run at the same time (asynchronous training: generator and learner) still throttle each other, as
they should: they share the cores.

A no-op where torch does not run on libgomp (macOS, Intel OpenMP builds) or libgomp predates 5.0.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable, TypeVar

OMP_PAUSE_SOFT = 1
T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def _pause() -> Callable[[int], int] | None:
    """libgomp's omp_pause_resource_all, from the copy this process loaded (torch bundles its own)."""
    import torch  # noqa: F401  (loads libgomp, if torch uses it, before the lookup is cached)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith("libgomp"):
            fn = getattr(ctypes.CDLL(path), "omp_pause_resource_all", None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                return fn
    return None


def available() -> bool:
    """True when `release_pool` can free pools here (torch runs on libgomp 5.0 or later)."""
    return _pause() is not None


def release_pool() -> bool:
    """Free the calling thread's OpenMP worker pool, if it has one; returns True if it could ask.
    Call it outside any parallel region, once the thread's CPU work is done for a while."""
    fn = _pause()
    return fn is not None and fn(OMP_PAUSE_SOFT) == 0


def released(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, then `release_pool()` in this thread (also when fn raises): for a phase of CPU
    work in a thread that lives on, e.g. an executor's."""
    try:
        return fn(*args)
    finally:
        release_pool()
