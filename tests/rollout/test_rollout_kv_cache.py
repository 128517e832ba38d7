"""The slot cache of the running batch: rows are placed, taken and moved exactly, the buffers
grow (slots and columns) without losing anything, and a long observation on top of a kept cache
(a later turn) still decodes exactly like a fresh prefill."""

import asyncio

import pytest
import torch
from rollout_fakes import one_torch_thread, tiny_random_lm

from rlfactory.rollout.config import SamplingConfig
from rlfactory.rollout.generator import GenRequest
from rlfactory.rollout.kv_cache import SlotCache
from rlfactory.rollout.local import LocalGenerator

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


def row(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)) for _ in range(3)]


def test_place_take_move_and_grow():
    a, b = row(5, 0), row(9, 1)
    cache = SlotCache(a, slots=2, columns=10)
    cache.place(0, a)
    cache.place(1, b)
    cache.reserve(slots=5, columns=40)  # grows both dimensions, keeps the contents
    assert (cache.slots, cache.columns) == (5, 40)
    cache.place(4, a)
    for got, want in zip(cache.take(1, 9), b):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    cache.move(1, 3, 9)
    for got, want in zip(cache.take(3, 9), b):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for got, want in zip(cache.take(4, 5), a):
        assert torch.equal(got[0], want[0])


def test_long_observation_on_a_kept_cache_decodes_like_a_fresh_prefill():
    model = tiny_random_lm()
    greedy = SamplingConfig(greedy=True)
    prompt = [(5 * j) % 250 + 1 for j in range(12)]
    gen = LocalGenerator(model, pad_id=0)

    async def turns():
        first = await gen.submit(GenRequest(prompt, max_new_tokens=4, sampling=greedy, session="s"))
        observation = [(7 * j) % 250 + 1 for j in range(300)]  # far past any spare room
        context = prompt + first.token_ids + observation
        second = await gen.submit(GenRequest(context, max_new_tokens=5, sampling=greedy, session="s"))
        return context, second

    context, second = asyncio.run(turns())
    assert gen.stats["reused_tokens"] == len(prompt) + 3
    fresh = model.generate(torch.tensor([context]), max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert second.token_ids == fresh[0, len(context):].tolist()


@pytest.mark.parametrize("in_slots", [True, False], ids=["prefill_in_slots", "prefill_padded"])
def test_both_prefills_decode_like_generate_across_turns(in_slots):
    """The prefill in the decode cache (sdpa/eager: masks by position) and the padded prefill in a
    cache of its own (kernels that take only padding masks, e.g. flash) give `generate`'s tokens,
    with rows of different lengths in one prefill, on kept caches (a second turn) and shared prefixes."""
    model = tiny_random_lm()
    greedy = SamplingConfig(greedy=True)
    gen = LocalGenerator(model, pad_id=0)
    if not in_slots:
        gen.loop.position_plan = lambda: None
    shared = [(3 * j) % 250 + 1 for j in range(20)]  # >= min_shared_prefix: computed once
    prompts = [shared + [(11 * i + j) % 250 + 1 for j in range(1 + 4 * i)] for i in range(4)]

    async def two_turns():
        first = await gen.generate([GenRequest(p, max_new_tokens=3 + i, sampling=greedy, session=f"s{i}")
                                    for i, p in enumerate(prompts)])
        contexts = [p + r.token_ids + [(5 * i + j) % 250 + 1 for j in range(2 + 7 * i)]
                    for i, (p, r) in enumerate(zip(prompts, first))]
        second = await gen.generate([GenRequest(c, max_new_tokens=4, sampling=greedy, session=f"s{i}")
                                     for i, c in enumerate(contexts)])
        return first, contexts, second

    first, contexts, second = asyncio.run(two_turns())
    assert gen.stats["shared_prefix_tokens"] > 0 and gen.stats["reused_tokens"] > 0
    for i, (p, r) in enumerate(zip(prompts, first)):
        want = model.generate(torch.tensor([p]), max_new_tokens=3 + i, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert r.token_ids == want[0, len(p):].tolist()
    for c, r in zip(contexts, second):
        want = model.generate(torch.tensor([c]), max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert r.token_ids == want[0, len(c):].tolist()
