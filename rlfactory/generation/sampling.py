"""Token sampling with per-row settings, and the logprob that is recorded for each sampled token.

Convention (the trainer must use the same one for its importance ratio): the recorded logprob is
`log_softmax(logits / T)[token]` where T is the row's temperature (1.0 for greedy rows). Top-k and
top-p change which tokens can be drawn but not the recorded logprob.

Seeded draws: a request with a `seed` (GenRequest.seed) draws its j-th token from the uniform
number `seeded_uniforms(seed, j)`, a pure function of the two, by inverse CDF. So the tokens a
seeded turn samples depend only on its logits, its seed and its position, not on which other
rows share its batch nor in what order (what lets N rollout workers reproduce one process's
trajectories). Unseeded rows draw from the generator's RNG.
"""

from __future__ import annotations

from dataclasses import dataclass

import hashlib
from typing import Sequence

import numpy as np
import torch

from rlfactory.config import SamplingConfig

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def mix_seed(*parts: int | str) -> int:
    """A 63-bit seed from the given parts (stable across processes, machines and Python versions)."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 [B] (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def seeded_uniforms(seeds: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
    """One uniform number in [0, 1) per row: a pure function of (seeds[i], positions[i]). [B] float64."""
    s = np.asarray(seeds, dtype=np.uint64)
    j = np.asarray(positions, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix64(s ^ _splitmix64(j))
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)))


@dataclass
class RowSampling:
    """Per-row sampling settings as tensors: each field is [B]."""

    temperature: torch.Tensor  # float, 1.0 on greedy rows
    top_k: torch.Tensor  # long, 0 = off
    top_p: torch.Tensor  # float, 1.0 = off
    greedy: torch.Tensor  # bool
    flags: tuple[bool, bool, bool] | None = None
    """(all rows greedy, any row greedy, any row top-k/top-p) known on the host, so `sample` need
    not read them back from the device (a sync per step); None = read them from the tensors."""

    @classmethod
    def of(cls, settings: list[SamplingConfig], device: torch.device | str = "cpu") -> "RowSampling":
        return cls(
            temperature=torch.tensor([s.logprob_temperature for s in settings], dtype=torch.float32, device=device),
            top_k=torch.tensor([s.top_k for s in settings], dtype=torch.long, device=device),
            top_p=torch.tensor([s.top_p for s in settings], dtype=torch.float32, device=device),
            greedy=torch.tensor([s.is_greedy for s in settings], dtype=torch.bool, device=device),
            flags=(all(s.is_greedy for s in settings), any(s.is_greedy for s in settings),
                   any(s.top_k > 0 or s.top_p < 1 for s in settings)),
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


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from `probs` [B, V] (non-negative, not necessarily normalised) by inverse
    CDF with the given uniform numbers [B] in [0, 1). Returns [B] long; a token of probability 0
    is never drawn."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    u = uniforms.to(device=cdf.device, dtype=cdf.dtype).unsqueeze(1) * total
    drawn = torch.searchsorted(cdf, u, right=True)  # the first token whose cdf exceeds u: one of probability > 0
    # ... unless u rounded up to the total, where no cdf exceeds it (drawn = V): then the last token
    # of probability > 0. That fix-up is a pass over [B, V] (a tenth of a CPU step's draw), so on
    # the CPU, where asking costs no device sync, it runs only when some row needs it.
    if cdf.device.type != "cpu" or bool((drawn >= cdf.shape[-1]).any()):
        last = (cdf < total).sum(dim=-1, keepdim=True)
        drawn = torch.minimum(drawn, last)
    return drawn.squeeze(1)


def sample(
    logits: torch.Tensor, rows: RowSampling, rng: torch.Generator | None = None, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [B, V] -> (tokens [B] long, logprobs [B] float32).

    logprobs follow the module's convention: log_softmax(logits / T) at the drawn token.
    `uniforms` [B] (see `seeded_uniforms`), when given, decide the draws by inverse CDF instead of
    `rng`, so that each row's token depends on its own logits and number only.
    """
    scaled = logits.float() / rows.temperature.unsqueeze(1)
    lse = torch.logsumexp(scaled, dim=-1)
    all_greedy, any_greedy, any_filter = rows.flags or (
        bool(rows.greedy.all()), bool(rows.greedy.any()), bool((rows.top_k > 0).any()) or bool((rows.top_p < 1).any()))
    if all_greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        if any_filter:
            probs = _filter(scaled, rows.top_k, rows.top_p).softmax(dim=-1)
        else:
            probs = (scaled - lse.unsqueeze(1)).exp()
        if uniforms is None:
            uniforms = torch.rand((probs.shape[0],), generator=rng, device=probs.device)
        tokens = draw(probs, uniforms)
        if any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    return tokens, scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse
