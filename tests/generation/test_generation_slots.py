"""How the decode cache is sized: a batch that fills in waves fits without growing (generation/slots.py)."""

from __future__ import annotations

import asyncio

from generation_fakes import prompts, reference, tiny_random_lm

from rlfactory.config import SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.rows import Row
from rlfactory.protocols import GenRequest

GREEDY = SamplingConfig(temperature=0.0)


def rows(loop: asyncio.AbstractEventLoop, ps: list[list[int]], n: int) -> list[Row]:
    return [Row(GenRequest(p, max_new_tokens=n, sampling=GREEDY), loop.create_future(), frozenset(), (), 0.0) for p in ps]


def test_a_batch_that_arrives_in_waves_fits_the_first_cache():
    """20 rows, then 10 more while they decode: the cache made for the first wave (32 slots, the
    power of two) holds the second without growing (it grew from 20 to 40 before, copying every
    slot while the batch waited); what each row generates is unchanged."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0, max_batch=64)
    loop = asyncio.new_event_loop()
    ps = prompts(30)
    first, second = rows(loop, ps[:20], 6), rows(loop, ps[20:], 6)
    done = gen.loop.step(first)
    assert gen.loop.cache.slots == 32
    done += gen.loop.step(second)
    while gen.loop.live:
        done += gen.loop.step([])
    assert gen.stats["cache_grows"] == 0 and gen.loop.cache.slots == 32
    for row in first + second:
        assert row.tokens == reference(model, row.req.prompt_ids, 6)
    loop.close()


def test_the_cache_never_has_more_slots_than_the_batch_can_hold():
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0, max_batch=20)
    loop = asyncio.new_event_loop()
    gen.loop.step(rows(loop, prompts(20), 2))
    assert gen.loop.cache.slots == 20
    loop.close()


def test_on_the_cpu_no_decode_step_runs_a_free_slot():
    """A free slot costs a decode step as much as a live row on the CPU (its attention reads as many
    columns), so a finished row's slot is filled at once by the last row (before: only once a quarter
    of the slots were free). Every step runs exactly its live rows; the tokens are unchanged."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    loop = asyncio.new_event_loop()
    ps = prompts(6)
    batch = [Row(GenRequest(p, max_new_tokens=n, sampling=GREEDY), loop.create_future(), frozenset(), (), 0.0)
             for p, n in zip(ps, (2, 9, 4, 9, 9, 9))]
    gen.loop.step(batch)
    run = []
    while gen.loop.live:
        run.append((len(gen.loop.slots.rows), gen.loop.live))
        gen.loop.step([])
    assert all(slots == live for slots, live in run), run
    assert gen.stats["moved_rows"] > 0
    for row in batch:
        assert row.tokens == reference(model, row.req.prompt_ids, row.req.max_new_tokens)
    loop.close()
