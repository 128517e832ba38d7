"""What the object store carries to the workers: the policy's weights by name, LoRA merged."""

from __future__ import annotations

import pytest
import torch

from rlfactory.distributed.weights import Bf16Bits, from_wire, policy_state, to_wire, wire_bytes
from rlfactory.distributed.worker import load_state
from rlfactory.generation.weights import WeightsMismatch


def tiny_qwen3(seed: int = 0, dtype=torch.float32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def test_weights_round_trip_exactly_including_bfloat16():
    for dtype in (torch.float32, torch.bfloat16):
        src, dst = tiny_qwen3(0, dtype), tiny_qwen3(1, dtype)
        state = policy_state(src)
        assert all(isinstance(a, Bf16Bits) == (dtype == torch.bfloat16) for a in state.values())
        assert wire_bytes(state) == sum(p.numel() * p.element_size() for p in src.parameters())
        load_state(dst, state)
        assert all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters()))
    t = torch.randn(3, 4).to(torch.bfloat16)
    assert torch.equal(from_wire(to_wire(t)), t) and from_wire(t) is t


def test_a_lora_policy_is_sent_merged_under_the_base_models_names():
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(tiny_qwen3(0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # a trained adapter (B starts at zero)
    plain = tiny_qwen3(1)
    load_state(plain, policy_state(policy))
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        want, got = policy(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    assert any("lora_" in n for n, _ in policy.named_parameters())  # the adapter is left in place, unmerged
    with torch.no_grad():
        assert torch.equal(policy(input_ids=ids).logits, want)


def test_weights_that_do_not_fit_the_model_are_refused_by_name():
    state = policy_state(tiny_qwen3(0))
    state["extra.weight"] = state.pop("lm_head.weight")
    with pytest.raises(WeightsMismatch, match=r"^the weights do not fit the worker's model: 1 missing \(e.g. "
                                              r"\['lm_head.weight'\]\); 1 unknown \(e.g. \['extra.weight'\]\)$"):
        load_state(tiny_qwen3(1), state)
