"""Packed training passes (rlfactory/train/packed.py) against today's padded passes on tiny Qwen3
models (GQA and not): the same hidden states, logprobs, update and gradients; the pass planner's
real-token counts."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from train_fixtures import VOCAB, make_traj, tiny_qwen3

from rlfactory.config import AlgoConfig, TrainerConfig
from rlfactory.passes import packed_tokens, plan_micro_batches
from rlfactory.train.batch import collate
from rlfactory.train.kernels import PLAIN, TrainKernels
from rlfactory.train.logprobs import decoder_and_head, policy_forward, predictive_hidden
from rlfactory.train.model import make_optimizer, make_scheduler
from rlfactory.train.packed import pack, packable, packed_hidden, use_packed
from rlfactory.train.parallel import RowLayout
from rlfactory.train.update import PolicyUpdate, UpdateData

PACKED = TrainKernels(packed=True)


def tiny(kv_heads: int, seed: int = 0, attn: str = "sdpa"):
    model = tiny_qwen3(seed)
    if kv_heads != model.config.num_key_value_heads:  # the same shapes without GQA
        from transformers import Qwen3ForCausalLM

        cfg = copy.deepcopy(model.config)
        cfg.num_key_value_heads = kv_heads
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg).eval()
    model.config._attn_implementation = attn
    return model


def trajectories(seed: int = 0, prompts: int = 3, group: int = 3):
    """`prompts` prompts of different lengths, `group` completions each of different lengths, some
    with observations (loss 0) between model turns, one of a single token."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(1, VOCAB) for _ in range(2 + 3 * p)]
        for g in range(group):
            parts = [("prompt", prompt), ("model", [rng.randrange(1, VOCAB) for _ in range(1 + (p + 2 * g) % 5)])]
            if g % 2:
                parts += [("observation", [rng.randrange(1, VOCAB) for _ in range(3)]),
                          ("model", [rng.randrange(1, VOCAB) for _ in range(2 + g)])]
            out.append(make_traj(parts, tid=f"t{p}{g}", lp=-0.3))
    out.append(make_traj([("prompt", [7, 8, 9]), ("model", [5])], tid="one"))
    return out


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_hidden_states_equal_the_padded_ones(kv_heads, attn):
    model = tiny(kv_heads, attn=attn)
    batch = collate(trajectories(), pad_id=0)
    decoder, _ = decoder_and_head(model)
    with torch.no_grad():
        padded = predictive_hidden(decoder, batch)
        packed = packed_hidden(decoder, batch, use_flex=False)
    real = batch.completion_mask.bool()
    assert packed.shape == padded.shape
    torch.testing.assert_close(packed[real], padded[real], atol=2e-6, rtol=1e-5)
    assert torch.equal(packed[~real], torch.zeros_like(packed[~real]))  # padding columns: zeros
    assert model.config._attn_implementation == attn  # the kernel is put back


