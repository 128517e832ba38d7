"""The value model PPO's GAE needs: a copy of the policy's transformer body plus a scalar head."""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlfactory.train.batch import TrainBatch, micro_batches
from rlfactory.train.logprobs import autocast, predictive_hidden


class Critic(nn.Module):
    """V(state) for every completion token: values[:, j] is the value of the state before token j."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        self.body = copy.deepcopy(base.base_model)  # the decoder stack without the LM head
        for p in self.body.parameters():
            p.requires_grad_(True)
        hidden = base.config.get_text_config().hidden_size  # a vision-language config nests it
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: TrainBatch, bf16: bool = False, share_prefix: bool = True) -> torch.Tensor:
        """Values [B, Lc] float32, aligned with the completion columns of `batch`."""
        with autocast(batch.completion_ids.device, bf16):
            hidden = predictive_hidden(self.body, batch, share_prefix)
        return self.head(hidden.float()).squeeze(-1)

    @torch.no_grad()
    def values(self, batch: TrainBatch, micro_batch_size: int | None, bf16: bool = False,
               share_prefix: bool = True, chunks: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`forward` for the whole batch without gradients, in micro-batches (`chunks`: each pass's
        rows; default consecutive chunks of `micro_batch_size`): [B, Lc]."""
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.completion_ids.device)
        if chunks is None:
            chunks = micro_batches(torch.arange(len(batch), device=out.device), micro_batch_size)
        for idx in chunks:
            mb = batch.select(idx)
            v = self.forward(mb, bf16, share_prefix)
            out[idx, : v.shape[1]] = v
        return out
