"""Shared-prefix decode attention (rlfactory/generation/shared_prefix.py): the prefix block read once
for all rows holding it gives the one-pass attention's outputs, and the local generator's decode
steps that use it give the greedy tokens of `model.generate` and the logprobs of a full forward,
the same as with it off: rows with and without the prefix, rows that finish and are replaced, kept
sessions, a block cut for later rows, weights changed between rollouts, a sliding-window model."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from generation_fakes import reference, tiny_random_lm
from transformers.integrations.sdpa_attention import repeat_kv

from rlfactory.config import SamplingConfig
from rlfactory.generation.forward import Forward
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.rows import Row
from rlfactory.generation.shared_prefix import SharedPrefix, prefix_decode_attention
from rlfactory.protocols import GenRequest

GREEDY = SamplingConfig(greedy=True)
SYSTEM = [(3 * j) % 250 + 1 for j in range(40)]  # the prefix every trajectory starts with
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_prefix_read_once_equals_one_pass_attention(groups, mask_kind):
    """Rows 0-3 hold the prefix (their first P columns are the block's); rows 4 and 5 do not (row 5
    is shorter than the prefix: nothing after it is visible)."""
    g = torch.Generator().manual_seed(0)
    b, hkv, p, width, d = 6, 2, 7, 12, 8
    k, v = torch.randn(b, hkv, width, d, generator=g), torch.randn(b, hkv, width, d, generator=g)
    pk, pv = torch.randn(hkv, p, d, generator=g), torch.randn(hkv, p, d, generator=g)
    k[:4, :, :p], v[:4, :, :p] = pk, pv
    q = torch.randn(b, hkv * groups, 1, d, generator=g)
    length = torch.tensor([7, 11, 9, 8, 10, 2])  # the column each row writes now
    visible = torch.arange(width)[None, :] <= length[:, None]
    mask = {"bool": visible[:, None, None, :], "none": None,
            "additive": torch.zeros(b, 1, 1, width).masked_fill(~visible[:, None, None, :], -1e9)}[mask_kind]
    want = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask,
                                          scale=0.3).transpose(1, 2)
    got = prefix_decode_attention(q, k, v, mask, 0.3, pk, pv, torch.tensor([4, 5]))
    assert got.shape == (b, 1, hkv * groups, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    every = prefix_decode_attention(q[:4], k[:4], v[:4], None if mask is None else mask[:4], 0.3, pk, pv, None)
    torch.testing.assert_close(every, want[:4], rtol=1e-5, atol=1e-6)


def test_a_row_holds_the_block_only_when_its_columns_are_the_blocks_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    kv = [(torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)) for _ in range(2)]
    block = SharedPrefix(tuple(range(5)), kv)
    longer = [(torch.cat([k, torch.randn(2, 3, 4, generator=g)], 1), torch.cat([v, torch.zeros(2, 3, 4)], 1))
              for k, v in kv]
    assert block.holds(kv) and block.holds([(k.clone(), v.clone()) for k, v in kv]) and block.holds(longer)
    changed = [(k.clone(), v.clone()) for k, v in kv]
    changed[1][1][0, 2, 3] += 1e-6
    assert not block.holds(changed) and not block.holds(None) and not block.holds([(k[:, :4], v[:, :4]) for k, v in kv])
    assert block.cut(3).holds(longer) and block.cut(3).length == 3


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def requests() -> list[GenRequest]:
    """Eight rows with the shared prefix (different tails and lengths: with max_batch 4 the later
    ones take the slots of rows that finished) and two without."""
    tails = [[7], [8, 9, 10], [11, 12], [13] * 6, [14, 15], [16], [17, 18, 19, 20], [21]]
    ps = [SYSTEM + t for t in tails] + [[5, 6, 7, 8], [9] * 12]
    return [GenRequest(p, max_new_tokens=4 + 3 * (i % 4), sampling=GREEDY) for i, p in enumerate(ps)]


def generator(model, **kw) -> LocalGenerator:
    """A generator whose steps read the block once from one holding row on (MIN_ROWS is 16: the
    tests' batches are smaller)."""
    gen = LocalGenerator(model, pad_id=0, **kw)
    gen.loop.slots.min_prefix_rows = 1
    return gen


def run(gen, reqs):
    return asyncio.run(gen.generate(reqs))


def test_decode_steps_that_read_the_prefix_once_give_the_same_tokens_and_logprobs(monkeypatch):
    model = tiny_random_lm()
    on = generator(model, max_batch=4)
    got = run(on, requests())
    assert on.stats["prefix_steps"] > 0 and on.stats["shared_prefix_tokens"] > 0
    monkeypatch.setattr(Forward, "reads_prefix_once", lambda self: False)
    off = generator(model, max_batch=4)
    want = run(off, requests())
    assert off.stats["prefix_steps"] == 0 and off.loop.slots.prefix is None
    for req, a, b in zip(requests(), got, want):
        assert a.token_ids == b.token_ids == reference(model, req.prompt_ids, req.max_new_tokens)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.tensor(a.logprobs), teacher_forced(model, req.prompt_ids, a.token_ids),
                                   rtol=1e-4, atol=1e-4)


