"""One decode step: a forward over all slots (tokens left-aligned, each row writes its own column),
a token sampled per live row, stops checked; finished rows free their slot (and keep their cache
when their request names a session). With a `StaticDecode` (on a GPU) the forward runs at fixed
shapes from a CUDA graph (decode_graph.py); the sampled tokens and their logprobs come back to the
host in one copy per step."""

from __future__ import annotations

import torch

from rlfactory.generation.attention_masks import MaskPlan
from rlfactory.generation.decode_graph import StaticDecode
from rlfactory.generation.forward import Forward
from rlfactory.generation.kept import KeptCaches
from rlfactory.generation.rows import Row
from rlfactory.generation.slots import Slots
from rlfactory.generation.stops import StopCheck


class DecodeStep:
    """`step()` advances every live row by one token; returns the rows that finished."""

    def __init__(self, forward: Forward, slots: Slots, kept: KeptCaches, stops: StopCheck,
                 device: torch.device, stats: dict[str, float], static: StaticDecode | None = None) -> None:
        self.forward = forward
        self.slots = slots
        self.kept = kept
        self.stops = stops
        self.device = device
        self.stats = stats
        self.static = static  # fixed-shape (CUDA graph) decode steps; None = trimmed eager steps

    def static_plan(self) -> MaskPlan | None:
        """The masks of fixed-shape steps; None when they are off or the model's kernel cannot run them."""
        return self.forward.position_plan() if self.static is not None else None

    def __call__(self) -> list[Row]:
        slots = self.slots
        cache = slots.cache
        live = [i for i, r in enumerate(slots.rows) if r is not None]
        rows = [slots.rows[i] for i in live]
        static = self.static_plan()
        delta = [r.rope_delta if r is not None else 0 for r in slots.rows]
        if static is not None and any(delta):
            # A CUDA graph's positions are the cache columns; a row after images is at column +
            # its rope delta, so steps with such rows run eager (same tokens, more host time).
            static = None
        if static is not None:  # every slot, all columns: fixed shapes, replayed from a CUDA graph
            logits = self.static.logits(self.forward.model(), static, cache, slots.last, slots.length)
            logits = self.forward.process(rows, logits, slots.keep_index(live, logits.shape[0]))
        else:
            write = torch.tensor(slots.length, dtype=torch.long, device=self.device)
            cache.begin_step(write)
            # Free slots still run (cheaper than compacting every time); they see only their column 0.
            cols = torch.arange(cache.width, device=self.device).unsqueeze(0)
            plan = self.forward.mask_plan()
            if plan is None:
                mask: torch.Tensor | dict[str, torch.Tensor] = (cols <= write.unsqueeze(1)).long()
            else:  # left-aligned slots: a key's column is its position
                mask = plan.build(cols.expand(len(write), -1), cols <= write.unsqueeze(1), write.unsqueeze(1))
            last = torch.tensor(slots.last, dtype=torch.long, device=self.device).unsqueeze(1)
            pos = write if not any(delta) else write + torch.tensor(delta, dtype=torch.long, device=self.device)
            # The columns most rows start with (system prompt, tools), read once for all (shared_prefix.py).
            prefix = slots.prefix_step(len(slots.rows)) if slots.prefix is not None else None
            self.stats["prefix_steps"] += prefix is not None
            logits = self.forward.logits(rows, last, mask, pos.unsqueeze(1), cache,
                                         slots.keep_index(live, len(slots.rows)), prefix=prefix)
        self.stats["steps"] += 1
        tokens, lps = self.forward.draw(rows, logits, slots.row_sampling(rows))
        for i, tok in zip(live, tokens):
            slots.length[i] += 1
            slots.last[i] = tok
        done = self.stops.record(rows, tokens, lps)
        if done:
            for i in live:
                if slots.rows[i].finish is not None:
                    slots.end(i, self.kept)
            slots.version += 1
            slots.tidy()
        return done
