"""Policy/value losses, KL, entropy and masked ops on hand-computed values (CPU)."""

import math

import pytest
import torch

from rlfactory.algos import (
    agg_loss,
    entropy_bonus,
    entropy_from_logits,
    get_policy_loss,
    gspo_loss,
    kl_estimate,
    kl_loss,
    list_policy_losses,
    masked_mean,
    masked_sum,
    masked_whiten,
    ppo_clip_loss,
    register_policy_loss,
    token_logprobs,
    truncated_is_weights,
    value_loss,
)


def approx(x, y, tol=1e-4):
    return abs(float(torch.as_tensor(x).detach()) - y) < tol


def test_masked_mean_sum_and_empty_mask():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert approx(masked_mean(x, m), 2.0) and approx(masked_sum(x, m), 4.0)
    assert masked_mean(x, m, dim=-1).tolist() == [2.0, 0.0]
    w = masked_whiten(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
    assert torch.allclose(w, torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]), atol=1e-5)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # third row has no token: left out
    assert approx(agg_loss(loss, mask, "token-mean"), 10 / 4)
    assert approx(agg_loss(loss, mask, "seq-mean-token-mean"), (2 + 4) / 2)
    assert approx(agg_loss(loss, mask, "seq-mean-token-sum"), (6 + 4) / 2)
    assert approx(agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_constant=5), 10 / (2 * 5))
    assert approx(agg_loss(loss, mask, "seq-mean-token-sum-norm"), 10 / (2 * 3))
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(loss, mask, "bogus")


def test_ppo_clip_higher_by_hand():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 2.0]])
    logp = ratios.log().requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 4), torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    # token losses: max(-1.5, -1.28) = -1.28 (clipped), max(-.5, -.8) = -.5, -1.1 ; token 3 masked
    assert approx(loss, (-1.28 - 0.5 - 1.1) / 3)
    assert approx(m["clipfrac"], 1 / 3)
    assert approx(m["ratio_mean"], (1.5 + 0.5 + 1.1) / 3)
    assert approx(m["approx_kl"], -(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 3)
    loss.backward()
    # d/dlogp of -A*r/N = -r/3 on unclipped tokens, 0 on the clipped and masked ones
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5 / 3, -1.1 / 3, 0.0]]), atol=1e-6)
    # same with symmetric clip 0.2: token 0 is clipped at 1.2
    loss_sym, _ = ppo_clip_loss(logp.detach(), torch.zeros(1, 4), torch.tensor([1.0]), mask, clip_low=0.2)
    assert approx(loss_sym, (-1.2 - 0.5 - 1.1) / 3)


def test_ppo_dual_clip_bounds_negative_advantages():
    ratios = torch.tensor([[5.0, 0.5, 1.0]])
    mask = torch.ones(1, 3)
    adv = torch.full((1, 3), -1.0)  # token-level advantages
    loss, m = ppo_clip_loss(ratios.log(), torch.zeros(1, 3), adv, mask, clip_low=0.2, dual_clip=3.0)
    # token 0: max(5, 1.2) = 5 -> min(5, 3) = 3 ; token 1: max(.5, .8) = .8 ; token 2: 1
    assert approx(loss, (3 + 0.8 + 1) / 3)
    assert approx(m["clipfrac"], 1 / 3) and approx(m["clipfrac_lower"], 1 / 3)
    no_dual, _ = ppo_clip_loss(ratios.log(), torch.zeros(1, 3), adv, mask, clip_low=0.2)
    assert approx(no_dual, (5 + 0.8 + 1) / 3)
    with pytest.raises(ValueError):
        ppo_clip_loss(ratios.log(), torch.zeros(1, 3), adv, mask, dual_clip=0.5)


def test_ppo_on_policy_gradient_is_reinforce():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss, m = get_policy_loss("ppo")(logp, logp.detach(), adv, torch.ones(2, 2), agg="seq-mean-token-sum")
    loss.backward()
    assert approx(loss, -(2 * 2 - 1 * 2) / 2) and m["clipfrac"] == 0 and approx(m["ratio_mean"], 1.0)
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0], [0.5, 0.5]]))


