"""A digest of a served model's weights (loading them is rlfactory.generation.weights)."""

from __future__ import annotations

import torch
from torch import nn


def weights_digest(model: nn.Module) -> str:
    """SHA-256 over the parameters' names, dtypes, shapes and bytes, in name order: equal digests
    mean equal weights (a learner checks that a server holds exactly its weights)."""
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
