"""Named weights into a model: the one way a generator's model takes new weights (`rlfactory serve`'s
updates over HTTP and from disk, Ray rollout workers' object-store pushes). A whole set is checked
(names and shapes) before any of it is copied, so a bad update leaves the model as it was."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn


class WeightsMismatch(ValueError):
    """A weight set does not fit the model (names or shapes); the model was left unchanged."""


def load_safetensors_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the `*.safetensors` files in `folder` (a Hugging Face model folder; sharded
    checkpoints are read through their index)."""
    from safetensors.torch import load_file

    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"weights folder not found: {root}")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {root}")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(str(root / name)))
    return tensors


def load_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor], what: str = "the model") -> int:
    """Copy `tensors` into `model`'s parameters by name, in place; returns how many were copied.

    Every parameter must be given once with its shape (dtype and device are converted). A name that
    is a tied alias of a parameter (e.g. `lm_head.weight` with tied embeddings) is accepted and
    ignored. Any unknown or missing name or wrong shape raises WeightsMismatch (naming `what`)
    before anything is copied."""
    params = dict(model.named_parameters())
    aliases = {k for k, v in model.state_dict(keep_vars=True).items()
               if k not in params and isinstance(v, nn.Parameter)}
    unknown = sorted(k for k in tensors if k not in params and k not in aliases)
    missing = sorted(k for k in params if k not in tensors)
    wrong = sorted(f"{k}: {tuple(tensors[k].shape)} != {tuple(p.shape)}" for k, p in params.items()
                   if k in tensors and tuple(tensors[k].shape) != tuple(p.shape))
    if unknown or missing or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unknown:
            parts.append(f"{len(unknown)} unknown (e.g. {unknown[:3]})")
        if wrong:
            parts.append(f"{len(wrong)} with the wrong shape (e.g. {wrong[:3]})")
        raise WeightsMismatch(f"the weights do not fit {what}: " + "; ".join(parts))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name].to(device=p.device, dtype=p.dtype))
    return len(params)