def test_gspo_sequence_ratio_is_geometric_mean():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, 0.0], [-1e-4, 1e-4, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, m = gspo_loss(logp, old, adv, mask)  # clip 3e-4 / 4e-4
    # seq 0: s = exp(0.2) -> clipped to 1.0004 ; seq 1: s = exp(0) = 1 -> loss +1
    assert approx(loss, (-1.0004 + 1.0) / 2, tol=1e-6)
    assert approx(m["clipfrac"], 0.5) and approx(m["ratio_mean"], (math.exp(0.2) + 1) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]]), atol=1e-6)
    # wide clip: gradient equals that of -A * exp(mean log ratio), seq-mean
    logp2 = logp.detach().clone().requires_grad_()
    wide, _ = get_policy_loss("gspo")(logp2, old, adv, mask, clip_low=10.0, clip_high=10.0)
    wide.backward()
    logp3 = logp.detach().clone().requires_grad_()
    s = torch.exp((logp3 * mask).sum(-1) / 2)
    (-(adv * s).mean()).backward()
    assert approx(wide, float(-(adv * s.detach()).mean()))
    assert torch.allclose(logp2.grad, logp3.grad, atol=1e-6)


def test_policy_loss_registry():
    assert get_policy_loss("vanilla") is ppo_clip_loss and get_policy_loss("gspo") is gspo_loss
    assert {"ppo", "gspo"} <= set(list_policy_losses())
    with pytest.raises(ValueError, match="known"):
        get_policy_loss("nope")
    with pytest.raises(ValueError, match="already"):
        register_policy_loss("ppo")(lambda *a, **k: None)


def test_value_loss_clipped_by_hand():
    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    loss, m = value_loss(values, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.5, 0.0]]), torch.ones(1, 2), clip_range=0.2)
    # t0: max(.25, (.7-1.5)^2=.64) ; t1: max(4, .49) -> 0.5 * mean(.64, 4)
    assert approx(loss, 0.5 * (0.64 + 4.0) / 2) and approx(m["vf_clipfrac"], 0.5)
    plain, _ = value_loss(values, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.5, 0.0]]), torch.ones(1, 2), clip_range=None)
    assert approx(plain, 0.5 * (0.25 + 4.0) / 2)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert approx(kl_estimate(logp, ref, "k1"), math.log(2))
    assert approx(kl_estimate(logp, ref, "k2"), 0.5 * math.log(2) ** 2)
    assert approx(kl_estimate(logp, ref, "k3"), 0.5 + math.log(2) - 1)
    loss, m = kl_loss(logp, ref, torch.ones(1, 1), coef=0.1, kind="k3")
    assert approx(loss, 0.1 * (0.5 + math.log(2) - 1)) and approx(m["kl"], 0.5 + math.log(2) - 1)
    assert kl_estimate(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k9")


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.75), math.log(0.5)]]))
    ent = entropy_from_logits(logits)
    assert torch.allclose(ent, torch.tensor([[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)]]))
    # equals log_softmax + gather (values and gradients), in any chunking
    torch.manual_seed(0)
    x = torch.randn(3, 5, 11, requires_grad=True)
    t = torch.randint(0, 11, (3, 5))
    ref = torch.log_softmax(x, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    for chunk in (1, 4, 15, 1024):
        out = token_logprobs(x, t, chunk_tokens=chunk)
        (g,) = torch.autograd.grad(out.sum(), x)
        assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(g, g_ref, atol=1e-6)
    # bf16 logits: float32 math, gradient in bf16 matching float32 autograd on the same values
    xb = x.detach().bfloat16().requires_grad_()
    bf = token_logprobs(xb, t, chunk_tokens=4)
    ref_b = torch.log_softmax(xb.detach().float(), -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    assert bf.dtype == torch.float32 and torch.allclose(bf, ref_b, atol=1e-5)
    weights = torch.randn(3, 5)
    (bf * weights).sum().backward()
    xf = xb.detach().float().requires_grad_()
    ((torch.log_softmax(xf, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)) * weights).sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and torch.allclose(xb.grad.float(), xf.grad, atol=1e-2)
    assert torch.autograd.gradcheck(
        lambda z: token_logprobs(z, t[:1, :2] % 4, chunk_tokens=1), (torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True),)
    )
    # entropy: chunking does not change values or gradients
    (ge,) = torch.autograd.grad(entropy_from_logits(x, chunk_tokens=1024).sum(), x)
    (ge4,) = torch.autograd.grad(entropy_from_logits(x, chunk_tokens=4).sum(), x)
    assert torch.allclose(ge, ge4, atol=1e-6)


def test_entropy_bonus_from_logits_or_entropies():
    logits = torch.zeros(1, 2, 4)
    loss, m = entropy_bonus(torch.tensor([[1, 0]]), coef=0.01, logits=logits)
    assert approx(loss, -0.01 * math.log(4)) and approx(m["entropy"], math.log(4))
    loss2, _ = entropy_bonus(torch.tensor([[1, 1]]), coef=1.0, entropies=torch.tensor([[1.0, 3.0]]))
    assert approx(loss2, -2.0)
    with pytest.raises(ValueError):
        entropy_bonus(torch.ones(1, 2), coef=1.0)


def test_token_logprobs_keeps_no_full_float32_copy_for_backward():
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    logits = torch.randn(2, 8, 100, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 100, (2, 8))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits * 1, targets, chunk_tokens=4)
    # the bf16 logits (+ targets and the [N] logsumexp), not a float32 [N, V] log-softmax
    assert sum(saved) <= 2 * 8 * 100 * 2 + 16 * 8 + 16 * 4
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.log_softmax((logits * 1).float(), -1).gather(-1, targets.unsqueeze(-1))
    assert sum(saved) >= 2 * 8 * 100 * 4  # the naive way keeps a float32 copy


