"""One forward of the model for rows of the running batch, and the draw of their next tokens.

The masks a forward needs depend on the model's layer kinds and attention kernel
(attention_masks.py, decode_graph.py); they are worked out once per model object, since a trainer
may replace `generator.model` between rollouts.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers import DynamicCache

from rlfactory.generation.attention_masks import MaskPlan, mask_plan
from rlfactory.generation import gqa_attention
from rlfactory.generation.decode_graph import static_mask_plan
from rlfactory.generation.kv_cache import cache_kwarg
from rlfactory.generation.rows import Row
from rlfactory.generation.sampling import RowSampling, sample, seeded_uniforms
from rlfactory.generation.shared_prefix import CPU_FLASH, PrefixStep


def to_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], list[float]]:
    """Sampled tokens [B] and their logprobs [B] as Python lists, in one device->host copy (exact:
    token ids and float32 values are both exact in float64)."""
    both = torch.stack([tokens.to(torch.float64), logprobs.to(torch.float64)]).tolist()
    return [int(t) for t in both[0]], both[1]


class Forward:
    """`model()` returns the model to run (read at every forward). `logits_processor(requests,
    generated, logits) -> logits` may change the rows' next-token logits before sampling."""

    def __init__(self, model: Callable[[], nn.Module], device: torch.device, rng: torch.Generator,
                 logits_processor: Callable | None = None) -> None:
        self.model = model
        self.device = device
        self.rng = rng
        self.logits_processor = logits_processor
        self._plan: tuple[int, MaskPlan | None, MaskPlan | None] | None = None
        gqa_attention.install()  # GQA decode steps attend without repeat_kv copies (gqa_attention.py)

    def mask_plan(self) -> MaskPlan | None:
        """None for full-attention models (2D padding masks); else how to build position masks."""
        return self._plans()[1]

    def position_plan(self) -> MaskPlan | None:
        """Masks by position for any layer kind (slots are left-aligned: a column is a position);
        None when the model's attention kernel takes only 2D padding masks (flash, flex)."""
        return self._plans()[2]

    def reads_prefix_once(self) -> bool:
        """Whether eager decode steps can read a shared prefix block once for all rows holding it
        (shared_prefix.py): on the CPU (where attention is bound by reading the cache), for
        full-attention models run by rlfactory's sdpa attention (gqa_attention.py)."""
        config = getattr(self.model(), "config", None)
        return (self.device.type == "cpu" and CPU_FLASH is not None and self.mask_plan() is None
                and gqa_attention.installed() and getattr(config, "_attn_implementation", None) == "sdpa")

    def _plans(self) -> tuple[int, MaskPlan | None, MaskPlan | None]:
        model = self.model()
        if self._plan is None or self._plan[0] != id(model):
            plan = mask_plan(model)
            self._plan = (id(model), plan, static_mask_plan(model, plan))
        return self._plan

    def logits(self, rows: list[Row], input_ids: torch.Tensor, mask: torch.Tensor | dict[str, torch.Tensor],
               pos: torch.Tensor, cache: DynamicCache, keep: torch.Tensor | None = None,
               pixels: dict[str, torch.Tensor] | None = None, prefix: PrefixStep | None = None) -> torch.Tensor:
        """The rows' next-token logits [len(rows), V] after one forward writing into `cache`
        (`pixels`: the images of an image prefill, vision.py; `pos` is then [3, B, q]; `prefix`: a
        decode step's shared prefix block, read once by the attention, shared_prefix.py)."""
        model = self.model()
        extra = dict(pixels or {})
        if prefix is not None:
            extra["shared_prefix"] = prefix
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, **cache_kwarg(model, cache),
                    use_cache=True, logits_to_keep=1, **extra)
        return self.process(rows, out.logits[:, -1, :], keep)

    def process(self, rows: list[Row], logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """The live rows' logits [len(rows), V] (`keep`: their rows in `logits`), after the processor."""
        if keep is not None:
            logits = logits.index_select(0, keep)
        if self.logits_processor is not None:
            logits = self.logits_processor([r.req for r in rows], [r.tokens for r in rows], logits)
        return logits

    def draw(self, rows: list[Row], logits: torch.Tensor,
             sampling: RowSampling | None = None) -> tuple[list[int], list[float]]:
        """One token per row from `logits` [len(rows), V] and its logprob, on the host (`sampling`:
        the rows' settings as tensors when the caller keeps them; else built here)."""
        if sampling is None:
            sampling = RowSampling.of([r.req.sampling for r in rows], self.device)
        return to_host(*sample(logits, sampling, self.rng, self._uniforms(rows)))

    def _uniforms(self, rows: list[Row]) -> torch.Tensor | None:
        """The rows' uniform numbers for this draw when any row is seeded (None: all draw from rng).
        A seeded row's number is a function of its seed and of how many tokens it has drawn."""
        if all(r.req.seed is None for r in rows):
            return None
        u = torch.rand(len(rows), generator=self.rng, device=self.device, dtype=torch.float64).cpu()
        seeded = [i for i, r in enumerate(rows) if r.req.seed is not None]
        u[seeded] = seeded_uniforms([rows[i].req.seed for i in seeded], [len(rows[i].tokens) for i in seeded])
        return u
