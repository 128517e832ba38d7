"""The trainable policy (full or LoRA), its frozen reference, optimizer and LR schedule.

The policy is the rollout generator's own model object, trained in place: after each update
the next rollout samples from the new weights with no copy or reload.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlfactory.train.batch import TrainBatch
from rlfactory.config import LoraSection, TrainerConfig
from rlfactory.train.logprobs import batched_logprobs


def apply_lora(model: nn.Module, lora: LoraSection) -> nn.Module:
    """Wrap `model` with peft LoRA adapters (injected in place: `model` itself now runs them).

    Only the adapter weights require gradients afterwards. Returns the PeftModel.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def load_lora_weights(peft_model: nn.Module, adapter_dir: str | Path) -> None:
    """Load a saved adapter (peft `save_pretrained` folder) into `peft_model`'s active adapter."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    set_peft_model_state_dict(peft_model, state)


def load_full_weights(model: nn.Module, model_dir: str | Path) -> None:
    """Copy the weights of a `save_pretrained` folder into `model` in place (same architecture)."""
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    state = saved.state_dict()
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings may be absent from one side; anything else is a real mismatch.
    real = [k for k in list(missing) + list(unexpected) if "lm_head" not in k]
    if real:
        raise ValueError(f"checkpoint {model_dir} does not match the model: {real[:5]}")


class ReferencePolicy:
    """The frozen starting policy that the KL penalty pulls towards.

    Full fine-tuning keeps a deep copy of the weights it is built from (build it before loading
    a checkpoint, so a resumed run keeps the original reference); LoRA needs no copy: the base
    model with its adapters switched off is the reference.
    """

    def __init__(self, policy: nn.Module, lora: bool) -> None:
        self.lora = lora
        self.policy = policy
        self.copy: nn.Module | None = None
        if not lora:
            self.copy = copy.deepcopy(policy).eval()
            for p in self.copy.parameters():
                p.requires_grad_(False)

    def logprobs(self, batch: TrainBatch, micro_batch_size: int | None, **forward: Any) -> torch.Tensor:
        """Reference logprob of each completion token: [B, Lc]. `forward`: batched_logprobs options.
        Under the FSDP learner `copy` is a sharded PolicyModule (Trainer replaces it)."""
        if self.copy is not None:
            return batched_logprobs(self.copy, batch, micro_batch_size, **forward)
        with self.policy.disable_adapter():
            return batched_logprobs(self.policy, batch, micro_batch_size, **forward)


def make_optimizer(params: list[nn.Parameter], trainer: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW over `params`; the fused CUDA kernel (one launch for all tensors) when they all live on
    a GPU, else torch's default implementation."""
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=trainer.lr, weight_decay=trainer.weight_decay, fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, trainer: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps` optimizer updates, then constant."""
    warm = trainer.warmup_steps

    def factor(n: int) -> float:
        return min(1.0, (n + 1) / warm) if warm > 0 else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
