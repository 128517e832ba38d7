"""GQA decode attention without repeat_kv (rlfactory/generation/gqa_attention.py): the packed
one-token attention equals transformers' repeat_kv attention, and the local generator's decode
steps (trimmed eager and fixed-shape) run it and give the same greedy tokens and logprobs."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from generation_fakes import prompts, tiny_random_lm
from transformers import AttentionInterface
from transformers.integrations import sdpa_attention
from transformers.integrations.sdpa_attention import repeat_kv

from rlfactory.config import SamplingConfig
from rlfactory.generation import gqa_attention
from rlfactory.generation.decode_graph import StaticDecode
from rlfactory.generation.local import LocalGenerator
from rlfactory.protocols import GenRequest

GREEDY = SamplingConfig(greedy=True)


class _Layer:
    num_key_value_groups = 4


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_packed_attention_equals_repeat_kv_attention(mask_kind):
    g = torch.Generator().manual_seed(0)
    b, hkv, groups, length, d = 3, 2, 4, 11, 8
    q = torch.randn(b, hkv * groups, 1, d, generator=g)
    k, v = torch.randn(b, hkv, length, d, generator=g), torch.randn(b, hkv, length, d, generator=g)
    visible = torch.arange(length)[None, :] <= torch.tensor([3, 10, 0])[:, None]  # rows of different lengths
    mask = {"bool": visible[:, None, None, :], "none": None,
            "additive": torch.zeros(b, 1, 1, length).masked_fill(~visible[:, None, None, :], -1e9)}[mask_kind]
    want = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask,
                                          scale=0.3).transpose(1, 2)
    got, _ = gqa_attention.gqa_sdpa_attention(_Layer(), q, k, v, mask, scaling=0.3)
    assert got.shape == (b, 1, hkv * groups, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_more_than_one_query_token_goes_to_transformers_sdpa(monkeypatch):
    seen = []
    monkeypatch.setattr(gqa_attention, "_ORIGINAL", lambda *a, **kw: seen.append(a[1].shape) or ("orig", None))
    q, k = torch.zeros(1, 8, 5, 4), torch.zeros(1, 2, 5, 4)
    assert gqa_attention.gqa_sdpa_attention(_Layer(), q, k, k, None)[0] == "orig"
    per_head_mask = torch.ones(1, 8, 1, 5, dtype=torch.bool)
    assert gqa_attention.gqa_sdpa_attention(_Layer(), q[:, :, :1], k, k, per_head_mask)[0] == "orig"
    assert gqa_attention.gqa_sdpa_attention(_Layer(), q[:, :, :1], k, k, None, dropout=0.1)[0] == "orig"
    assert len(seen) == 3


def _generate(model, static: bool) -> tuple[list, LocalGenerator]:
    gen = LocalGenerator(model, pad_id=0, device="cpu", max_batch=4)
    if static:  # the fixed-shape step that CUDA graphs record, run eagerly on the CPU
        gen.loop.decode.static = StaticDecode(graphs=False, pad_id=0)
    reqs = [GenRequest(p, max_new_tokens=5 + 3 * i, sampling=GREEDY) for i, p in enumerate(prompts(7))]
    return asyncio.run(gen.generate(reqs)), gen


@pytest.fixture
def transformers_sdpa():
    """transformers' own "sdpa" function, given back after the test (the generator installs ours)."""
    gqa_attention.uninstall()
    original = AttentionInterface._global_mapping["sdpa"]
    yield original
    gqa_attention.uninstall()
    AttentionInterface.register("sdpa", original)


def _as_transformers_5_17(monkeypatch) -> None:
    """transformers' sdpa as on the GPU machine (5.17): K/V copied per query head when a mask is
    passed (this machine's >= 5.23 one-token pack_gqa, skipped while compiling, turned off)."""
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", lambda *a: False)
    if hasattr(sdpa_attention, "pack_gqa"):
        monkeypatch.setattr(sdpa_attention, "is_torchdynamo_compiling", lambda: True)


def _mistral():
    """Sliding-window layers: the generator passes masks built by position (attention_masks.py)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=6)).eval()


@pytest.mark.parametrize("make", [tiny_random_lm, _mistral], ids=["qwen3", "sliding_window"])
@pytest.mark.parametrize("static", [False, True], ids=["eager_step", "fixed_shape_step"])
def test_generator_decodes_gqa_without_repeat_kv_and_same_tokens(monkeypatch, transformers_sdpa, static, make):
    model = make()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    # Today's path, as on the GPU machine: transformers' sdpa with K/V copied per query head.
    _as_transformers_5_17(monkeypatch)
    query_lengths: list[int] = []

    def counted(module, query, *a, **kw):  # transformers' sdpa, recording each call's query tokens
        query_lengths.append(query.shape[2])
        return transformers_sdpa(module, query, *a, **kw)

    AttentionInterface.register("sdpa", counted)
    copies: list[int] = []
    real_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or real_repeat(x, n))
    monkeypatch.setattr(gqa_attention, "install", lambda: None)
    before, gen = _generate(model, static)
    layers = model.config.num_hidden_layers
    assert query_lengths.count(1) == layers * gen.stats["steps"] > 0  # every decode step went there
    assert len(copies) == 2 * len(query_lengths)  # K and V copied in every call
    monkeypatch.undo()
    _as_transformers_5_17(monkeypatch)
    # The hook: building the generator installs the packed attention over whatever "sdpa" was.
    query_lengths.clear()
    packed: list[int] = []
    real_packed = gqa_attention.packed_decode_attention

    def counting_packed(q, *a):
        packed.append(q.shape[0])
        return real_packed(q, *a)

    monkeypatch.setattr(gqa_attention, "packed_decode_attention", counting_packed)
    after, gen = _generate(model, static)
    assert gqa_attention.installed()
    assert len(packed) == layers * gen.stats["steps"], "every decode step's layers ran the packed attention"
    assert 1 not in query_lengths and query_lengths, "only prefills still reach transformers' sdpa"
    if static:
        assert gen.loop.decode.static.stats["static_steps"] == gen.stats["steps"]
        assert set(packed) == {gen.loop.decode.slots.cache.slots}  # every slot, fixed shapes
    for x, y in zip(before, after):
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=0, atol=1e-5)
