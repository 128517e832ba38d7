"""trainer.kernels resolved for a run (rlfactory/train/kernels.py), and the Liger hook's switching.

liger-kernel needs CUDA and triton, so here a stand-in for its `apply_liger_kernel_to_qwen3` does
what the real one does to a model (module globals swapped, forwards bound to the model's RMSNorm
and MLP instances) and counts its calls; the real kernels are checked against the unpatched model
on a GPU in tests/train/test_train_fused_head_gpu.py."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from torch import nn

from train_fixtures import make_traj, tiny_qwen3
from rlfactory.config import ConfigError
from rlfactory.config.kernels import KernelsConfig
from rlfactory.train.batch import collate
from rlfactory.train.kernels import apply_liger, in_training_pass, resolve_kernels, training_pass
from rlfactory.train.logprobs import decoder_and_head, policy_forward
from rlfactory.train.kernels import TrainKernels

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models; a shared CPU


def _resolve(model, **cfg):
    return resolve_kernels(KernelsConfig(**cfg), model, *decoder_and_head(model), CPU)


def test_cpu_defaults_are_todays_path():
    k = _resolve(tiny_qwen3())
    assert (k.fused_head, k.liger, k.packed, k.compile) == (False, False, False, False)
    assert _resolve(tiny_qwen3(), fused_head="on", head_chunk_tokens=7) == TrainKernels(fused_head=True, head_chunk_tokens=7)


def test_liger_on_without_cuda_is_one_config_error():
    with pytest.raises(ConfigError) as err:
        _resolve(tiny_qwen3(), liger="on")
    assert str(err.value) == "trainer.kernels.liger: on, but Liger's kernels need CUDA (the policy is on cpu)"


def test_fused_head_falls_back_for_a_wrapped_head(capsys):
    model = tiny_qwen3()
    decoder, _ = decoder_and_head(model)
    k = resolve_kernels(KernelsConfig(fused_head="on"), model, decoder, nn.Sequential(nn.Linear(2, 2)), CPU)
    assert not k.fused_head
    assert "trainer.kernels.fused_head: the LM head is a Sequential" in capsys.readouterr().err


def test_fused_head_falls_back_under_lora_on_the_head(capsys):
    from rlfactory.config import LoraSection
    from rlfactory.train.model import apply_lora

    model = tiny_qwen3()
    apply_lora(model, LoraSection(target_modules=["q_proj", "lm_head"]))
    assert not _resolve(model, fused_head="on").fused_head
    assert "not a plain torch.nn.Linear" in capsys.readouterr().err
    plain = tiny_qwen3()
    apply_lora(plain, LoraSection())  # peft leaves lm_head alone by default: the fused head stays
    assert _resolve(plain, fused_head="on").fused_head


# ---- the Liger hook, with a stand-in for liger-kernel's patch function ---------------------------

CALLS: list[str] = []


def _fake_liger(monkeypatch):
    """A `liger_kernel.transformers.monkey_patch` whose qwen3 patch acts as liger 0.8.5's does."""
    from transformers.models.qwen3 import modeling_qwen3

    for name in ("apply_rotary_pos_emb", "Qwen3RMSNorm", "Qwen3MLP"):  # put back after the test
        monkeypatch.setattr(modeling_qwen3, name, getattr(modeling_qwen3, name))
    original_rope = modeling_qwen3.apply_rotary_pos_emb

    def rope_fn(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        CALLS.append("rope")
        return original_rope(q, k, cos, sin, unsqueeze_dim)

    def norm_forward(self, x):
        CALLS.append("norm")
        return type(self).forward(self, x)

    def mlp_forward(self, x):
        CALLS.append("mlp")
        return type(self).forward(self, x)

    class LigerRMSNorm(nn.Module):
        pass

    def apply(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True,
              model=None):  # liger 0.8.5's signature for qwen3
        assert (rope, rms_norm, swiglu, cross_entropy, fused_linear_cross_entropy) == (True, True, True, False, False)
        modeling_qwen3.apply_rotary_pos_emb = rope_fn
        modeling_qwen3.Qwen3RMSNorm = LigerRMSNorm
        modeling_qwen3.Qwen3MLP = LigerRMSNorm
        for layer in model.model.layers:
            layer.mlp.forward = types.MethodType(mlp_forward, layer.mlp)
            for norm in (layer.input_layernorm, layer.post_attention_layernorm, layer.self_attn.q_norm,
                         layer.self_attn.k_norm):
                norm.forward = types.MethodType(norm_forward, norm)
        model.model.norm.forward = types.MethodType(norm_forward, model.model.norm)

    fake = types.ModuleType("liger_kernel.transformers.monkey_patch")
    fake.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen3": apply}
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", fake)
    return modeling_qwen3, LigerRMSNorm


def _batch():
    return collate([make_traj([("prompt", [1, 2, 3]), ("model", [10, 11, 12])]),
                    make_traj([("prompt", [4, 5]), ("model", [20, 21]), ("observation", [7]), ("model", [8])])], pad_id=0)


def test_liger_runs_only_in_training_passes_and_leaves_the_classes(monkeypatch):
    modeling, liger_class = _fake_liger(monkeypatch)
    original_norm_class = modeling.Qwen3RMSNorm
    model = tiny_qwen3()
    ids = torch.tensor([[1, 2, 3, 4]])
    before = model(input_ids=ids).logits
    assert apply_liger(model) == 2 * 5 + 1  # per layer: mlp and four norms; the final norm
    assert modeling.Qwen3RMSNorm is original_norm_class and modeling.Qwen3MLP is not liger_class
    CALLS.clear()
    assert torch.equal(model(input_ids=ids).logits, before)  # the generator's forwards: untouched
    assert CALLS == []
    logp, _ = policy_forward(model, _batch(), kernels=TrainKernels(liger=True))
    assert {"rope", "norm", "mlp"} <= set(CALLS) and not in_training_pass()
    CALLS.clear()
    plain, _ = policy_forward(model, _batch())
    assert CALLS == [] and torch.equal(plain, logp)
    apply_liger(tiny_qwen3(1))  # a second model: the rotary switch is not stacked
    CALLS.clear()
    with training_pass():
        model(input_ids=ids)
    assert CALLS.count("rope") == 2  # once per layer, not twice


def test_a_deepcopy_switches_between_its_own_forwards(monkeypatch):
    _fake_liger(monkeypatch)
    model = tiny_qwen3()
    apply_liger(model)
    twin = copy.deepcopy(model)  # the reference policy, FSDP's sharded copy, the async generator's copy
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.5)
    ids = torch.tensor([[1, 2, 3]])
    with training_pass():
        CALLS.clear()
        out = twin(input_ids=ids).logits
        assert "norm" in CALLS
    assert torch.equal(out, twin(input_ids=ids).logits) and not torch.equal(out, model(input_ids=ids).logits)


