"""Training logprobs of sliding-window models: padding between a prompt and its completion must not
shift the window (masks by position), with and without the shared-prompt forward."""

from __future__ import annotations

import pytest
import torch
from train_fixtures import make_traj

from rlfactory.train.batch import collate
from rlfactory.train.logprobs import policy_forward

WINDOW = 4


def models():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    dims = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, max_position_embeddings=256, sliding_window=WINDOW)
    torch.manual_seed(0)
    yield "mistral", MistralForCausalLM(MistralConfig(**dims, num_hidden_layers=2)).eval()
    torch.manual_seed(0)
    yield "gemma3", Gemma3ForCausalLM(Gemma3TextConfig(**dims, num_hidden_layers=2,
                                                       layer_types=["sliding_attention", "full_attention"])).eval()


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("name, model", list(models()), ids=lambda v: v if isinstance(v, str) else "")
def test_logprobs_match_a_full_forward_of_each_trajectory(name, model, share_prefix):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14]]  # very different lengths: lots of padding
    trajs = [make_traj([("prompt", prompts[i % 2]), ("model", [20 + i, 21, 22, 23, 24]), ("observation", [30, 31]),
                        ("model", [40, 41 + i, 42, 43])], tid=f"t{i}") for i in range(4)]
    batch = collate(trajs, 0)
    with torch.no_grad():
        logp, _ = policy_forward(model, batch, share_prefix=share_prefix)
    for b, t in enumerate(trajs):
        ids = t.input_ids
        with torch.no_grad():
            full = model(torch.tensor([ids])).logits[0].log_softmax(-1)
        plen = len(t.segments[0].token_ids)
        want = full[plen - 1: len(ids) - 1].gather(1, torch.tensor(ids[plen:])[:, None]).squeeze(1)
        mask = batch.loss_mask[b, : len(ids) - plen].bool()
        assert torch.allclose(logp[b, : len(ids) - plen][mask], want[mask], atol=1e-4), name
