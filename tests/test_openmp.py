"""rlfactory/openmp.py: a thread's OpenMP worker pool is freed once its CPU work is done, by the
generator when its batch drains, by weight loads and by the trainer's updates."""

import asyncio
import threading

import pytest
import torch

from rlfactory.openmp import available, pool_threads, release_pool

pytestmark = pytest.mark.skipif(not available(), reason="torch does not run on libgomp >= 5.0 here")


@pytest.fixture(autouse=True)
def threads_made():
    """torch.set_num_threads(2) starts a process-wide pthreadpool thread (QNNPACK's) the first
    time: make it before any count, so that counts differ by OpenMP pools only."""
    t = threading.Thread(target=torch.set_num_threads, args=(2,))
    t.start()
    t.join()


def parallel_op() -> None:
    """An op big enough for torch to run a parallel region (2 threads) in the calling thread."""
    torch.set_num_threads(2)
    torch.ones(4_000_000).mul_(2)


def in_thread(fn) -> None:
    """Run fn in a thread that stays alive (as the generator's and the learner's do) until the
    caller has counted the pools."""
    done, hold = threading.Event(), threading.Event()

    def run():
        fn()
        done.set()
        hold.wait(30)

    t = threading.Thread(target=run)
    t.start()
    done.wait(30)
    return t, hold


def test_release_frees_the_calling_threads_pool():
    base = pool_threads()
    t, hold = in_thread(parallel_op)
    with_pool = pool_threads()
    hold.set()
    t.join()
    t, hold = in_thread(lambda: (parallel_op(), release_pool()))
    released = pool_threads()
    hold.set()
    t.join()
    assert with_pool == base + 1  # the thread's one worker, alive while the thread is
    assert released == base


def test_generator_releases_its_pool_when_the_batch_drains(tiny):
    from rlfactory.rollout.generator import GenRequest
    from rlfactory.rollout.local import LocalGenerator

    model, tok = tiny
    gen = LocalGenerator(model, tok.pad_token_id, stop_token_ids=[tok.eos_token_id], seed=0)
    gen.threads = 2
    try:
        prompt = tok("hello there").input_ids * 40  # (the tokenizer's first call starts its own threads)
        base = pool_threads()
        asyncio.run(gen.generate([GenRequest(prompt_ids=prompt, max_new_tokens=4)]))
        after = pool_threads()
        assert after == base  # the generation thread lives on, its pool does not
    finally:
        gen.close()


def test_versioned_update_releases_the_loading_threads_pool(tiny):
    from rlfactory.rollout.local import LocalGenerator
    from rlfactory.rollout.versioned import VersionedGenerator

    model, tok = tiny
    gen = VersionedGenerator(LocalGenerator(model, tok.pad_token_id, seed=0), 0)

    async def go():
        base = pool_threads()
        await gen.update(parallel_op, 1)
        return base, pool_threads()

    base, after = asyncio.run(go())
    assert gen.version == 1
    assert after == base
