"""VersionedGenerator on a real LocalGenerator: a weight update never splits a turn, and every turn
reports the version that produced all of its tokens (asynchronous training's local generator)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from rollout_fakes import one_torch_thread, tiny_random_lm

from rlfactory.rollout.config import SamplingConfig
from rlfactory.rollout.generator import GenRequest
from rlfactory.rollout.local import LocalGenerator
from rlfactory.rollout.versioned import VersionedGenerator

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)
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