def test_the_packed_sequence_has_no_padding_and_positions_per_trajectory():
    trajs = [make_traj([("prompt", [1, 2, 3]), ("model", [10, 11, 12])], tid="a"),
             make_traj([("prompt", [1, 2, 3]), ("model", [20])], tid="b"),
             make_traj([("prompt", [4, 5]), ("model", [30, 31])], tid="c")]
    batch = collate(trajs, pad_id=0)
    p = pack(batch)
    # prompt 0, a's tokens but its last, b has none (one token), prompt 1, c's first token
    assert p.input_ids.tolist() == [[1, 2, 3, 10, 11, 4, 5, 30]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert p.row_of.tolist() == [-1, -1, -1, 0, 0, -1, -1, 2]
    assert p.source.tolist() == [[2, 3, 4], [2, 8, 8], [6, 7, 8]]  # 8 = T: a padding column
    assert p.length == packed_tokens([3, 1, 2], [3, 3, 2], [0, 0, 1])
    m = p.dense_mask()[0, 0]
    assert m[4].tolist() == [True] * 5 + [False] * 3  # a's token sees its prompt and itself
    assert m[7].tolist() == [False] * 5 + [True] * 3  # c sees prompt 1 only


def test_siblings_never_see_each_other():
    trajs = [make_traj([("prompt", [1, 2]), ("model", [10, 11, 12])], tid="a"),
             make_traj([("prompt", [1, 2]), ("model", [20, 21, 22])], tid="b")]
    p = pack(collate(trajs, pad_id=0))
    m = p.dense_mask()[0, 0]
    a, b = p.row_of == 0, p.row_of == 1
    assert not m[b][:, a].any() and not m[a][:, b].any()
    assert m[b][:, p.row_of < 0].all()  # the shared prompt is seen by both


def test_the_block_mask_is_the_dense_mask():
    """Flex attention (torch's own, uncompiled on the CPU) with the BlockMask equals sdpa with the dense mask."""
    from torch.nn.attention.flex_attention import flex_attention

    p = pack(collate(trajectories(1, prompts=4, group=4), pad_id=0))
    t = p.length
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, t, 8, generator=g) for h in (4, 2, 2))
    flex = flex_attention(q, k, v, block_mask=p.block_mask(), enable_gqa=True)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=p.dense_mask(), enable_gqa=True)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_logprobs_and_entropies_equal_the_padded_ones(kv_heads):
    model = tiny(kv_heads)
    batch = collate(trajectories(2), pad_id=0)
    with torch.no_grad():
        lp0, e0 = policy_forward(model, batch, temperature=0.7, with_entropy=True, kernels=PLAIN)
        lp1, e1 = policy_forward(model, batch, temperature=0.7, with_entropy=True, kernels=PACKED)
    torch.testing.assert_close(lp1, lp0, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(e1, e0, atol=2e-6, rtol=1e-5)


def _update(model, kernels, algo):
    tr = TrainerConfig(lr=1e-2)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], tr)
    return PolicyUpdate(model, opt, make_scheduler(opt, tr), algo, kernels=kernels)


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_one_update_step_gives_the_same_gradients_and_weights(kv_heads):
    algo = AlgoConfig(kl_coef=0.0, entropy_coef=0.01, micro_batch_tokens=40)
    trajs = trajectories(3)
    batch = collate(trajs, pad_id=0)
    adv = torch.linspace(-1, 1, len(batch))
    models, grads, logps = [], [], []
    for kernels in (PLAIN, PACKED):
        model = tiny(kv_heads)
        up = _update(model, kernels, algo)
        grad = {}
        for n, p in model.named_parameters():  # the gradient the optimizer step sees
            p.register_post_accumulate_grad_hook(lambda t, n=n: grad.__setitem__(n, t.grad.clone()))
        metrics, logp = up(UpdateData(batch, adv, old_logp=None), torch.Generator().manual_seed(0))
        models.append(model), grads.append(grad), logps.append(logp)
    torch.testing.assert_close(logps[1], logps[0], atol=2e-6, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-5, rtol=1e-4, msg=n)
    for (n, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=n)


def test_models_that_cannot_pack_keep_the_padded_path(capsys):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                               num_hidden_layers=2, sliding_window=4)).eval()
    decoder, _ = decoder_and_head(mistral)
    assert "sliding-window" in packable(decoder)
    assert not use_packed("on", decoder, torch.device("cpu"))
    assert capsys.readouterr().err.strip().endswith("has sliding-window layers: its passes stay padded")
    batch = collate(trajectories(), pad_id=0)
    with torch.no_grad():  # predictive_hidden(packed=True) routes it to the padded path
        torch.testing.assert_close(predictive_hidden(decoder, batch, packed=True), predictive_hidden(decoder, batch))
    flash = tiny(2, attn="flash_attention_2")
    assert "'flash_attention_2'" in packable(decoder_and_head(flash)[0])
    qwen = decoder_and_head(tiny(2))[0]
    assert packable(qwen) is None
    assert use_packed("on", qwen, torch.device("cpu")) and not use_packed("auto", qwen, torch.device("cpu"))
    assert not use_packed("off", qwen, torch.device("cuda"))


def test_the_planner_counts_real_tokens_when_packed():
    # one prompt of 20 tokens, rows of 3 and 300 tokens: padded, a pass of both pads the short one to
    # 300; packed it costs only its real tokens, so the planner keeps one pass
    lc, lp, key = [3, 300, 3, 300], [20] * 4, [0] * 4
    assert plan_micro_batches(lc, lp, key) == [[0, 2], [1, 3]]
    assert plan_micro_batches(lc, lp, key, packed=True) == [[0, 1, 2, 3]]
    assert packed_tokens(lc, lp, key) == 20 + 2 + 299 + 2 + 299
    rng = random.Random(0)
    for trial in range(60):
        n = rng.randint(1, 30)
        lc = [rng.choice([rng.randint(1, 30), rng.randint(100, 400)]) for _ in range(n)]
        key = [rng.randint(0, 4) for _ in range(n)]
        lp = [5 + 9 * k for k in key]
        size, cap = rng.choice([None, 2, 7]), rng.choice([None, 300, 1000])
        passes = plan_micro_batches(lc, lp, key, size, cap, packed=True)
        assert sorted(i for p in passes for i in p) == list(range(n)) and all(p == sorted(p) for p in passes)
        assert all(len(p) <= (size or n) for p in passes)
        cost = [packed_tokens([lc[i] for i in p], [lp[i] for i in p], [key[i] for i in p]) for p in passes]
        assert all(len(p) == 1 or c <= cap for p, c in zip(passes, cost) if cap)
        if size is None and cap is None:  # nothing to save by splitting: one pass
            assert len(passes) == 1


