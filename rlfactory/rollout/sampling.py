"""Token sampling with per-row settings, and the logprob that is recorded for each sampled token.

Convention (the trainer must use the same one for its importance ratio): the recorded logprob is
`log_softmax(logits / T)[token]` where T is the row's temperature (1.0 for greedy rows). Top-k and
top-p change which tokens can be drawn but not the recorded logprob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfactory.rollout.config import SamplingConfig


@dataclass
class RowSampling:
    """Per-row sampling settings as tensors: each field is [B]."""

    temperature: torch.Tensor  # float, 1.0 on greedy rows
    top_k: torch.Tensor  # long, 0 = off
    top_p: torch.Tensor  # float, 1.0 = off
    greedy: torch.Tensor  # bool

    @classmethod
    def of(cls, settings: list[SamplingConfig], device: torch.device | str = "cpu") -> "RowSampling":
        return cls(
            temperature=torch.tensor([s.logprob_temperature for s in settings], dtype=torch.float32, device=device),
            top_k=torch.tensor([s.top_k for s in settings], dtype=torch.long, device=device),
            top_p=torch.tensor([s.top_p for s in settings], dtype=torch.float32, device=device),
            greedy=torch.tensor([s.is_greedy for s in settings], dtype=torch.bool, device=device),
        )

    def select(self, idx: torch.Tensor) -> "RowSampling":
        return RowSampling(self.temperature[idx], self.top_k[idx], self.top_p[idx], self.greedy[idx])

    @staticmethod
    def cat(parts: list["RowSampling"]) -> "RowSampling":
        return RowSampling(
            torch.cat([p.temperature for p in parts]),
            torch.cat([p.top_k for p in parts]),
            torch.cat([p.top_p for p in parts]),
            torch.cat([p.greedy for p in parts]),
        )


def _filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p set to -inf. scaled: [B, V] -> [B, V]."""
    vocab = scaled.shape[-1]
    sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    ks = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ranks = torch.arange(vocab, device=scaled.device).unsqueeze(0)
    remove |= ranks >= ks.unsqueeze(1)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p (the first token always stays).
    before = probs.cumsum(dim=-1) - probs
    remove |= before >= top_p.unsqueeze(1)
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, sorted_idx, sorted_logits)


def draw(probs: torch.Tensor, rng: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from `probs` [B, V] (each row non-negative, not necessarily normalised),
    by inverse CDF: one uniform number per row and a binary search in the row's cumulative sum.
    Returns [B] long. (`torch.multinomial` draws an exponential variate per vocabulary entry:
    ~12x slower for 256 rows of 2,048 tokens on a CPU, where it was the decode step's largest
    cost after attention.) A token of probability 0 is never drawn."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand((probs.shape[0], 1), generator=rng, device=probs.device, dtype=cdf.dtype) * total
    drawn = torch.searchsorted(cdf, u, right=True)  # the first token whose cdf exceeds u
    last = (cdf < total).sum(dim=-1, keepdim=True)  # the last token with probability > 0 (if u rounds up to total)
    return torch.minimum(drawn, last).squeeze(1)


def sample(
    logits: torch.Tensor, rows: RowSampling, rng: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [B, V] -> (tokens [B] long, logprobs [B] float32).

    logprobs follow the module's convention: log_softmax(logits / T) at the drawn token.
    """
    scaled = logits.float() / rows.temperature.unsqueeze(1)
    lse = torch.logsumexp(scaled, dim=-1)
    if bool(rows.greedy.all()):
        tokens = scaled.argmax(dim=-1)
    else:
        if bool((rows.top_k > 0).any()) or bool((rows.top_p < 1).any()):
            probs = _filter(scaled, rows.top_k, rows.top_p).softmax(dim=-1)
        else:
            probs = (scaled - lse.unsqueeze(1)).exp()
        tokens = draw(probs, rng)
        if bool(rows.greedy.any()):
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    return tokens, scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse
