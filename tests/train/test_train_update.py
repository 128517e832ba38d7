"""Batching of trajectories, the loss mask, and the policy update on a tiny random Qwen3."""

from __future__ import annotations

import copy

import pytest
import torch

from train_fixtures import make_traj, tiny_qwen3
from rlfactory.train.batch import collate
from rlfactory.config import AlgoConfig, TrainerConfig
from rlfactory.train.logprobs import batched_logprobs, policy_forward
from rlfactory.train.model import make_optimizer, make_scheduler
from rlfactory.train.update import PolicyUpdate, UpdateData


def _traj_a(obs=(30, 31, 32)):
    return make_traj([("prompt", [1, 2, 3]), ("model", [10, 11]), ("observation", list(obs)), ("model", [12, 13, 14])], lp=-0.5)


def _traj_b(tail=(40, 41)):
    # ends with an observation: its tokens are never the input of a loss position
    return make_traj([("prompt", [1, 2]), ("model", [20, 21, 22]), ("observation", list(tail))], lp=-0.25)


def test_collate_shares_prompts_and_aligns_mask_and_sampler_logprobs():
    b = collate([_traj_a(), _traj_b(), _traj_a((33,))], pad_id=0)
    assert b.prompt_ids.tolist() == [[1, 2, 3], [1, 2, 0]] and b.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b.prompt_index.tolist() == [0, 1, 0]  # equal prompts are stored once
    assert b.completion_ids[0].tolist() == [10, 11, 30, 31, 32, 12, 13, 14]
    assert b.loss_mask[0].tolist() == [1, 1, 0, 0, 0, 1, 1, 1]
    assert b.sampler_logprobs[0].tolist() == [-0.5, -0.5, 0, 0, 0, -0.5, -0.5, -0.5]
    assert b.completion_ids[1].tolist() == [20, 21, 22, 40, 41, 0, 0, 0]
    assert b.completion_mask[1].tolist() == [1] * 5 + [0] * 3
    assert b.loss_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert b.num_tokens() == 11 + 7 + 9
    sub = b.select([1])
    assert sub.prompt_ids.tolist() == [[1, 2]] and sub.prompt_index.tolist() == [0]
    assert sub.completion_ids.shape == (1, 5) and sub.loss_mask.shape == (1, 5)


def _plain_logprobs(model, traj, temperature=1.0):
    """Reference: one plain HF forward of the whole unpadded trajectory."""
    ids = torch.tensor([traj.input_ids])
    logits = model(input_ids=ids).logits[0, :-1].float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[traj.prompt_len - 1 :]


@pytest.mark.filterwarnings("error:.*past_key_values:FutureWarning")  # transformers >= 5.24 calls it `cache`
@pytest.mark.parametrize("share_prefix", [True, False])
def test_forward_matches_a_plain_forward_of_each_trajectory(share_prefix):
    model = tiny_qwen3()
    trajs = [_traj_a(), _traj_b(), _traj_a((33, 34)), make_traj([("prompt", [5, 6, 7, 8]), ("model", [9])])]
    batch = collate(trajs, pad_id=0)
    logp, ent = policy_forward(model, batch, temperature=0.7, with_entropy=True, share_prefix=share_prefix)
    for i, t in enumerate(trajs):
        n = len(t.input_ids) - t.prompt_len
        expected = _plain_logprobs(model, t, 0.7) * batch.loss_mask[i, :n]
        assert torch.allclose(logp[i, :n], expected, atol=1e-5), i
    assert (ent[batch.loss_mask > 0] > 0).all() and (ent[batch.loss_mask == 0] == 0).all()


def _updater(model, algo=None, **kw):
    algo = algo or AlgoConfig()
    tr = TrainerConfig(lr=1e-2)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, tr)
    return PolicyUpdate(model, opt, make_scheduler(opt, tr), algo, **kw)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _backward_once(model, trajs, adv, algo=None, share_prefix=True):
    batch = collate(trajs, pad_id=0)
    up = _updater(model, algo, share_prefix=share_prefix)
    model.zero_grad()
    data = UpdateData(batch, torch.tensor(adv), old_logp=None)
    up._seen = torch.zeros(batch.loss_mask.shape)
    list(up._accumulate(data, torch.arange(len(batch))))
    return batch, _grads(model)


