"""The slot cache of the running batch: rows are placed, taken and moved exactly, the buffers
grow (slots and columns) without losing anything, and a long observation on top of a kept cache
(a later turn) still decodes exactly like a fresh prefill."""

import asyncio
import inspect

import pytest
import torch
from generation_fakes import tiny_random_lm
from transformers import Qwen3ForCausalLM

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.kv_cache import SlotCache, cache_kwarg
from rlfactory.generation.local import LocalGenerator

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_a_step_over_consecutive_slots_writes_and_reads_as_one_over_their_indices():
    """A prefill's rows seated in consecutive slots are given as a slice (read back as a view of the
    buffers, not an index_select copy): same writes, same keys and values returned."""
    caches = []
    for rows in (torch.tensor([2, 3, 4]), slice(2, 5)):
        cache = SlotCache(row(6, 0), slots=6, columns=16)
        for s in range(6):
            cache.place(s, row(6, s))
        cols = torch.tensor([[6, 7], [6, 7], [3, 4]])  # each row writes its own 2 columns
        cache.begin_step(cols, rows=rows)
        k_in = torch.randn(3, 2, 2, 4, generator=torch.Generator().manual_seed(7))
        v_in = torch.randn(3, 2, 2, 4, generator=torch.Generator().manual_seed(8))
        out = [cache.update(k_in, v_in, layer) for layer in range(3)]
        caches.append((cache, out))
    (by_index, out_i), (by_slice, out_s) = caches
    for (ki, vi), (ks, vs) in zip(out_i, out_s):
        assert ks.shape == (3, 2, 8, 4) and torch.equal(ki, ks) and torch.equal(vi, vs)
    assert out_s[0][0]._base is not None  # a view of the buffers
    for s in range(6):
        for a, b in zip(by_index.take(s, 8), by_slice.take(s, 8)):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


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


@pytest.mark.filterwarnings("error:.*past_key_values:FutureWarning")  # transformers >= 5.24 calls it `cache`
@pytest.mark.parametrize("in_slots", [True, False], ids=["prefill_in_slots", "prefill_padded"])
def test_both_prefills_decode_like_generate_across_turns(in_slots):
    """The prefill in the decode cache (sdpa/eager: masks by position) and the padded prefill in a
    cache of its own (kernels that take only padding masks, e.g. flash) give `generate`'s tokens,
    with rows of different lengths in one prefill, on kept caches (a second turn) and shared prefixes."""
    model = tiny_random_lm()
    greedy = SamplingConfig(greedy=True)
    gen = LocalGenerator(model, pad_id=0)
    if not in_slots:
        gen.loop.forward.position_plan = lambda: None
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


def _greedy_reference(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_the_decode_cache_is_kept_between_worker_sessions_until_freed_or_the_model_changes():
    """A drained batch keeps the cache's buffers (a rollout's batch drains whenever every trajectory
    waits for a tool; reallocating then meant page faults and regrowing copies); a new model gets
    new buffers; `free_cache` frees them at once when idle, else when the running session ends."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = tiny_random_lm()
    greedy = SamplingConfig(greedy=True)
    gen = LocalGenerator(model, pad_id=0)
    prompts = [[(3 * i + j) % 250 + 1 for j in range(5 + 3 * i)] for i in range(3)]
    reqs = [GenRequest(p, max_new_tokens=6, sampling=greedy) for p in prompts]
    first = asyncio.run(gen.generate(reqs))
    cache = gen.loop.cache
    assert cache is not None and gen.loop.live == 0  # the session ended, the buffers stayed
    second = asyncio.run(gen.generate(reqs))
    assert gen.loop.cache is cache  # reused, not reallocated
    for p, a, b in zip(prompts, first, second):
        assert a.token_ids == b.token_ids == _greedy_reference(model, p, 6)

    torch.manual_seed(1)  # another model with other cache shapes
    other = Qwen3ForCausalLM(Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=1, head_dim=8)).eval()
    gen.model = other
    third = asyncio.run(gen.generate(reqs))
    assert gen.loop.cache is not cache and len(gen.loop.cache.layers) == 3
    for p, r in zip(prompts, third):
        assert r.token_ids == _greedy_reference(other, p, 6)

    gen.free_cache()  # idle: at once
    assert gen.loop.cache is None

    async def free_while_generating():
        started = asyncio.Event()
        loop = asyncio.get_running_loop()

        def note(requests, generated, logits):
            loop.call_soon_threadsafe(started.set)
            return logits

        gen.logits_processor = note
        task = asyncio.ensure_future(gen.generate(reqs))
        await started.wait()
        gen.free_cache()  # a session is running: freed when it ends, not under it
        assert gen.loop.cache is not None
        return await task

    fourth = asyncio.run(free_while_generating())
    assert gen.loop.cache is None
    assert [r.token_ids for r in fourth] == [r.token_ids for r in third]


NEW_NAME = "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


class OldCacheName(Qwen3ForCausalLM):
    """A forward that knows the cache only as `past_key_values` (transformers before 5.24, remote
    code) and, as many do, ignores keyword arguments it does not know."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0, **ignored):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=use_cache, logits_to_keep=logits_to_keep, **{NEW_NAME: past_key_values})


def test_the_cache_goes_by_the_name_the_models_forward_takes():
    from peft import LoraConfig, get_peft_model

    new = tiny_random_lm()
    old = OldCacheName(new.config).eval()
    old.load_state_dict(new.state_dict())
    c = object()
    assert cache_kwarg(old, c) == {"past_key_values": c} and cache_kwarg(new, c) == {NEW_NAME: c}
    lora = get_peft_model(OldCacheName(new.config), LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_kwarg(lora, c) == {"past_key_values": c}  # peft's forward(*args, **kwargs): its base's name

    greedy = SamplingConfig(greedy=True)
    prompt = [(3 * j) % 250 + 1 for j in range(9)]

    def two_turns(model):
        gen = LocalGenerator(model, pad_id=0)

        async def go():
            first = await gen.submit(GenRequest(prompt, max_new_tokens=5, sampling=greedy, session="s"))
            context = prompt + first.token_ids + [7, 8, 9]
            second = await gen.submit(GenRequest(context, max_new_tokens=5, sampling=greedy, session="s"))
            return first.token_ids, context, second.token_ids

        return asyncio.run(go())

    first, context, second = two_turns(old)  # decoded on its cache, not on each step's new token alone
    assert first == _greedy_reference(new, prompt, 5) and second == _greedy_reference(new, context, 5)
    assert two_turns(new) == (first, context, second)
