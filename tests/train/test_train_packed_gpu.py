"""On a CUDA device (skipped without one): packed training passes with flex attention (a BlockMask,
compiled) equal the padded passes: exactly in float32 on a small model, within bf16 tolerance on a
random Qwen3-0.6B-shaped model in bf16, whose forward+backward time and peak memory are printed for
both paths (run with -s to see them)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from rlfactory.train.batch import TrainBatch, collate
from rlfactory.train.kernels import PLAIN, TrainKernels
from rlfactory.train.logprobs import decoder_and_head, policy_forward, predictive_hidden
from rlfactory.train.packed import pack, packed_hidden
from rlfactory.trajectory import Segment, Trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
PACKED = TrainKernels(packed=True)


def _batch(prompts: int, group: int, prompt_len: tuple[int, int], completion_len: tuple[int, int],
           vocab: int, seed: int = 0) -> TrainBatch:
    """GRPO-shaped: `prompts` prompts of `group` completions each, lengths drawn uniformly."""
    rng = random.Random(seed)
    trajs = []
    for p in range(prompts):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_len))]
        for g in range(group):
            n = rng.randint(*completion_len)
            model = [rng.randrange(1, vocab) for _ in range(n)]
            segs = [Segment(role="prompt", token_ids=prompt),
                    Segment(role="model", token_ids=model, logprobs=[-1.0] * n, policy_version=0)]
            trajs.append(Trajectory(id=f"{p}.{g}", group=str(p), segments=segs))
    return collate(trajs, pad_id=0).to("cuda")


def _model(dtype: torch.dtype, **overrides):
    from rlfactory.tiny.architectures import random_model

    return random_model("qwen3-0.6b", dtype=dtype, **overrides).to("cuda")


def test_gpu_packed_flex_equals_padded_in_float32():
    """The quick check: 2 layers of the 0.6B shape in float32, flex (compiled) vs the padded path."""
    model = _model(torch.float32, num_hidden_layers=2)
    batch = _batch(3, 4, (5, 40), (1, 90), model.config.vocab_size)
    decoder, _ = decoder_and_head(model)
    with torch.no_grad():
        padded = predictive_hidden(decoder, batch)
        packed = packed_hidden(decoder, batch, use_flex=True)
        dense = packed_hidden(decoder, batch, use_flex=False)
    real = batch.completion_mask.bool()
    assert model.config._attn_implementation == "sdpa"  # flex only for the pass
    torch.testing.assert_close(dense[real], padded[real], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(packed[real], padded[real], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpu_flex_gradients_equal_the_dense_mask_with_and_without_gradient_checkpointing(checkpointing):
    """Under gradient checkpointing the layers' recomputation in the backward must pick flex again
    (the kernel follows the BlockMask, not a config switched for the forward only). bf16, as trained."""
    batch = _batch(3, 3, (5, 40), (1, 60), 1000, seed=2)
    grads = []
    for flex in (False, True):
        model = _model(torch.bfloat16, num_hidden_layers=2, vocab_size=1000)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train()
        decoder, _ = decoder_and_head(model)
        h = packed_hidden(decoder, batch, use_flex=flex)
        (h.float() * torch.linspace(-1, 1, h.shape[-1], device="cuda")).sum().backward()
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        rel = (grads[1][n] - grads[0][n]).norm() / grads[0][n].norm().clamp(min=1e-12)
        assert rel < 2e-2, (n, float(rel))


def _fwd_bwd(model, batch, kernels):
    logp, _ = policy_forward(model, batch, kernels=kernels)
    logp.sum().backward()
    return logp.detach()


def _timed(model, batch, kernels, repeats: int = 3) -> tuple[float, float]:
    """(seconds per forward+backward, peak GiB) after a warm-up (flex compiles on its first call)."""
    for _ in range(1):  # the agreement check before already compiled flex for these shapes
        _fwd_bwd(model, batch, kernels)
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(repeats):
        _fwd_bwd(model, batch, kernels)
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats, torch.cuda.max_memory_allocated() / 2**30


def test_gpu_packed_flex_matches_padded_on_qwen3_0_6b_bf16():
    """Within bf16 tolerance: the packed path's logprobs differ from the padded path's by no more
    than (twice) the padded path's own bf16 error against a float32 forward; gradients within 5%."""
    model = _model(torch.bfloat16)
    batch = _batch(4, 8, (100, 300), (16, 400), model.config.vocab_size, seed=1)
    grads = []
    logps = []
    for kernels in (PLAIN, PACKED):
        logps.append(_fwd_bwd(model, batch, kernels))
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters()
                      if n.endswith(("embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                                     "layers.27.mlp.down_proj.weight"))})
        model.zero_grad(set_to_none=True)
    rows, lc = batch.completion_ids.shape
    padded_positions = rows * lc + batch.prompt_ids.numel()
    tokens = pack(batch).length
    t0, m0 = _timed(model, batch, PLAIN)
    t1, m1 = _timed(model, batch, PACKED)
    print(f"\npadded: {padded_positions} positions, {t0 * 1e3:.1f} ms fwd+bwd, peak {m0:.2f} GiB | "
          f"packed+flex: {tokens} tokens, {t1 * 1e3:.1f} ms, peak {m1:.2f} GiB | "
          f"time packed/padded {t1 / t0:.2f}x, memory {m1 / m0:.2f}x ({torch.cuda.get_device_name()})")
    with torch.no_grad():
        exact = policy_forward(model.float(), batch)[0]  # float32 weights and compute, padded
    sel = batch.loss_mask.bool()
    diff = (logps[1] - logps[0])[sel].abs()
    noise = (logps[0] - exact)[sel].abs()
    print(f"packed vs padded logprobs (bf16): mean |diff| {diff.mean():.4f}, max {diff.max():.4f}; padded bf16 "
          f"vs float32: mean {noise.mean():.4f}, max {noise.max():.4f}; {int(sel.sum())} tokens")
    assert diff.mean() <= 2 * noise.mean() + 1e-3 and diff.max() <= 2 * noise.max() + 1e-2
    for n in grads[0]:
        rel = (grads[1][n] - grads[0][n]).norm() / grads[0][n].norm()
        print(f"  grad {n}: relative difference {rel:.4f}")
        assert rel < 0.05, n
