"""The weights a generator needs from the learner's policy, by their Hugging Face names: one place
that merges a LoRA adapter for the copy (every weight sync sends what this returns)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def policy_tensors(policy: nn.Module, cpu: bool = True) -> dict[str, torch.Tensor]:
    """The weights a generation server needs, by their Hugging Face names (contiguous; on CPU when
    `cpu`). A peft LoRA model is merged for the copy (W + scale * B @ A) and left as it was."""
    base_of = getattr(policy, "get_base_model", None)
    if callable(base_of) and hasattr(policy, "merge_adapter"):
        policy.merge_adapter()
        try:
            return {name.replace(".base_layer.", "."): p.detach().to("cpu" if cpu else p.device, copy=True).contiguous()
                    for name, p in base_of().named_parameters() if "lora_" not in name}
        finally:
            policy.unmerge_adapter()
    return {name: (p.detach().to("cpu") if cpu else p.detach()).contiguous() for name, p in policy.named_parameters()}


def config_of(policy: nn.Module) -> Any:
    """The Hugging Face config of `policy` (of its base model under a peft adapter), or None."""
    base = policy.get_base_model() if callable(getattr(policy, "get_base_model", None)) else policy
    return getattr(base, "config", None)
