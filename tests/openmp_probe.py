"""Scenarios for the OpenMP pool tests (tests/test_openmp.py, tests/train/test_train_async.py), each
run in a fresh process: it counts this process's OpenMP worker threads (`pool_threads`) before and
after, which only a process that starts no other native threads meanwhile can do.

    python tests/openmp_probe.py SCENARIO    prints {"base": n, "after": n, ...} as JSON

A thread leaves /proc/self/task a little after it ends: a Python thread after `join()` returns (which
waits for its Python state only), a freed pool's workers after `release_pool()` returns (libgomp lets
them `pthread_exit` on their own). So a count made right after either can still see them, the more
so on busy cores; the probe waits for those exits (`gone`, `settled`) before it counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rlfactory.openmp import release_pool

HERE = Path(__file__).resolve().parent


def tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def pool_threads() -> int:
    """OS threads of this process that Python's threading module does not know, counted from /proc:
    libgomp's workers, plus what a library started natively (hence a fresh process)."""
    known = {t.native_id for t in threading.enumerate()}
    return len(tids() - known)


def _until(cond, within: float) -> bool:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def gone(t: threading.Thread, before: set[int]) -> None:
    """Join t, then wait until it and every thread started since `before` (its pool's workers, which
    libgomp frees when the thread exits) have left /proc."""
    t.join()
    if not _until(lambda: tids() <= before, 30):
        raise RuntimeError(f"threads {sorted(tids() - before)} still there 30 s after their thread ended")


def settled(want: int) -> int:
    """pool_threads() once it is `want`, or after 10 s if it never gets there: what a count right
    after a pool is freed would be, were the freed workers' exits instant."""
    _until(lambda: pool_threads() == want, 10)
    return pool_threads()


def parallel_op() -> None:
    """An op big enough for torch to run a parallel region (2 threads) in the calling thread."""
    torch.set_num_threads(2)
    torch.ones(4_000_000).mul_(2)


def in_live_thread(fn) -> tuple[threading.Thread, threading.Event]:
    """Run fn in a thread that stays alive (as the generator's and the learner's do) until the
    caller sets the returned event."""
    done, hold = threading.Event(), threading.Event()

    def run():
        fn()
        done.set()
        hold.wait(60)

    t = threading.Thread(target=run)
    t.start()
    done.wait(60)
    return t, hold


def counted(fn, want: int | None = None) -> int:
    """The count while fn's thread lives on (`settled(want)` if given), taken once every earlier
    thread has gone; fn's thread is gone too when it returns."""
    before = tids()
    t, hold = in_live_thread(fn)
    n = pool_threads() if want is None else settled(want)
    hold.set()
    gone(t, before)
    return n


def thread() -> dict[str, int]:
    base = pool_threads()
    return {"base": base, "with_pool": counted(parallel_op),
            "after": counted(lambda: (parallel_op(), release_pool()), want=base)}


def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfactory.tiny import resolve_model

    path = resolve_model("tiny:1m")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def generator() -> dict[str, int]:
    from rlfactory.protocols import GenRequest
    from rlfactory.generation.local import LocalGenerator

    model, tok = tiny()
    gen = LocalGenerator(model, tok.pad_token_id, stop_token_ids=[tok.eos_token_id], seed=0)
    gen.threads = 2
    prompt = tok("hello there").input_ids * 40  # (the tokenizer's first call starts its own threads)
    try:
        base = pool_threads()
        results = asyncio.run(gen.generate([GenRequest(prompt_ids=prompt, max_new_tokens=4)]))
        return {"base": base, "after": settled(base), "tokens": len(results[0].token_ids)}  # its thread lives on
    finally:
        gen.close()


def versioned() -> dict[str, int]:
    from rlfactory.generation.local import LocalGenerator
    from rlfactory.generation.versioned import VersionedGenerator

    model, tok = tiny()
    gen = VersionedGenerator(LocalGenerator(model, tok.pad_token_id, seed=0), 0)

    async def go():
        base = pool_threads()
        await gen.update(parallel_op, 1)  # in a reused worker thread
        return {"base": base, "after": settled(base), "version": gen.version}

    return asyncio.run(go())


def update(k: int) -> dict[str, int]:
    """A training step's update in the event loop's thread (k = 0) or the learner's (k = 1)."""
    sys.path.insert(0, str(HERE / "train"))
    from test_train_async import _trainer
    from train_fixtures import make_traj

    from rlfactory.train.async_pipeline import learner_thread

    trajs = [make_traj([("prompt", [1, 2]), ("model", [3, 4])], f"g{i // 2}", f"t{i}", -0.5) for i in range(4)]
    trainer = _trainer(Path(tempfile.mkdtemp()), trajs, max_staleness=k)
    learn = trainer.learner.learn

    def learn_in_parallel(*args):
        torch.ones(4_000_000).mul_(2)  # a parallel region in the training thread, whatever the model's size
        return learn(*args)

    trainer.learner.learn = learn_in_parallel

    async def go():
        torch.set_num_threads(2)
        release_pool()
        base = pool_threads()
        rollout = await trainer.steps.roll_out(1, sync_weights=False)
        with ThreadPoolExecutor(1, initializer=learner_thread, initargs=(2,)) as learner:
            metrics, _ = await trainer.steps.learn(1, rollout, executor=learner if k else None)
            return {"base": base, "after": settled(base), "version": trainer.progress.version,  # the learner's thread alive
                    "kept": int(metrics["batch/kept"])}

    return asyncio.run(go())


def main() -> None:
    # torch.set_num_threads(2) starts a process-wide pthreadpool thread (QNNPACK's) the first time,
    # in whichever thread calls it: make it before any count, so that counts differ by OpenMP pools.
    t = threading.Thread(target=torch.set_num_threads, args=(2,))
    t.start()
    t.join()
    if not _until(lambda: t.native_id not in tids(), 30):  # (not `gone`: the pthreadpool thread stays)
        raise RuntimeError(f"thread {t.native_id} still there 30 s after it ended")
    scenario = sys.argv[1]
    out = {"thread": thread, "generator": generator, "versioned": versioned,
           "update0": lambda: update(0), "update1": lambda: update(1)}[scenario]()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