def test_truncated_is_weights_multiply_each_tokens_loss_hand_computed():
    # Two tokens, both at ratio 1 against the proximal policy (old == current): the PPO term is
    # -A per token. The sampler (behaviour policy) had p = 0.25 where the proximal policy has 0.5
    # (weight 2, truncated to the cap 1.5), and p = 0.5 where it has 0.25 (weight 0.5).
    old = torch.log(torch.tensor([[0.5, 0.25]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.5]]))
    w = truncated_is_weights(old, behaviour, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5]]))
    logp = old.clone().requires_grad_(True)
    mask = torch.ones(1, 2)
    loss, m = ppo_clip_loss(logp, old, torch.tensor([2.0]), mask, is_weights=w)
    assert loss.item() == pytest.approx(-(2.0 * 1.5 + 2.0 * 0.5) / 2)  # token-mean of -A w r
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0 * 1.5 / 2, -2.0 * 0.5 / 2]]))  # d(-A w r)/dlogp = -A w r / N
    assert m["ratio_mean"] == pytest.approx(1.0)
    # gspo: the weight multiplies each token's loss too
    g_loss, _ = gspo_loss(old.clone(), old, torch.tensor([2.0]), mask, is_weights=w)
    assert g_loss.item() == pytest.approx(-(2.0 * 1.5 + 2.0 * 0.5) / 2)
    # no weights: the plain PPO loss
    plain, _ = ppo_clip_loss(old.clone(), old, torch.tensor([2.0]), mask)
    assert plain.item() == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="is_weights"):
        ppo_clip_loss(old.clone(), old, torch.tensor([2.0]), mask, is_weights=torch.ones(2))
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, behaviour, cap=0)


def test_is_weights_are_data_not_gradient():
    old = torch.zeros(1, 3)
    behaviour = torch.full((1, 3), -0.1, requires_grad=True)
    w = truncated_is_weights(old, behaviour, cap=10.0)
    assert not w.requires_grad and torch.allclose(w, torch.full((1, 3), math.exp(0.1)))
