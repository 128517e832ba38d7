"""Images in the training batch (issue 31): the pixels of each prompt row and each completion row,
and the vision-language model's own multimodal rotary positions for them.

`collate` (batch.py) turns a trajectory's images back into the model's pixel inputs through the
ToolManager's image processor (deterministic: the same bytes give the same pixels), so the
trainer's forward sees exactly the pixels the rollout showed. Images of the prompt segment belong
to the (shared) prompt row; every later image (observations) to the trajectory's completion row.

Positions are what the model computes for the whole sequence (Qwen2-VL's 3-D M-RoPE,
`get_rope_index`): an image advances the text position by less than its pad count, so the
1-D `cumsum` positions of text batches would be wrong after the first image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlfactory.chat.vision import PixelSource
from rlfactory.images import Image

__all__ = ["BatchImages", "PixelSource", "Pixels", "joined", "mrope_positions", "multimodal_body", "pixel_kwargs",
           "row_pixels"]


@dataclass
class Pixels:
    """The pixel inputs of one row's images, in the order of their pads."""

    values: torch.Tensor
    """[patches, D] float: the image processor's `pixel_values`."""
    grids: torch.Tensor
    """[images, 3] long: each image's (t, h, w) patch grid."""

    def to(self, device: torch.device | str) -> "Pixels":
        return Pixels(self.values.to(device), self.grids.to(device))


Row = Pixels | None


@dataclass
class BatchImages:
    """Per-row pixels of a TrainBatch: `prompts[p]` of prompt row p, `completions[b]` of row b."""

    prompts: list[Row]
    completions: list[Row]

    def select(self, used: torch.Tensor, idx: torch.Tensor) -> "BatchImages":
        return BatchImages([self.prompts[i] for i in used.tolist()], [self.completions[i] for i in idx.tolist()])

    def to(self, device: torch.device | str) -> "BatchImages":
        return BatchImages([r.to(device) if r else None for r in self.prompts],
                           [r.to(device) if r else None for r in self.completions])


def row_pixels(images: Sequence[Image], source: PixelSource | None) -> Row:
    """The pixels of one row's `images` (None for none); a ValueError without a `source`."""
    if not images:
        return None
    if source is None:
        raise ValueError(f"a trajectory holds {len(images)} image(s) but the trainer has no image processor: "
                         "images need a vision-language model and its ToolManager (model.family qwen2_5_vl)")
    out = source.pixel_inputs(images)
    return Pixels(out["pixel_values"], out["image_grid_thw"].long())


def multimodal_body(model: nn.Module) -> nn.Module | None:
    """The vision-language model under a `...ForConditionalGeneration` (vision tower, embeddings and
    text model; it computes M-RoPE positions), or None for a text-only causal LM."""
    body = getattr(model, "model", None)
    return body if body is not None and hasattr(body, "get_rope_index") else None


def _cat(rows: Sequence[Row]) -> Row:
    real = [r for r in rows if r is not None]
    if not real:
        return None
    return Pixels(torch.cat([r.values for r in real]), torch.cat([r.grids for r in real]))


def joined(*rows: Row) -> Row:
    """The pixels of several rows' images run as one sequence, in order."""
    return _cat(rows)


def pixel_kwargs(rows: Sequence[Row]) -> dict[str, torch.Tensor]:
    """Forward keywords for a pass over `rows` (row-major: their pads are filled in this order)."""
    px = _cat(rows)
    return {} if px is None else {"pixel_values": px.values, "image_grid_thw": px.grids}


def mrope_positions(body: nn.Module, ids: torch.Tensor, mask: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """[3, N, L] long: the model's M-RoPE positions of the real tokens (mask 1, in order, padding
    anywhere) of each row of `ids` [N, L]; 0 at padding. `rows[n]`: row n's images, in order."""
    types = ((ids == body.config.image_token_id) & mask.bool()).int()
    px = _cat(rows)
    positions, _ = body.get_rope_index(input_ids=ids, mm_token_type_ids=types,
                                       image_grid_thw=px.grids if px is not None else None, attention_mask=mask)
    return positions