def test_hidden_state_gradients_are_zero_off_the_loss_mask():
    tiny_model = tiny_qwen3()
    captured = []

    def hook(_m, _i, out):
        out.retain_grad()
        captured.append(out)

    tiny_model.model.norm.register_forward_hook(hook)  # the last-layer states the LM head reads
    trajs = [_traj_a(), _traj_b()]
    batch, _ = _backward_once(tiny_model, trajs, [1.0, -1.0], AlgoConfig(entropy_coef=0.01, kl_coef=0.0), share_prefix=False)
    (h,) = captured  # one full forward: [B, Lp + Lc, H]; column Lp + j - 1 predicts completion token j
    lp = batch.prompt_ids.shape[1]
    g = h.grad.abs().sum(-1)  # [B, Lp + Lc]
    for i, t in enumerate(trajs):
        plen = t.prompt_len
        predicts_model_token = {plen - 1 if j == 0 else lp + j - 1 for j in range(batch.loss_mask.shape[1]) if batch.loss_mask[i, j] > 0}
        for col in range(g.shape[1]):
            if col in predicts_model_token:
                assert g[i, col] > 0, (i, col)
            else:
                assert g[i, col] == 0, (i, col)  # prompt, observation and padding: exactly zero


def test_changing_observation_targets_leaves_parameter_gradients_unchanged():
    m1, m2 = tiny_qwen3(), tiny_qwen3()
    _, g1 = _backward_once(m1, [_traj_a(), _traj_b((40, 41))], [1.0, -1.0])
    _, g2 = _backward_once(m2, [_traj_a(), _traj_b((55, 3))], [1.0, -1.0])
    assert g1.keys() == g2.keys() and g1
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k
    # control: the test can fail — changing a model token does change the gradients
    m3 = tiny_qwen3()
    _, g3 = _backward_once(m3, [_traj_a(), make_traj([("prompt", [1, 2]), ("model", [20, 5, 22]), ("observation", [40, 41])], lp=-0.25)], [1.0, -1.0])
    assert any(not torch.equal(g1[k], g3[k]) for k in g1)


SPLITS = [dict(group_by_length=False), dict(micro_batch_size=1, group_by_length=False), dict(),
          dict(micro_batch_size=1), dict(micro_batch_tokens=8)]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_same_update(agg, monkeypatch):
    trajs = [_traj_a(), _traj_b(), _traj_a((33, 34)), _traj_b((42,))]
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0])
    results, passes = [], []
    accumulate = PolicyUpdate._accumulate

    def spy(self, data, idx, *args):
        passes[-1].append(sorted(idx.tolist()))
        yield from accumulate(self, data, idx, *args)

    monkeypatch.setattr(PolicyUpdate, "_accumulate", spy)
    for split in SPLITS:
        passes.append([])
        model = tiny_qwen3()
        algo = AlgoConfig(loss_agg=agg, kl_coef=0.0, **split)
        up = _updater(model, algo, norm_constant=16.0)
        # plain SGD: Adam would blow float noise on near-zero gradients up to lr-sized steps
        up.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        up.scheduler = torch.optim.lr_scheduler.LambdaLR(up.optimizer, lambda _: 1.0)
        metrics, _ = up(UpdateData(collate(trajs, 0), adv, old_logp=None), torch.Generator().manual_seed(0))
        results.append((model, metrics))
    # completions (after prompts [1, 2, 3] / [1, 2]): 8, 5, 7, 4 tokens
    assert passes == [[[0, 1, 2, 3]], [[0], [1], [2], [3]], [[0, 1, 2, 3]], [[3], [1], [2], [0]], [[3], [1], [2], [0]]]
    m1, r1 = results[0]
    for m2, r2 in results[1:]:
        for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
            assert torch.allclose(p1, p2, atol=1e-6), n
        assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], abs=1e-6)
        # every term is normalised by the run's constant, never by a pass's padded width
        assert r1["policy/entropy"] == pytest.approx(r2["policy/entropy"], abs=1e-6)


def test_the_update_passes_group_trajectories_of_similar_length(monkeypatch):
    """Two short and two long trajectories in turn: by length they train in two passes, a short
    and a long one (padding everything to the longest would nearly double the positions)."""
    short = [("prompt", [1, 2, 3]), ("model", [10, 11]), ("observation", [30]), ("model", [12])]
    long = [("prompt", [1, 2, 3]), ("model", [10, 11]), ("observation", [30 + i % 20 for i in range(40)]), ("model", [12, 13])]
    trajs = [make_traj(short), make_traj(long), make_traj(short), make_traj(long)]
    seen = []
    accumulate = PolicyUpdate._accumulate

    def spy(self, data, idx, *args):
        seen.append(sorted(idx.tolist()))
        yield from accumulate(self, data, idx, *args)

    monkeypatch.setattr(PolicyUpdate, "_accumulate", spy)
    up = _updater(tiny_qwen3(), AlgoConfig(kl_coef=0.0))
    up(UpdateData(collate(trajs, 0), torch.tensor([1.0, -1.0, 0.5, -0.5]), old_logp=None), torch.Generator().manual_seed(0))
    assert seen == [[0, 2], [1, 3]]


