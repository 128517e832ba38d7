"""The fused LM-head logprobs (rlfactory/train/fused_head.py) against the plain head: values and
gradients, float32 and bf16 autocast, with and without entropy gradients, temperature != 1, tied
embeddings, bias, chunks smaller than the rows; and policy_forward / PolicyUpdate with
`TrainKernels(fused_head=True)` against today's path on a tiny Qwen3."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from train_fixtures import make_traj, tiny_qwen3
from rlfactory.algos.utils import entropy_from_logits, token_logprobs
from rlfactory.config import AlgoConfig, TrainerConfig
from rlfactory.train.batch import collate
from rlfactory.train.fused_head import fused_head_logprobs, linear_head
from rlfactory.train.kernels import TrainKernels
from rlfactory.train.logprobs import batched_logprobs, policy_forward
from rlfactory.train.model import make_optimizer, make_scheduler
from rlfactory.train.update import PolicyUpdate, UpdateData

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models; a shared CPU


def _plain(hidden, head, targets, temperature, entropy_grad, bf16):
    """Today's head (policy_forward's plain path) on flat rows."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    with ctx:
        logits = head(hidden)
    if temperature != 1.0:
        logits = logits.float() / temperature
    logp = token_logprobs(logits[None], targets[None])[0]
    ent = entropy_from_logits((logits if entropy_grad else logits.detach())[None])[0]
    return logp, ent


def _fused(hidden, head, targets, temperature, entropy_grad, bf16, chunk):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    with ctx:
        return fused_head_logprobs(hidden, head.weight, head.bias, targets, temperature=temperature,
                                   chunk_tokens=chunk, with_entropy=True, entropy_grad=entropy_grad)


def _run(fn, head, hidden, targets, seed=1, **kw):
    """Values and the gradients of hidden, weight and bias for a loss mixing logp and entropy."""
    head = copy.deepcopy(head)
    h = hidden.clone().requires_grad_(True)
    logp, ent = fn(h, head, targets, **kw)
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
    loss = (logp * a).sum() + ((ent * b).sum() if ent.requires_grad else 0.0)
    loss.backward()
    grads = [h.grad, head.weight.grad] + ([head.bias.grad] if head.bias is not None else [])
    return logp.detach(), ent.detach(), grads


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_float32_values_and_gradients_equal_the_plain_head(bias, temperature, entropy_grad):
    torch.manual_seed(0)
    head = nn.Linear(16, 50, bias=bias)
    hidden, targets = torch.randn(23, 16), torch.randint(0, 50, (23,))
    kw = dict(temperature=temperature, entropy_grad=entropy_grad, bf16=False)
    lp0, e0, g0 = _run(_plain, head, hidden, targets, **kw)
    for chunk in (5, 23, 4096):  # several chunks (the last one short), exactly one, one larger than the rows
        lp1, e1, g1 = _run(_fused, head, hidden, targets, chunk=chunk, **kw)
        assert torch.allclose(lp1, lp0, atol=1e-6, rtol=0) and torch.allclose(e1, e0, atol=1e-6, rtol=0), chunk
        for a, b in zip(g1, g0):
            assert a.dtype == b.dtype and torch.allclose(a, b, atol=1e-6, rtol=1e-5), chunk


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_bf16_autocast_within_bf16_tolerance(temperature):
    torch.manual_seed(0)
    head = nn.Linear(32, 200, bias=False)
    hidden, targets = torch.randn(40, 32), torch.randint(0, 200, (40,))
    kw = dict(temperature=temperature, entropy_grad=True, bf16=True)
    lp0, e0, g0 = _run(_plain, head, hidden, targets, **kw)
    lp1, e1, g1 = _run(_fused, head, hidden, targets, chunk=16, **kw)
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(e1, e0, atol=1e-5)  # same bf16 logits, float32 after
    for a, b in zip(g1, g0):  # the plain head rounds each part of d(logits) to bf16, the fused one their sum
        assert a.dtype == b.dtype == torch.float32
        assert (a - b).norm() <= 2e-2 * b.norm()


