"""The decode loop behind LocalGenerator: the running batch, one `step(new_rows)` at a time.

Runs in the generator's thread. A step is
  1. prefill (prefill.py): the new rows take free slots of the decode cache, reusing what cache
     they can, and their first token is sampled;
  2. decode (decode_step.py): one forward over all slots, a token per live row, stops checked
     (stops.py); finished rows free their slot (slots.py) and keep their cache when their request
     names a session (kept.py).
Both run their forwards and draws through `Forward` (forward.py). Nothing moves in the decode
cache when rows come and go (see kv_cache.SlotCache); a row's wait to join is at most one step.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch import nn

from rlfactory.generation.decode_graph import StaticDecode
from rlfactory.generation.decode_step import DecodeStep
from rlfactory.generation.forward import Forward
from rlfactory.generation.kept import KeptCaches
from rlfactory.generation.kv_cache import SlotCache
from rlfactory.generation.prefill import Prefill
from rlfactory.generation.rows import Row
from rlfactory.generation.slots import Slots
from rlfactory.generation.stops import StopCheck
from rlfactory.generation.vision import VisionPrefill


class DecodeLoop:
    """State of the running batch. `model()` returns the model to run (read at every forward)."""

    def __init__(self, model: Callable[[], nn.Module], pad_id: int, device: torch.device, rng: torch.Generator,
                 tokenizer: Any = None, logits_processor: Callable | None = None, min_shared_prefix: int = 16,
                 static: StaticDecode | None = None, vision: VisionPrefill | None = None,
                 max_slots: int | None = None) -> None:
        self.stats: dict[str, float] = {
            "steps": 0, "prefills": 0, "prefill_tokens": 0, "reused_tokens": 0, "shared_prefix_tokens": 0,
            "moved_rows": 0, "tokens": 0, "busy_s": 0.0, "cache_grows": 0,
            "prefix_steps": 0}
        self.forward = Forward(model, device, rng, logits_processor)
        self.slots = Slots(model, pad_id, device, self.stats, max_slots)
        self.kept = KeptCaches(self.stats)
        stops = StopCheck(tokenizer, model, self.stats)
        self.prefill = Prefill(self.forward, self.slots, self.kept, stops, pad_id, device, self.stats,
                               min_shared_prefix, vision)
        self.decode = DecodeStep(self.forward, self.slots, self.kept, stops, device, self.stats, static)
        self.decode_s = 0.0
        """Seconds of the last step's decode (its prefill left out): what a step of the batch costs."""

    @property
    def live(self) -> int:
        return self.slots.live

    def live_rows(self) -> list[Row]:
        return self.slots.live_rows()

    @property
    def cache(self) -> SlotCache | None:
        """The decode cache (None until the first row, and after `release`)."""
        return self.slots.cache

    def reset(self) -> None:
        """Drop the running batch (the kept sessions stay, and so do the cache's buffers: the next
        rows write their columns before anything reads them; `release` frees them)."""
        self.slots.reset()

    def release(self) -> None:
        """Drop the running batch and free the cache's buffers (and recorded CUDA graphs)."""
        self.slots.release()
        if self.decode.static is not None:
            self.decode.static.release()

    def step(self, new: list[Row]) -> list[Row]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            if new and self.slots.stale():
                self.release()  # buffers made for another model (or dtype, device): not reusable
            if not self.live and not len(self.kept):
                # Nothing holds the shared prefix block: drop it, the weights may have changed since
                # (a trainer's update between rollouts; VersionedGenerator drops kept caches then).
                self.slots.prefix = None
            done = self.prefill(new) if new else []
            if self.live:
                t1 = time.perf_counter()
                done += self.decode()
                self.decode_s = time.perf_counter() - t1
        self.stats["busy_s"] += time.perf_counter() - t0
        return done