def test_update_raises_logprob_of_positively_rewarded_tokens():
    tiny_model = tiny_qwen3()
    trajs = [_traj_a(), _traj_b()]
    batch = collate(trajs, 0)
    before = batched_logprobs(tiny_model, batch, None)
    up = _updater(tiny_model, AlgoConfig(epochs=2, minibatch_size=1))
    old = batched_logprobs(tiny_model, batch, None)
    metrics, logp_before = up(UpdateData(batch, torch.tensor([1.0, -1.0]), old_logp=old), torch.Generator().manual_seed(0))
    after = batched_logprobs(tiny_model, batch, None)
    m = batch.loss_mask
    gain = ((after - before) * m).sum(1) / m.sum(1)
    assert gain[0] > 0 and gain[1] < 0
    assert metrics["optim/updates"] == 4 and metrics["optim/grad_norm"] > 0
    for key in ("loss/total", "loss/policy", "policy/clipfrac", "policy/entropy", "optim/lr"):
        assert key in metrics
    assert torch.equal(logp_before, old)


def test_single_pass_returns_the_pre_update_logprobs():
    tiny_model = tiny_qwen3()
    batch = collate([_traj_a(), _traj_b()], 0)
    expected = batched_logprobs(tiny_model, batch, None) * batch.loss_mask
    up = _updater(tiny_model)
    assert up.single_pass(2)
    _, logp_before = up(UpdateData(batch, torch.tensor([1.0, -1.0]), old_logp=None), torch.Generator())
    assert torch.allclose(logp_before * batch.loss_mask, expected, atol=1e-5)


def test_kl_penalty_and_bf16_autocast_on_cpu():
    tiny_model = tiny_qwen3()
    ref = copy.deepcopy(tiny_model)
    batch = collate([_traj_a(), _traj_b()], 0)
    ref_logp = batched_logprobs(ref, batch, None, bf16=True)
    assert torch.isfinite(ref_logp).all()
    up = _updater(tiny_model, AlgoConfig(kl_coef=0.1, epochs=2), bf16=True)
    metrics, _ = up(UpdateData(batch, torch.tensor([1.0, -1.0]), old_logp=ref_logp, ref_logp=ref_logp), torch.Generator())
    assert metrics["policy/kl"] >= 0 and torch.isfinite(torch.tensor(metrics["loss/total"]))


def test_bf16_logits_are_upcast_chunkwise_with_the_whole_tensors_values_and_gradients():
    """At temperature 1 policy_forward hands the head's bf16 logits to the chunked logprob and
    entropy functions without a float32 copy of the whole [N, V] tensor; values and gradients are
    those of upcasting the whole tensor first (the code path before)."""
    from rlfactory.algos.utils import entropy_from_logits, token_logprobs
    from rlfactory.train.logprobs import autocast, decoder_and_head, predictive_hidden

    model = tiny_qwen3().to(torch.bfloat16)
    batch = collate([_traj_a(), _traj_b(), _traj_a((33, 34))], pad_id=0)
    sel = batch.loss_mask > 0
    logp, ent = policy_forward(model, batch, bf16=True, with_entropy=True, entropy_grad=False)
    logp[sel].sum().backward()
    new = _grads(model)
    model.zero_grad(set_to_none=True)
    decoder, head = decoder_and_head(model)
    with autocast(batch.completion_ids.device, True):
        logits = head(predictive_hidden(decoder, batch)[sel])
    assert logits.dtype == torch.bfloat16
    whole = logits.float()
    old_logp = token_logprobs(whole.unsqueeze(0), batch.targets[sel].unsqueeze(0))[0]
    old_logp.sum().backward()
    assert torch.equal(logp[sel], old_logp.detach())
    assert torch.equal(ent[sel], entropy_from_logits(whole.detach().unsqueeze(0))[0])
    old = _grads(model)
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)


def _positions(passes, lc, lp, key):
    """Token positions the passes compute: rows x longest completion + prompts x longest prompt."""
    return sum(len(p) * max(lc[i] for i in p) + len({key[i] for i in p}) * max(lp[i] for i in p) for p in passes)