def test_entropy_without_gradient_is_detached_and_logp_grads_unchanged():
    torch.manual_seed(0)
    head = nn.Linear(8, 30)
    h = torch.randn(7, 8, requires_grad=True)
    logp, ent = fused_head_logprobs(h, head.weight, head.bias, torch.randint(0, 30, (7,)), with_entropy=True,
                                    entropy_grad=False)
    assert logp.requires_grad and not ent.requires_grad
    logp2, none = fused_head_logprobs(h, head.weight, head.bias, torch.randint(0, 30, (7,)))
    assert none is None and logp2.shape == (7,)


def test_no_rows_and_frozen_weight():
    head = nn.Linear(8, 30, bias=False)
    head.weight.requires_grad_(False)  # e.g. LoRA: the head is frozen, only hidden gets a gradient
    h = torch.randn(0, 8, requires_grad=True)
    logp, _ = fused_head_logprobs(h, head.weight, None, torch.zeros(0, dtype=torch.long))
    logp.sum().backward()
    assert logp.shape == (0,) and h.grad.shape == (0, 8) and head.weight.grad is None


def test_linear_head_refuses_wrapped_or_hooked_heads():
    plain = nn.Linear(4, 6)
    assert linear_head(plain)[0] is plain.weight
    hooked = nn.Linear(4, 6)
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    assert linear_head(hooked) is None
    assert linear_head(nn.Sequential(nn.Linear(4, 6))) is None
    wrapped = nn.Linear(4, 6)
    wrapped.forward = lambda x: nn.Linear.forward(wrapped, x)  # as accelerate's add_hook_to_module does
    assert linear_head(wrapped) is None


def _trajs():
    return [
        make_traj([("prompt", [1, 2, 3]), ("model", [10, 11]), ("observation", [30, 31]), ("model", [12, 13, 14])]),
        make_traj([("prompt", [1, 2]), ("model", [20, 21, 22]), ("observation", [40, 41])]),
        make_traj([("prompt", [1, 2, 3]), ("model", [50, 51, 52, 53])]),
        make_traj([("prompt", [5, 6, 7, 8]), ("model", [9])]),
    ]


def _tied_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("share_prefix", [True, False])
def test_policy_forward_fused_equals_plain_with_gradients(tied, share_prefix):
    base = _tied_qwen3() if tied else tiny_qwen3()
    batch = collate(_trajs(), pad_id=0)
    out = []
    for kernels in (TrainKernels(), TrainKernels(fused_head=True, head_chunk_tokens=3)):
        model = copy.deepcopy(base)
        logp, ent = policy_forward(model, batch, temperature=0.8, with_entropy=True, entropy_grad=True,
                                   share_prefix=share_prefix, kernels=kernels)
        (logp.sum() + 0.3 * ent.sum()).backward()
        out.append((logp.detach(), ent.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (lp0, e0, g0), (lp1, e1, g1) = out
    assert torch.allclose(lp1, lp0, atol=1e-6) and torch.allclose(e1, e0, atol=1e-6)
    assert ((lp1 == 0) == (batch.loss_mask == 0)).all()
    for name in g0:
        assert torch.allclose(g1[name], g0[name], atol=1e-6, rtol=1e-4), name


def test_batched_logprobs_and_one_update_step_equal_with_the_fused_head():
    base = tiny_qwen3()
    batch = collate(_trajs(), pad_id=0)
    plain, fused = TrainKernels(), TrainKernels(fused_head=True, head_chunk_tokens=4)
    assert torch.allclose(batched_logprobs(base, batch, 2, kernels=fused), batched_logprobs(base, batch, 2), atol=1e-6)
    weights = []
    for kernels in (plain, fused):
        model = copy.deepcopy(base)
        tr = TrainerConfig(lr=1e-2)
        opt = make_optimizer(list(model.parameters()), tr)
        up = PolicyUpdate(model, opt, make_scheduler(opt, tr), AlgoConfig(entropy_coef=0.01, micro_batch_size=2),
                          temperature=0.9, kernels=kernels)
        metrics, _ = up(UpdateData(batch, torch.tensor([1.0, -1.0, 0.5, -0.5]), None), torch.Generator().manual_seed(0))
        weights.append((metrics, model.state_dict()))
    (m0, w0), (m1, w1) = weights
    assert m0["loss/total"] == pytest.approx(m1["loss/total"], abs=1e-6)
    for name in w0:
        assert torch.allclose(w1[name], w0[name], atol=1e-6), name