def test_planned_token_counts_are_the_packed_lengths_and_ranks_stay_in_step():
    trajs = trajectories(4, prompts=4, group=3)
    batch = collate(trajs, pad_id=0)
    layout = RowLayout.single(batch)
    every = torch.arange(len(batch))
    passes = layout.micro_batches(every, None, 30, by_length=True, packed=True)
    assert len(passes) > 1
    lc, lp, key = layout.shape.T.tolist()
    for rows in passes:
        r = rows.tolist()
        assert pack(batch.select(rows)).length == packed_tokens([lc[i] for i in r], [lp[i] for i in r],
                                                                [key[i] for i in r])
    # two ranks with different rows run as many passes as the busiest
    owner = torch.tensor([i % 2 for i in range(len(batch))])
    ranks = [RowLayout(owner, torch.ones(len(batch)), r, 2, shape=layout.shape) for r in (0, 1)]
    counts = [len(x.micro_batches(every, None, 30, True, packed=True)) for x in ranks]
    assert ranks[0].passes(every, None, 30, True, packed=True) == ranks[1].passes(every, None, 30, True, packed=True) \
        == max(counts)


def test_flex_routing_chains_with_the_gqa_decode_attention():
    """Whichever of the two "sdpa" wrappers comes first, a BlockMask gets torch's flex (eager on the
    CPU, forward only: it has no CPU backward; the gradients are checked in test_train_packed_gpu.py),
    a tensor mask transformers' sdpa (through the GQA one), and installing again adds nothing."""
    from transformers import AttentionInterface

    from rlfactory.generation import gqa_attention
    from rlfactory.train.packed import install_flex

    before = AttentionInterface._global_mapping.get("sdpa")
    try:
        for order in ("gqa first", "flex first"):
            gqa_attention.uninstall()
            AttentionInterface.register("sdpa", before)
            steps = [gqa_attention.install, install_flex] if order == "gqa first" else [install_flex, gqa_attention.install]
            for step in steps:
                step()
            top = AttentionInterface._global_mapping["sdpa"]
            install_flex()
            gqa_attention.install()
            assert AttentionInterface._global_mapping["sdpa"] is top, order
            model = tiny(2)
            batch = collate(trajectories(), pad_id=0)
            decoder, _ = decoder_and_head(model)
            with torch.no_grad():
                torch.testing.assert_close(packed_hidden(decoder, batch, use_flex=False),
                                           packed_hidden(decoder, batch, use_flex=True), atol=2e-6, rtol=1e-5)
    finally:
        gqa_attention.uninstall()
        AttentionInterface.register("sdpa", before)


def test_heads_under_16_wide_take_the_dense_mask_where_flex_would_run(monkeypatch):
    # torch's flex kernel refuses heads under 16 wide (NotImplementedError; seen on an H200 with
    # the FSDP GPU test's tiny model): such a model packs with the dense mask instead
    import rlfactory.train.packed as packed_mod

    monkeypatch.setattr(packed_mod, "flex_available", lambda device: True)  # as on CUDA
    built = []
    real_block_mask = packed_mod.PackedPass.block_mask
    monkeypatch.setattr(packed_mod.PackedPass, "block_mask", lambda self: built.append(1) or real_block_mask(self))
    batch = collate(trajectories(), pad_id=0)
    narrow = tiny(2, attn="sdpa")  # head_dim 8
    assert packed_mod.head_dim(decoder_and_head(narrow)[0]) == 8
    with torch.no_grad():
        packed_hidden(decoder_and_head(narrow)[0], batch)
    assert built == []
    from transformers import Qwen3ForCausalLM

    cfg = copy.deepcopy(narrow.config)
    cfg.head_dim = 16
    wide = Qwen3ForCausalLM(cfg).eval()
    assert packed_mod.head_dim(decoder_and_head(wide)[0]) == 16
    with torch.no_grad():
        packed_hidden(decoder_and_head(wide)[0], batch)
    assert built == [1]