def test_plan_micro_batches_cuts_padding_and_keeps_its_bounds():
    import random

    from rlfactory.passes import PASS_OVERHEAD_TOKENS, plan_micro_batches

    # one equal-length group per prompt: one pass, nothing to save
    assert plan_micro_batches([50] * 8, [20] * 8, [7] * 8) == [list(range(8))]
    assert plan_micro_batches([], [], []) == []
    # two clusters of lengths, interleaved: one pass per cluster, each prompt's rows together
    lc, lp, key = [10, 900, 12, 905, 11, 902], [30] * 6, [0, 1, 0, 1, 0, 1]
    assert plan_micro_batches(lc, lp, key) == [[0, 2, 4], [1, 3, 5]]
    rng = random.Random(0)
    for trial in range(50):
        n = rng.randint(1, 40)
        lc = [rng.choice([rng.randint(1, 30), rng.randint(200, 800)]) for _ in range(n)]
        key = [rng.randint(0, 5) for _ in range(n)]
        lp = [10 + 7 * k for k in key]
        size = rng.choice([None, 1, 3, 8])
        cap = rng.choice([None, 500, 2000])
        passes = plan_micro_batches(lc, lp, key, size, cap)
        assert sorted(i for p in passes for i in p) == list(range(n))  # every row once
        assert all(p == sorted(p) and p for p in passes)
        assert all(len(p) <= (size or n) for p in passes)
        assert all(len(p) == 1 or _positions([p], lc, lp, key) <= cap for p in passes if cap)
        if size is None and cap is None:  # never worse than one pass over everything
            one = _positions([list(range(n))], lc, lp, key) + PASS_OVERHEAD_TOKENS
            assert _positions(passes, lc, lp, key) + PASS_OVERHEAD_TOKENS * len(passes) <= one


def test_row_layout_plans_each_ranks_passes_from_the_global_shapes():
    from rlfactory.train.parallel import RowLayout

    # rows 0..5 on ranks 0,1,0,1,0,1; rank 0 holds two short rows and a long one, rank 1 three short
    shape = torch.tensor([[5, 3, 0], [5, 3, 0], [6, 3, 0], [4, 3, 1], [400, 3, 1], [6, 3, 1]])
    owner = torch.tensor([0, 1, 0, 1, 0, 1])
    ranks = [RowLayout(owner, torch.ones(6), rank=r, world_size=2, shape=shape) for r in (0, 1)]
    every = torch.arange(6)
    assert [c.tolist() for c in ranks[0].micro_batches(every, None, by_length=True)] == [[0, 1], [2]]
    assert [c.tolist() for c in ranks[1].micro_batches(every, None, by_length=True)] == [[0, 1, 2]]
    assert ranks[0].passes(every, None, by_length=True) == ranks[1].passes(every, None, by_length=True) == 2
    # without shapes, or not by length: consecutive chunks as before
    assert ranks[1].passes(every, 2) == 2 and ranks[1].passes(every, None) == 1
    assert [c.tolist() for c in RowLayout(owner, torch.ones(6), 1, 2).micro_batches(every, None, by_length=True)] == [[0, 1, 2]]


def test_micro_batch_tokens_needs_group_by_length():
    with pytest.raises(ValueError, match="algo.micro_batch_tokens needs algo.group_by_length"):
        AlgoConfig(micro_batch_tokens=4096, group_by_length=False)
    with pytest.raises(ValueError, match="algo.micro_batch_tokens must be >= 1"):
        AlgoConfig(micro_batch_tokens=0)


def test_old_logprobs_and_values_in_the_updates_passes_equal_one_pass():
    from rlfactory.train.critic import Critic

    trajs = [_traj_a(), _traj_b(), _traj_a((33, 34)), _traj_b((42,))]
    batch = collate(trajs, 0)
    model = tiny_qwen3()
    passes = [torch.tensor([3, 1]), torch.tensor([2]), torch.tensor([0])]
    whole = batched_logprobs(model, batch, None)
    assert torch.allclose(batched_logprobs(model, batch, None, chunks=passes), whole, atol=1e-6)
    critic = Critic(tiny_qwen3(1))
    torch.nn.init.normal_(critic.head.weight)  # a fresh critic's head is zero
    values = critic.values(batch, None)
    assert values.abs().max() > 0.1
    real = batch.completion_mask.bool()  # a pass's padding is its own (GAE never reads it)
    assert torch.allclose(critic.values(batch, None, chunks=passes)[real], values[real], atol=1e-6)
