"""Sampling settings and the recorded-logprob convention."""

from __future__ import annotations

import pytest
import torch

from rlfactory.config import SamplingConfig
from rlfactory.generation.sampling import RowSampling, sample


def rows(*settings):
    return RowSampling.of(list(settings))


def test_greedy_takes_argmax_and_records_temperature_one_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    tok, lp = sample(logits, rows(SamplingConfig(greedy=True), SamplingConfig(temperature=0)))
    assert tok.tolist() == [1, 0]
    assert torch.allclose(lp, logits.log_softmax(-1)[[0, 1], [1, 0]])


def test_logprob_is_temperature_scaled_log_softmax_before_truncation():
    torch.manual_seed(0)
    logits = torch.randn(64, 50)
    s = SamplingConfig(temperature=0.5, top_k=5, top_p=0.9)
    tok, lp = sample(logits, rows(*[s] * 64), torch.Generator().manual_seed(1))
    want = (logits / 0.5).log_softmax(-1).gather(1, tok[:, None]).squeeze(1)
    assert torch.allclose(lp, want)
    assert s.logprob_temperature == 0.5 and SamplingConfig(greedy=True, temperature=0.5).logprob_temperature == 1.0


def test_top_k_only_draws_from_the_k_best():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]]).repeat(2000, 1)
    tok, _ = sample(logits, rows(*[SamplingConfig(top_k=2)] * 2000), torch.Generator().manual_seed(0))
    assert set(tok.tolist()) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    tok, _ = sample(logits, rows(*[SamplingConfig(top_p=0.75)] * 4000), torch.Generator().manual_seed(0))
    assert set(tok.tolist()) == {0, 1}  # 0.5 < 0.75, 0.5 + 0.3 >= 0.75
    frac0 = (tok == 0).float().mean().item()
    assert 0.55 < frac0 < 0.70  # renormalised: 0.5 / 0.8 = 0.625


def test_plain_sampling_matches_the_distribution_and_rows_mix():
    logits = torch.tensor([[0.0, 1.0]]).repeat(4000, 1)
    settings = [SamplingConfig()] * 2000 + [SamplingConfig(greedy=True)] * 2000
    tok, _ = sample(logits, rows(*settings), torch.Generator().manual_seed(0))
    assert tok[2000:].eq(1).all()
    frac1 = tok[:2000].float().mean().item()
    assert abs(frac1 - torch.sigmoid(torch.tensor(1.0)).item()) < 0.04


def test_bad_settings_are_config_errors():
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)


def test_draw_follows_the_distribution_and_never_draws_a_zero_probability_token():
    from rlfactory.generation.sampling import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20000, 1) * 3  # unnormalised is fine
    tok = draw(probs, torch.rand(len(probs), generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(tok, minlength=6).float() / len(tok)
    assert freq[[0, 2, 5]].sum() == 0
    assert torch.allclose(freq[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2]), atol=0.02)
    one_hot = torch.zeros(3, 7)
    one_hot[torch.arange(3), torch.tensor([0, 6, 3])] = 1.0  # a forced token at either end or inside
    assert draw(one_hot, torch.tensor([0.0, 0.5, 0.999999])).tolist() == [0, 6, 3]


def test_a_draw_that_rounds_up_to_the_total_takes_the_last_token_of_positive_probability():
    """u * total can round up to the total, where no cdf exceeds it: the last token of probability
    > 0 is drawn, never one past the vocabulary nor a trailing zero; the other rows are unchanged."""
    from rlfactory.generation.sampling import draw

    probs = torch.tensor([[0.2, 0.0, 0.8, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2], [0.0, 0.5, 0.0, 0.5, 0.0]])
    assert draw(probs, torch.tensor([1.0, 0.45, 0.3])).tolist() == [2, 2, 1]
    assert draw(probs, torch.tensor([0.5, 1.0, 1.0])).tolist() == [2, 4, 3]
    assert draw(probs, torch.tensor([0.5, 0.45, 0.3])).tolist() == [2, 2, 1]  # none needs the fix-up


def test_seeded_uniforms_are_a_pure_function_of_seed_and_position():
    from rlfactory.generation.sampling import seeded_uniforms

    u = seeded_uniforms([1, 1, 2, 1], [0, 1, 0, 0])
    assert u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all())
    assert u[0] == u[3] and len({float(x) for x in u[:3]}) == 3
    many = seeded_uniforms(list(range(20000)), [3] * 20000)
    assert abs(float(many.mean()) - 0.5) < 0.01 and abs(float((many < 0.1).float().mean()) - 0.1) < 0.01


def test_uniform_draws_follow_the_distribution_and_each_row_only_its_own_number():
    from rlfactory.generation.sampling import seeded_uniforms

    torch.manual_seed(0)
    logits = torch.randn(6, 20)
    settings = [SamplingConfig(temperature=0.7, top_k=8), SamplingConfig(), SamplingConfig(top_p=0.5)] * 2
    u = seeded_uniforms([11, 12, 13, 14, 15, 16], [0] * 6)
    tok, lp = sample(logits, rows(*settings), uniforms=u)
    part, _ = sample(logits[[4, 1]], rows(settings[4], settings[1]), uniforms=u[[4, 1]])
    assert part.tolist() == tok[[4, 1]].tolist()  # a row's token does not depend on the others
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws, _ = sample(probs.log().repeat(20000, 1), rows(*[SamplingConfig()] * 20000),
                      uniforms=seeded_uniforms(list(range(20000)), [0] * 20000))
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert freq[1] == 0 and torch.allclose(freq, probs, atol=0.015)