@pytest.mark.parametrize("variant", ["drgrpo_entropy_norm", "gae_epochs"])
def test_a_run_with_the_fused_head_reproduces_the_golden_numbers(tmp_path, variant):
    """`rlfactory train` with trainer.kernels.fused_head: on (the Learner resolves it; old logprobs,
    the update and the entropy gradient go through the fused head) gives test_train_golden's numbers."""
    from rlfactory.cli.main import main
    from rlfactory.train.runlog import read_metrics
    from test_train_golden import GOLDEN, KEYS, VARIANTS
    from train_fixtures import run_config

    sections = copy.deepcopy(VARIANTS[variant])
    sections.setdefault("trainer", {})["kernels"] = {"fused_head": "on", "head_chunk_tokens": 5}
    assert main(["train", run_config(tmp_path, **sections)]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    got = [{k: r[k] for k in KEYS if k in r} for r in records]
    assert len(got) == len(GOLDEN[variant])
    for step, (g, want) in enumerate(zip(got, GOLDEN[variant])):
        for key, value in want.items():
            assert g[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)


def test_liger_stays_off_under_gradient_checkpointing(monkeypatch, capsys):
    # its recomputation in the backward runs on autograd's thread, outside the training pass, so
    # transformers' code would recompute what Liger's saved (CheckpointError on an H200)
    import rlfactory.train.kernels as kernels_mod

    monkeypatch.setattr(kernels_mod, "liger_unavailable", lambda model, device: None)  # as on CUDA
    assert _resolve(tiny_qwen3(), liger="auto").liger  # the check below can fail
    model = tiny_qwen3()
    model.gradient_checkpointing_enable()
    assert not _resolve(model, liger="auto").liger
    assert "trainer.kernels.liger: off, since gradient checkpointing" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="trainer.kernels.liger: on, but gradient checkpointing"):
        _resolve(model, liger="on")
