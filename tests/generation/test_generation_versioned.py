"""VersionedGenerator on a real LocalGenerator: a weight update never splits a turn, and every turn
reports the version that produced all of its tokens (asynchronous training's local generator)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from generation_fakes import tiny_random_lm

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.versioned import VersionedGenerator

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [5, 17, 42, 8, 99]


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def test_an_update_waits_for_the_turn_in_flight_and_the_next_turn_is_the_new_version():
    model = tiny_random_lm()
    old = copy.deepcopy(model)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen = LocalGenerator(model, pad_id=0, seed=0)
    versioned = VersionedGenerator(gen, version=3)
    sampling = SamplingConfig(temperature=1.0)

    def load() -> None:
        with torch.no_grad():
            for dst, src in zip(model.parameters(), new.parameters()):
                dst.copy_(src)

    async def scenario():
        long = asyncio.ensure_future(versioned.submit(GenRequest(list(PROMPT), 120, sampling, stop_token_ids=[])))
        while gen.stats["tokens"] == 0:  # the long turn is generating
            await asyncio.sleep(0.001)
        update = asyncio.ensure_future(versioned.update(load, 4))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(versioned.submit(GenRequest(list(PROMPT), 6, sampling, stop_token_ids=[])))
        first = await long
        await update
        return first, await waiting

    first, second = asyncio.run(scenario())
    assert versioned.updates_waited == 1 and versioned.version == 4
    assert first.policy_version == 3 and len(first.token_ids) == 120
    # every token of the long turn was sampled by the old weights, though the update was requested mid-turn
    assert torch.allclose(torch.tensor(first.logprobs), teacher_forced(old, PROMPT, first.token_ids), atol=1e-4)
    # the turn submitted while the update was pending waited for it, and is wholly the new version's
    assert second.policy_version == 4
    assert torch.allclose(torch.tensor(second.logprobs), teacher_forced(new, PROMPT, second.token_ids), atol=1e-4)
    assert not torch.allclose(teacher_forced(old, PROMPT, second.token_ids), teacher_forced(new, PROMPT, second.token_ids))
    gen.close()


def test_an_update_drops_the_kept_caches_computed_by_the_old_weights():
    gen = LocalGenerator(tiny_random_lm(), pad_id=0, seed=0)
    versioned = VersionedGenerator(gen)

    async def scenario():
        await versioned.submit(GenRequest(list(PROMPT), 4, SamplingConfig(greedy=True), stop_token_ids=[], session="t0"))
        kept = gen.kept_sessions
        await versioned.update(lambda: None, 1)
        return kept

    assert asyncio.run(scenario()) == 1 and gen.kept_sessions == 0
    gen.close()



def test_a_turn_woken_by_one_update_waits_for_the_next_update_that_began_before_it_ran():
    """Back-to-back updates from one task (the second closes the gate again before the turns the
    first release woke have run): a waiting turn must not be generated while the second update
    loads its weights; it is generated after it, by the new version."""
    from rlfactory.protocols import GenResult

    class Recorder:
        def __init__(self) -> None:
            self.loading: int | None = None
            """The version whose weights are being loaded (set before its update starts)."""
            self.seen: list[int | None] = []

        async def submit(self, request):
            self.seen.append(self.loading)
            return GenResult([1], [0.0], "stop")

    rec = Recorder()
    versioned = VersionedGenerator(rec, version=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        release_first, first_loading = asyncio.Event(), asyncio.Event()
        release_second, second_loading = asyncio.Event(), asyncio.Event()

        def first_load() -> None:
            loop.call_soon_threadsafe(first_loading.set)
            asyncio.run_coroutine_threadsafe(release_first.wait(), loop).result()
            rec.loading = None

        def second_load() -> None:
            loop.call_soon_threadsafe(second_loading.set)
            asyncio.run_coroutine_threadsafe(release_second.wait(), loop).result()
            rec.loading = None

        async def two_updates() -> None:
            rec.loading = 1
            await versioned.update(first_load, 1)
            rec.loading = 2  # no await between the first update's end and the second's start
            await versioned.update(second_load, 2)

        updates = asyncio.ensure_future(two_updates())
        await first_loading.wait()
        turn = asyncio.ensure_future(versioned.submit(GenRequest(list(PROMPT), 1, SamplingConfig(), stop_token_ids=[])))
        await asyncio.sleep(0)  # the turn waits at the gate
        release_first.set()
        await second_loading.wait()  # woken with the first release, the turn has run by now if it could
        release_second.set()
        await updates
        return await turn

    result = asyncio.run(scenario())
    assert rec.seen == [None] and result.policy_version == 2
