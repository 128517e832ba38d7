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

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

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
        def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return self.allowed(q, k)

        t = self.length
        return create_block_mask(mask_mod, None, None, t, t, device=self.input_ids.device)


def pack(batch: TrainBatch) -> PackedPass:
    """Lay `batch`'s rows out as one packed sequence (see the module docstring).

    A completion contributes its real tokens but the last (which predicts nothing): column 0 of
    row b is predicted by its prompt's last token, column j >= 1 by its own token j-1.
    """
    # The layout is worked out in Python lists (a pass has tens of rows) and moved to the device
    # in one go: a few tensors instead of a handful of small kernels per row.
    device = batch.completion_ids.device
    plen = batch.prompt_mask.sum(-1).tolist()
    clen = batch.completion_mask.sum(-1).tolist()
    b, lc = batch.completion_ids.shape
    lp = batch.prompt_ids.shape[1]
    flat: list[int] = []  # index into cat(prompt_ids.flatten(), completion_ids.flatten())
    pos: list[int] = []
    prompt_of: list[int] = []
    row_of: list[int] = []
    source = [[-1] * lc for _ in range(b)]
    rows_of_prompt: list[list[int]] = [[] for _ in plen]
    for row, p in enumerate(batch.prompt_index.tolist()):
        rows_of_prompt[p].append(row)
    for p, n in enumerate(plen):
        if not rows_of_prompt[p]:
            continue  # a prompt no row uses
        n = int(n)
        last = len(flat) + n - 1
        flat.extend(range(p * lp, p * lp + n))
        pos.extend(range(n))
        prompt_of.extend([p] * n)
        row_of.extend([-1] * n)
        for row in rows_of_prompt[p]:
            m = max(int(clen[row]) - 1, 0)
            start = len(flat)
            first = batch.prompt_ids.numel() + row * lc
            flat.extend(range(first, first + m))
            pos.extend(range(n, n + m))
            prompt_of.extend([p] * m)
            row_of.extend([row] * m)
            if n > 0:
                source[row][0] = last
            source[row][1 : m + 1] = range(start, start + m)
    t = len(flat)
    ids = torch.cat([batch.prompt_ids.reshape(-1), batch.completion_ids.reshape(-1)])

    def tensor(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long).to(device, non_blocking=True)

    src = tensor(source)
    return PackedPass(
        input_ids=ids[tensor(flat)][None], position_ids=tensor(pos)[None], prompt_of=tensor(prompt_of),
        row_of=tensor(row_of), source=src.masked_fill(src < 0, t),
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


def flex_attention_sdpa(original: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function for transformers' "sdpa" key: a BlockMask (a packed pass's) goes to
    torch's flex attention, anything else to `original` unchanged. The kernel follows the mask, not
    the config, so gradient checkpointing's recomputation in the backward picks it again."""
    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> Any:
        if not isinstance(attention_mask, BlockMask):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        if dropout > 0 or any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "position_bias")):
            from transformers.integrations.flex_attention import flex_attention_forward

            return flex_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        heads = query.shape[1]
        if heads & (heads - 1):  # flex's GQA wants a power-of-two head count (as transformers does)
            key = key.repeat_interleave(heads // key.shape[1], 1)
            value = value.repeat_interleave(heads // value.shape[1], 1)
        out = _flex(query.device)(query, key, value, block_mask=attention_mask, scale=scaling,
                                  enable_gqa=key.shape[1] != heads)
        return out.transpose(1, 2).contiguous(), None

    attention.rlfactory_flex = original  # type: ignore[attr-defined]
    return attention


def install_flex() -> None:
    """Route BlockMasks given to transformers' "sdpa" attention to flex attention (idempotent).
    It sits below the generator's GQA decode attention (rlfactory/generation/gqa_attention.py,
    which re-registers itself on top whenever a generator is made and wraps what it finds): so
    whichever is installed first, the chain is GQA decode -> this -> transformers' sdpa, never a loop."""
    from transformers import AttentionInterface

    from rlfactory.generation import gqa_attention

    if gqa_attention.installed():
        below = gqa_attention._ORIGINAL
        if not hasattr(below, "rlfactory_flex"):
            gqa_attention._ORIGINAL = flex_attention_sdpa(below if below is not None else gqa_attention._original())
        return
    current = AttentionInterface._global_mapping.get("sdpa")
    if current is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as current
    if not hasattr(current, "rlfactory_flex"):
        AttentionInterface.register("sdpa", flex_attention_sdpa(current))


_COMPILED_FLEX: dict[str, Callable[..., Any]] = {}


def _flex(device: torch.device) -> Callable[..., Any]:
    """torch's flex attention: compiled on CUDA (its fused kernel), eager elsewhere (a reference
    implementation that materialises the scores; tests only)."""
    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED_FLEX:
        _COMPILED_FLEX["cuda"] = torch.compile(flex_attention)
    return _COMPILED_FLEX["cuda"]


FLEX_MIN_HEAD_DIM = 16  # torch's flex kernel: "embedding dimension ... must be at least 16" (NotImplementedError)


def head_dim(decoder: nn.Module) -> int:
    """The attention head size of `decoder`'s layers (config.head_dim, else hidden_size / heads)."""
    cfg = getattr(decoder, "config", None)
    size = getattr(cfg, "head_dim", None)
    return int(size) if size else int(cfg.hidden_size // cfg.num_attention_heads)


def flex_available(device: torch.device) -> bool:
    """Flex attention runs compiled on CUDA (triton); on the CPU the dense mask is used instead."""
    return device.type == "cuda"


def packed_hidden(decoder: nn.Module, batch: TrainBatch, use_flex: bool | None = None) -> torch.Tensor:
    """Last-layer hidden state that predicts each completion token, [B, Lc, H], from one packed pass
    (the same states as logprobs.py `predictive_hidden`; zeros on padding columns).

    `use_flex`: flex attention with a BlockMask (default: on CUDA, or when the model already runs
    flex); else the dense mask through the model's sdpa or eager attention.
    """
    packed = pack(batch)
    impl = attention_kernel(decoder)
    if use_flex is None:
        use_flex = impl == FLEX or (impl == "sdpa" and flex_available(batch.completion_ids.device)
                                    and head_dim(decoder) >= FLEX_MIN_HEAD_DIM)
    if use_flex and impl not in ("sdpa", FLEX):
        raise ValueError(f"flex attention for packed passes needs sdpa or flex_attention, not {impl!r}")
    if use_flex:
        mask = packed.block_mask()
        if impl == "sdpa":
            install_flex()
    else:
        mask = packed.dense_mask()
        if impl != "sdpa":  # eager attention (and flex with a tensor) add the mask to the scores
            dtype = next((p.dtype for p in decoder.parameters() if p.is_floating_point()), torch.float32)
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    h = decoder(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                use_cache=False).last_hidden_state[0]  # [T, H]
    h = torch.cat([h, h.new_zeros(1, h.shape[-1])])  # row T: the zeros of padding columns
    return h[packed.source]