def rows(loop: asyncio.AbstractEventLoop, ps: list[list[int]], n: int, session: str | None = None) -> list[Row]:
    return [Row(GenRequest(p, max_new_tokens=n, sampling=GREEDY, session=session and f"{session}{i}"),
                loop.create_future(), frozenset(), (), 0.0) for i, p in enumerate(ps)]


def drain(gen, first: list[Row]) -> list[Row]:
    done = gen.loop.step(first)
    while gen.loop.live:
        done += gen.loop.step([])
    return done


def test_kept_sessions_and_later_rows_hold_the_block_and_a_shorter_share_cuts_it():
    """Turn 1: the first rows' common prefix runs 2 ids past SYSTEM (the block). A row arriving alone
    with the whole block takes it as its past; one sharing only SYSTEM cuts the block to SYSTEM.
    Turn 2 of each session holds the block through its kept cache. Every row's tokens are those of
    model.generate, and every decode step with a row holding the block read it once."""
    model = tiny_random_lm()
    gen = generator(model, max_batch=8)
    loop = asyncio.new_event_loop()
    first = rows(loop, [SYSTEM + [30, 31, 40 + i] for i in range(3)], 5, session="a")
    gen.loop.step(first)
    assert gen.loop.slots.prefix.ids == tuple(SYSTEM + [30, 31])
    alone = rows(loop, [SYSTEM + [30, 31, 50, 51]], 5, session="b")
    gen.loop.step(alone)
    assert gen.loop.slots.holds[:4] == [True] * 4
    shorter = rows(loop, [SYSTEM + [60, 61]], 5, session="c")
    done = drain(gen, shorter)
    assert gen.loop.slots.prefix.ids == tuple(SYSTEM)
    assert gen.stats["prefix_steps"] == gen.stats["steps"]
    turn1 = first + alone + shorter
    assert len(done) + len([r for r in turn1 if r.finish]) >= len(turn1)
    for row in turn1:
        assert row.tokens == reference(model, row.req.prompt_ids, 5)
    steps = gen.stats["steps"]
    second = []
    for row in turn1:
        ctx = list(row.req.prompt_ids) + row.tokens + [70, 71]
        second += [Row(GenRequest(ctx, max_new_tokens=4, sampling=GREEDY, session=row.req.session),
                       loop.create_future(), frozenset(), (), 0.0)]
    reused = gen.stats["reused_tokens"]
    gen.loop.step(second)
    assert gen.stats["reused_tokens"] > reused and all(gen.loop.slots.holds[: len(second)])
    drain(gen, [])
    assert gen.stats["prefix_steps"] - steps == gen.stats["steps"] - steps > 0
    for row in second:
        assert row.tokens == reference(model, row.req.prompt_ids, 4)
    loop.close()


def test_the_block_is_not_kept_across_a_weight_change():
    """Between rollouts (nothing live, no kept session) the block is dropped: a trainer may have
    changed the weights in place, and a later row must not take the old weights' prefix."""
    model = tiny_random_lm()
    gen = generator(model)
    run(gen, [GenRequest(SYSTEM + [7 + i], max_new_tokens=3, sampling=GREEDY) for i in range(3)])
    assert gen.loop.slots.prefix is not None
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(1.5)
            layer.self_attn.v_proj.weight.add_(0.05)
    p = SYSTEM + [20, 21]
    res = run(gen, [GenRequest(p, max_new_tokens=6, sampling=GREEDY)])
    assert res[0].token_ids == reference(model, p, 6)
    torch.testing.assert_close(torch.tensor(res[0].logprobs), teacher_forced(model, p, res[0].token_ids),
                               rtol=1e-4, atol=1e-4)


def test_a_sliding_window_model_keeps_the_one_pass_attention():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             max_position_embeddings=512, sliding_window=6)).eval()
    gen = generator(model)
    ps = [SYSTEM + [7 + i] for i in range(3)]
    res = run(gen, [GenRequest(p, max_new_tokens=5, sampling=GREEDY) for p in ps])
    assert gen.stats["shared_prefix_tokens"] > 0 and gen.loop.slots.prefix is None and gen.stats["prefix_steps"] == 0
    for p, r in zip(ps, res):
        assert r.token_ids == reference(model, p, 5)


def test_a_step_with_fewer_holding_rows_than_min_rows_reads_the_whole_cache():
    """Below MIN_ROWS holding rows a second attention call and the merge cost more than they save."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    ps = [SYSTEM + [7 + i] for i in range(3)]
    res = run(gen, [GenRequest(p, max_new_tokens=4, sampling=GREEDY) for p in ps])
    assert gen.loop.slots.prefix is not None and gen.stats["prefix_steps"] == 0
    assert [r.token_ids for r in res] == [reference(model, p, 4) for p in ps]
