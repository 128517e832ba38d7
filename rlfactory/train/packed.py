"""Packed training passes: a pass's trajectories end to end in one row, no padding.

The padded path (logprobs.py `predictive_hidden`) pads every prompt to the pass's longest prompt
and every completion to its longest completion. Here each distinct prompt's real tokens are laid
down once, followed by the real tokens of each of its completions, in one sequence of T tokens:

    [prompt 0][completion a][completion b][prompt 1][completion c] ...

and the attention mask is a prefix tree rather than plain per-row documents: a prompt token sees
the earlier tokens of its prompt; a completion token sees all of its prompt and, causally, its own
completion (never a sibling's). Position ids restart at 0 for every prompt and continue from the
prompt's length in each completion, so every token has the position it has in its trajectory and
the hidden states equal the padded path's up to float rounding.

Attention runs through PyTorch's own kernels: on CUDA flex attention with a BlockMask (transformers'
`flex_attention`, compiled; the blocks outside every document are skipped), elsewhere the same mask
as a dense [1, 1, T, T] tensor through the model's sdpa (boolean) or eager (additive) attention.

Models this path does not take keep the padded path (`packable` says why): sliding-window layers
(their masks are built from positions, rlfactory/generation/attention_masks.py), vision-language
models (M-RoPE positions and pixels per row, batch_images.py), and attention kernels other than
sdpa, eager and flex. The choice depends on the model only, never on a batch, so every rank of
the FSDP learner runs the decoder the same number of times (once per pass).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from rlfactory.generation.attention_masks import mask_plan
from rlfactory.train.batch import TrainBatch

DENSE_KERNELS = ("sdpa", "eager")
FLEX = "flex_attention"


@dataclass
class PackedPass:
    """One pass's rows packed into one sequence of T tokens."""

    input_ids: torch.Tensor
    """[1, T] long: each distinct prompt's real tokens, then its completions' real tokens."""
    position_ids: torch.Tensor
    """[1, T] long: each token's position in its own trajectory."""
    prompt_of: torch.Tensor
    """[T] long: the prompt row (of the batch) each token belongs to."""
    row_of: torch.Tensor
    """[T] long: the trajectory row of a completion token; -1 on prompt tokens (shared by the prompt's rows)."""
    source: torch.Tensor
    """[B, Lc] long: the packed token whose last-layer state predicts completion column j of row b;
    T where no real token is predicted (padding columns)."""

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def allowed(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Whether query token `q` attends to key token `k` (index tensors that broadcast): same
        prompt, not later, and the key is a prompt token or in the query's own completion."""
        return ((self.prompt_of[q] == self.prompt_of[k]) & (k <= q)
                & ((self.row_of[k] < 0) | (self.row_of[k] == self.row_of[q])))

    def dense_mask(self) -> torch.Tensor:
        """[1, 1, T, T] bool: `allowed` for every query and key (the sdpa form)."""
        idx = torch.arange(self.length, device=self.input_ids.device)
        return self.allowed(idx[:, None], idx[None, :])[None, None]

    def block_mask(self) -> Any:
        """The same mask as a flex-attention BlockMask (its tiles outside every document are skipped)."""
        from torch.nn.attention.flex_attention import create_block_mask

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return self.allowed(q, k)

        t = self.length
        return create_block_mask(mask_mod, None, None, t, t, device=self.input_ids.device)


def pack(batch: TrainBatch) -> PackedPass:
    """Lay `batch`'s rows out as one packed sequence (see the module docstring).

    A completion contributes its real tokens but the last (which predicts nothing): column 0 of
    row b is predicted by its prompt's last token, column j >= 1 by its own token j-1.
    """
    device = batch.completion_ids.device
    plen = batch.prompt_mask.sum(-1).tolist()
    clen = batch.completion_mask.sum(-1).tolist()
    index = batch.prompt_index.tolist()
    b, lc = batch.completion_ids.shape
    ids, pos, prompt_of, row_of = [], [], [], []
    source = [[-1] * lc for _ in range(b)]
    rows_of_prompt: list[list[int]] = [[] for _ in plen]
    for row, p in enumerate(index):
        rows_of_prompt[p].append(row)
    offset = 0
    for p, n in enumerate(plen):
        if not rows_of_prompt[p]:
            continue  # a prompt no row uses
        ids.append(batch.prompt_ids[p, :n])
        pos.append(torch.arange(n, device=device))
        prompt_of.append(torch.full((n,), p, dtype=torch.long, device=device))
        row_of.append(torch.full((n,), -1, dtype=torch.long, device=device))
        last = offset + n - 1
        offset += n
        for row in rows_of_prompt[p]:
            m = max(int(clen[row]) - 1, 0)
            ids.append(batch.completion_ids[row, :m])
            pos.append(n + torch.arange(m, device=device))
            prompt_of.append(torch.full((m,), p, dtype=torch.long, device=device))
            row_of.append(torch.full((m,), row, dtype=torch.long, device=device))
            if n > 0:
                source[row][0] = last
            source[row][1 : m + 1] = range(offset, offset + m)
            offset += m
    t = offset
    src = torch.tensor(source, dtype=torch.long, device=device)
    return PackedPass(
        input_ids=torch.cat(ids)[None], position_ids=torch.cat(pos)[None], prompt_of=torch.cat(prompt_of),
        row_of=torch.cat(row_of), source=src.masked_fill(src < 0, t),
    )


def packable(decoder: nn.Module) -> str | None:
    """None when `decoder` (a transformer body) can run packed passes, else why not (one line)."""
    if hasattr(decoder, "get_rope_index"):
        return f"{type(decoder).__name__} is a vision-language model (M-RoPE positions and pixels per row)"
    text = getattr(decoder, "language_model", decoder)
    try:
        if mask_plan(text) is not None:
            return f"{type(text).__name__} has sliding-window layers"
    except (NotImplementedError, ValueError) as e:
        return str(e)
    impl = attention_kernel(decoder)
    if impl not in (*DENSE_KERNELS, FLEX):
        return f"{type(decoder).__name__} uses the {impl!r} attention kernel (packed passes take sdpa, eager or flex)"
    return None


def use_packed(switch: str, decoder: nn.Module, device: torch.device) -> bool:
    """Whether a run packs its passes (`trainer.kernels.packed`: auto = on CUDA, on = everywhere)
    for a model whose transformer body is `decoder`. A model that cannot (`packable`) keeps padded
    passes; with `on` that is said in one line on stderr."""
    if not (switch == "on" or (switch == "auto" and device.type == "cuda")):
        return False
    reason = packable(decoder)
    if reason is not None and switch == "on":
        print(f"trainer.kernels.packed: on, but {reason}: its passes stay padded", file=sys.stderr)
    return reason is None


def attention_kernel(decoder: nn.Module) -> str:
    """The attention implementation `decoder` runs (transformers' default is eager)."""
    return getattr(getattr(decoder, "config", None), "_attn_implementation", None) or "eager"


@contextlib.contextmanager
def _kernel(decoder: nn.Module, name: str) -> Iterator[None]:
    """Run `decoder` with attention implementation `name` for the duration (the layers look it up
    from the config at every call; the backward needs no lookup)."""
    config = decoder.config
    before = config._attn_implementation
    if before == name:
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def flex_available(device: torch.device) -> bool:
    """Flex attention runs compiled on CUDA (triton); on the CPU the dense mask is used instead."""
    if device.type != "cuda":
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def packed_hidden(decoder: nn.Module, batch: TrainBatch, use_flex: bool | None = None) -> torch.Tensor:
    """Last-layer hidden state that predicts each completion token, [B, Lc, H], from one packed pass
    (the same states as logprobs.py `predictive_hidden`; zeros on padding columns).

    `use_flex`: flex attention with a BlockMask (default: on CUDA, or when the model already runs
    flex); else the dense mask through the model's sdpa or eager attention.
    """
    packed = pack(batch)
    impl = attention_kernel(decoder)
    if use_flex is None:
        use_flex = impl == FLEX or flex_available(batch.completion_ids.device)
    if use_flex:
        mask, kernel = packed.block_mask(), FLEX
    else:
        mask, kernel = packed.dense_mask(), impl
        if impl == FLEX:
            kernel = "sdpa"
        if kernel == "eager":  # eager attention adds its mask to the scores
            dtype = next((p.dtype for p in decoder.parameters() if p.is_floating_point()), torch.float32)
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    with _kernel(decoder, kernel):
        h = decoder(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                    use_cache=False).last_hidden_state[0]  # [T, H]
    h = torch.cat([h, h.new_zeros(1, h.shape[-1])])  # row T: the zeros of padding columns
    return h[packed.source]
