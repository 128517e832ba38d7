"""The local generator's vision prefill (issue 31): a request's images (`GenRequest.images`, every
image of its context, in order) go through the model's vision encoder in the prefill of the turn
that brings them, once; decode steps never see pixels.

Positions are the model's own multimodal rotary positions (Qwen2-VL's 3-D M-RoPE): computed by
the model's `get_rope_index` over the whole prompt (only grids are needed for the images of
earlier turns, whose keys and values the kept cache already holds), the new tokens take their
slice. After the last image every token is text, at column + `delta` in all three dimensions, so
decode steps need only each row's delta (Row.rope_delta) beside its cache column.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlfactory.chat.vision import PixelSource
from rlfactory.images import Image

_PIXEL_CACHE = 256


class BadImageRequest(ValueError):
    """A request's images do not stand for exactly the image pads of its prompt, or the image
    processor refuses one of them."""


@dataclass
class RowVision:
    """What one row's prefill needs beyond its ids."""

    positions: torch.Tensor
    """[3, n] long: the M-RoPE positions of the row's n new tokens."""
    pixels: list[tuple[torch.Tensor, torch.Tensor]]
    """(pixel_values [patches, D], grid [3]) of each image whose pads are among the new tokens."""
    delta: int
    """Position minus cache column of every token after the prompt (the text the row generates)."""


def vision_body(model: Any) -> Any:
    """The multimodal model under a `...ForConditionalGeneration` (it computes M-RoPE positions);
    a ValueError for a model that takes no pixels."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    body = getattr(base, "model", None)
    if body is None or not hasattr(body, "get_rope_index"):
        raise ValueError(f"a request with images needs a vision-language model; {type(base).__name__} takes no pixels")
    return body


class VisionPrefill:
    """Pixels and positions of image rows, from `source` (the VL ToolManager: the trainer's pixels)."""

    def __init__(self, source: PixelSource) -> None:
        self.source = source
        self._pixels: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"images_encoded": 0}

    def pixels(self, image: Image) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values, grid [3]) of one image, cached by content hash (a trajectory's images
        come back in every later turn's request; only their grids are needed then)."""
        with self._lock:  # `check` runs on the submitting thread, `row` on the generation thread
            hit = self._pixels.get(image.sha256)
            if hit is not None:
                self._pixels.move_to_end(image.sha256)
                return hit
        out = self.source.pixel_inputs([image])
        hit = (out["pixel_values"], out["image_grid_thw"][0].long())
        with self._lock:
            self._pixels[image.sha256] = hit
            if len(self._pixels) > _PIXEL_CACHE:
                self._pixels.popitem(last=False)
        return hit

    def cache_bytes(self) -> int:
        """Bytes of the pixel values (and grids) held in the cache now."""
        with self._lock:
            return sum(v.nbytes + g.nbytes for v, g in self._pixels.values())

    def check(self, model: Any, prompt: Sequence[int], images: Sequence[Image]) -> None:
        """Raise BadImageRequest (one line) unless `images` stand for exactly the image pads of
        `prompt`: before a request joins a batch, where a failing prefill would fail every row."""
        body = vision_body(model)
        for i, im in enumerate(images):
            try:
                self.pixels(im)
            except ValueError as e:  # the processor's own refusal, e.g. an aspect ratio past 200:1
                raise BadImageRequest(f"image {i} ({im.width}x{im.height}): the image processor refuses it: {e}") from None
        self._counts(body, prompt, images)

    def _counts(self, body: Any, prompt: Sequence[int], images: Sequence[Image]
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int], torch.Tensor]:
        """(pixels and grid of each image, pads per image, the pad mask of `prompt`)."""
        merge = body.config.vision_config.spatial_merge_size
        got = [self.pixels(im) for im in images]
        counts = [int(g.prod()) // merge ** 2 for _, g in got]
        pads = torch.tensor(list(prompt), dtype=torch.long) == body.config.image_token_id
        if int(pads.sum()) != sum(counts):
            raise BadImageRequest(f"a request's {len(images)} image(s) stand for {sum(counts)} image tokens, but its "
                                f"prompt holds {int(pads.sum())}")
        return got, counts, pads

    def usable_past(self, model: Any, prompt: Sequence[int], images: Sequence[Image], kept: int,
                    encoded: Sequence[str]) -> int:
        """How many of the first `kept` columns of `prompt` that a kept cache holds a prefill may
        start after: all of them, or up to the start of the first image the cache does not hold
        encoded whole, which is then encoded again: one its end cuts (an image is encoded whole),
        or one whose pads it fed as text or with other pixels (`encoded`: the content hashes of the
        images the cache was made with, in order)."""
        _, counts, pads = self._counts(vision_body(model), prompt, images)
        for i, (start, count) in enumerate(zip(image_starts(pads, counts), counts)):
            if start >= kept:
                break
            if start + count > kept or i >= len(encoded) or encoded[i] != images[i].sha256:
                return start
        return kept

    def row(self, model: Any, prompt: Sequence[int], images: Sequence[Image], past: int) -> RowVision:
        """The prefill of `prompt`'s tokens from column `past` on (the rest is cached)."""
        body = vision_body(model)
        got, counts, pads = self._counts(body, prompt, images)
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        starts = image_starts(pads, counts)
        cut = [s for s, c in zip(starts, counts) if s < past < s + c]
        if cut:
            raise ValueError(f"the cached prefix ends inside the image at {cut[0]} (an image is encoded whole; "
                             "KeptCaches.reuse trims a kept cache to usable_past)")
        grids = torch.stack([g for _, g in got]) if got else None
        positions, _ = body.get_rope_index(input_ids=ids, mm_token_type_ids=pads.int()[None], image_grid_thw=grids)
        new = [px for px, s in zip(got, starts) if s >= past]
        self.stats["images_encoded"] += len(new)
        delta = int(positions.max()) + 1 - len(prompt)
        return RowVision(positions[:, 0, past:], new, delta)


def pixel_kwargs(rows: Sequence[RowVision | None], device: torch.device) -> dict[str, torch.Tensor]:
    """Forward keywords with the new images of `rows`, in row order (their pads' order in the forward)."""
    px = [p for r in rows if r is not None for p in r.pixels]
    if not px:
        return {}
    return {"pixel_values": torch.cat([v for v, _ in px]).to(device),
            "image_grid_thw": torch.stack([g for _, g in px]).to(device)}


def image_starts(pads: torch.Tensor, counts: Sequence[int]) -> list[int]:
    """Where each image's run of pads starts (adjacent images' runs told apart by their counts)."""
    starts, i, k, n = [], 0, 0, pads.shape[0]
    flags = pads.tolist()
    while i < n and k < len(counts):
        if flags[i]:
            starts.append(i)
            i += counts[k]
            k += 1
        else:
            i += 1
    return starts
