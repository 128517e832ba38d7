"""Fixed-shape decode steps (what a CUDA graph records, decode_graph.py), run eagerly on the CPU:
every slot and every cache column each step, masks built inside the step. They give the tokens of
one-at-a-time `model.generate` and the logprobs of the trimmed eager steps, with rows joining,
leaving, moving, keeping caches and outgrowing the cache; sliding-window models included. The
graph itself (CUDA only) is compared with the eager steps in test_generation_gpu.py."""

from __future__ import annotations

import asyncio

import pytest
import torch
from generation_fakes import prompts, reference, tiny_random_lm

from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.generation.decode_graph import StaticDecode, static_mask_plan
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.sampling import RowSampling, sample

GREEDY = SamplingConfig(greedy=True)
pytestmark = pytest.mark.usefixtures("one_thread")


def static_generator(model, **kw) -> LocalGenerator:
    """A CPU generator whose decode steps take the fixed-shape path (without a graph)."""
    gen = LocalGenerator(model, pad_id=0, **kw)
    assert gen.loop.decode.static is None  # off on the CPU by default
    gen.loop.decode.static = StaticDecode(graphs=False, pad_id=0)
    return gen


def mistral(window: int = 6):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=window)).eval()


@pytest.mark.parametrize("make", [tiny_random_lm, mistral], ids=["full_attention", "sliding_window"])
def test_fixed_shape_steps_match_generate_and_the_eager_steps(make):
    """Rows join as others finish (max_batch < requests), finish at different lengths (slots are
    freed and moved down) and the last ones outgrow the cache's columns (it grows mid-run)."""
    model = make()
    ps = prompts(9)
    reqs = [GenRequest(p, max_new_tokens=4 + (5 * i) % 13 + (90 if i >= 7 else 0), sampling=GREEDY)
            for i, p in enumerate(ps)]
    gen = static_generator(model, max_batch=4)
    fixed = asyncio.run(gen.generate(reqs))
    eager = asyncio.run(LocalGenerator(model, pad_id=0, max_batch=4).generate(reqs))
    st = gen.loop.decode.static.stats
    assert st["static_steps"] == gen.stats["steps"] > 0 and st["graph_captures"] == 0
    assert gen.stats["prefills"] > 1 and gen.stats["moved_rows"] > 0
    for p, req, a, b in zip(ps, reqs, fixed, eager):
        assert a.token_ids == b.token_ids == reference(model, p, req.max_new_tokens)
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_fixed_shape_steps_sample_what_the_eager_steps_sample():
    """Seeded sampling with top-k/top-p and a greedy row in the batch: the same draws either way."""
    model = tiny_random_lm()
    mixed = [SamplingConfig(temperature=0.8, top_k=30, top_p=0.9), GREEDY, SamplingConfig(temperature=1.2)]
    reqs = [GenRequest(p, max_new_tokens=10 + i, sampling=mixed[i % 3]) for i, p in enumerate(prompts(7))]
    fixed = asyncio.run(static_generator(model, max_batch=5, seed=3).generate(reqs))
    eager = asyncio.run(LocalGenerator(model, pad_id=0, max_batch=5, seed=3).generate(reqs))
    for a, b in zip(fixed, eager):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_fixed_shape_steps_with_kept_caches_and_a_shared_prefix():
    model = tiny_random_lm()
    system = [(3 * j) % 250 + 1 for j in range(24)]
    ps = [system + t for t in ([7], [8, 9, 10], [11, 12], [13] * 6)]

    async def two_turns(gen):
        first = await gen.generate([GenRequest(p, max_new_tokens=5, sampling=GREEDY, session=f"s{i}")
                                    for i, p in enumerate(ps)])
        contexts = [p + r.token_ids + [200 + i, 201] for i, (p, r) in enumerate(zip(ps, first))]
        second = await gen.generate([GenRequest(c, max_new_tokens=6, sampling=GREEDY, session=f"s{i}")
                                     for i, c in enumerate(contexts)])
        return first, contexts, second

    gen = static_generator(model)
    first, contexts, second = asyncio.run(two_turns(gen))
    assert gen.stats["shared_prefix_tokens"] > 0 and gen.stats["reused_tokens"] > 0
    for p, r in zip(ps, first):
        assert r.token_ids == reference(model, p, 5)
    for c, r in zip(contexts, second):
        assert r.token_ids == reference(model, c, 6)


def test_fixed_shapes_need_a_kernel_that_takes_4d_masks():
    model = tiny_random_lm()
    plan = static_mask_plan(model, None)
    assert plan is not None and not plan.additive  # sdpa: boolean masks
    model.config._attn_implementation = "eager"
    assert static_mask_plan(model, None).additive
    model.config._attn_implementation = "flash_attention_2"
    assert static_mask_plan(model, None) is None  # such a model decodes with the trimmed eager steps
    model.config._attn_implementation = "sdpa"


def test_cuda_graphs_knob_defaults_on_and_is_ignored_on_the_cpu():
    assert RolloutConfig().cuda_graphs is True and RolloutConfig(cuda_graphs=False).cuda_graphs is False
    assert LocalGenerator(tiny_random_lm(), pad_id=0, cuda_graphs=True).loop.decode.static is None
    assert "graph_replays" not in LocalGenerator(tiny_random_lm(), pad_id=0).stats


def test_host_side_sampling_flags_change_nothing():
    """RowSampling.of records on the host what `sample` would otherwise read back from the device."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    settings = [SamplingConfig(temperature=0.7, top_k=5), GREEDY, SamplingConfig(), SamplingConfig(top_p=0.5)]
    rows = RowSampling.of(settings)
    assert rows.flags == (False, True, True)
    bare = RowSampling(rows.temperature, rows.top_k, rows.top_p, rows.greedy)
    a = sample(logits, rows, torch.Generator().manual_seed(1))
    b = sample(logits, bare, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
