"""The running batch: one row per slot of the decode cache (kv_cache.SlotCache).

Per slot: its row (None when free), how many tokens its cache holds (`length`) and the sampled
token not yet fed (`last`). A new row takes the first free slot (growing the cache geometrically
when it must); a finished row frees its slot, and the last rows move down into free slots at once
on the CPU, once over a quarter are free on an accelerator (`tidy`). `version` changes whenever a
slot changes hands, so what is built per set of live rows (the rows' sampling tensors, their index
among the forward's rows) is rebuilt only then.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from rlfactory.generation.kv_cache import RowKV, SlotCache
from rlfactory.generation.kept import KeptCaches
from rlfactory.generation.rows import Row
from rlfactory.generation.sampling import RowSampling
from rlfactory.generation.shared_prefix import MIN_ROWS, PrefixStep, SharedPrefix


class Slots:
    def __init__(self, model: Callable[[], nn.Module], pad_id: int, device: torch.device,
                 stats: dict[str, float], max_slots: int | None = None) -> None:
        self.model = model
        self.max_slots = max_slots  # the most rows the batch holds (the generator's max_batch); None: no bound
        # Free slots still run in eager decode steps. On the CPU a free slot costs a live row's
        # forward (its attention reads as many columns) every step until a new row takes it, and
        # moving a row down copies its cache once (about one step's worth): so holes are filled at
        # once. On an accelerator a step costs its launches, not its rows, and each move is more.
        self.idle_share = 0.0 if device.type == "cpu" else 0.25
        self.pad_id = pad_id
        self.device = device
        self.stats = stats
        self.cache: SlotCache | None = None
        self.rows: list[Row | None] = []  # per slot; trailing free slots are dropped
        self.length: list[int] = []  # tokens in the cache, per slot
        self.last: list[int] = []  # sampled token not yet fed, per slot
        self.holds: list[bool] = []  # per slot: its columns [0, P) are `prefix`'s, bit for bit
        self.prefix: SharedPrefix | None = None
        """The shared prefix block decode steps read once (shared_prefix.py; set by the prefill)."""
        self.min_prefix_rows = MIN_ROWS  # fewest slots holding it for a step to read it once
        self.version = 0  # bumped whenever a slot changes hands
        self._sampling: tuple[int, RowSampling] | None = None
        self._keep_rows: tuple[int, torch.Tensor | None] | None = None
        self._prefix_step: tuple[int, SharedPrefix | None, PrefixStep | None] | None = None
        self._cache_key: tuple | None = None  # (model, dtype, device) the cache's buffers were made for

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.rows)

    def live_rows(self) -> list[Row]:
        return [r for r in self.rows if r is not None]

    def reset(self) -> None:
        """Drop the rows (the cache's buffers stay: the next rows write their columns before
        anything reads them)."""
        self.rows, self.length, self.last, self.holds = [], [], [], []
        self._sampling = self._keep_rows = self._prefix_step = None

    def release(self) -> None:
        """Drop the rows, the cache's buffers and the shared prefix block."""
        self.reset()
        self.cache = None
        self.prefix = None

    def stale(self) -> bool:
        """True when the batch is empty and the cache's buffers were made for another model (or
        dtype, device): they are not reusable."""
        return self.cache is not None and not self.rows and self._model_key() != self._cache_key

    def claim(self, need: int, expected: int) -> int:
        """A free slot with room for `need` columns (growing the cache when it must); `expected`:
        how many rows the batch is about to hold (sizes a new cache)."""
        self.version += 1
        if self.cache is None:
            self._cache_key = self._model_key()
            self.cache = SlotCache(slots=self._slots_for(expected), columns=max(need, 64), device=self.device)
        slot = next((i for i, r in enumerate(self.rows) if r is None), len(self.rows))
        if slot == len(self.rows):
            self.rows.append(None)
            self.length.append(0)
            self.last.append(self.pad_id)
            self.holds.append(False)
        c = self.cache
        if slot >= c.slots or need > c.columns:  # grow geometrically: copies stay rare
            # Doubling (not 1.5x): a multi-turn rollout's contexts grow every turn, and each growth
            # zeroes and copies every slot's buffers while the whole batch waits (on the CPU a
            # 256-slot tiny:1m cache is ~300 MB): one growth where 1.5x took two.
            c.reserve(slots=self._slots_for(slot + 1) if slot >= c.slots else 0,
                      columns=max(need, 2 * c.columns) if need > c.columns else 0)
            self.stats["cache_grows"] += 1
        return slot

    def _slots_for(self, rows: int) -> int:
        """Slots for a cache that must hold `rows`: the power of two at or above (at least 8), at most
        `max_slots` (when that still holds them). A rollout's first rows arrive in waves (156, then
        100 more: the 256-row rollout benchmark); sized to the first wave, the cache grew, zeroing
        and copying every slot's buffers while the batch waited."""
        n = max(8, 1 << (max(rows, 1) - 1).bit_length())
        return max(rows, min(n, self.max_slots)) if self.max_slots is not None else n

    def seat(self, row: Row, past: RowKV | None, need: int, expected: int) -> int:
        """Give a row about to be prefilled in the decode cache a slot, its past (kept or shared
        cache) copied there; its length is the past's until its new tokens are written."""
        slot = self.claim(need, expected)
        n = past[0][0].shape[1] if past else 0
        if past:
            self.cache.place(slot, past)
        self.rows[slot], self.length[slot], self.last[slot] = row, n, self.pad_id
        self.holds[slot] = self.prefix is not None and self.prefix.holds(past)
        return slot

    def admit(self, row: Row, kv: RowKV, token: int, expected: int = 8) -> None:
        """Put a row prefilled in a cache of its own into a free slot, its first token to feed next."""
        n = kv[0][0].shape[1]
        slot = self.claim(n + row.req.max_new_tokens + 1, expected)
        self.cache.place(slot, kv)
        self.rows[slot], self.length[slot], self.last[slot], self.holds[slot] = row, n, token, False

    def end(self, slot: int, kept: KeptCaches) -> None:
        """Free a finished row's slot, keeping its cache when its request names a session."""
        row = self.rows[slot]
        if row is not None and row.req.session is not None:
            kept.keep(row, self.cache.take(slot, self.length[slot]))
        self.rows[slot], self.length[slot], self.last[slot], self.holds[slot] = None, 0, self.pad_id, False

    def tidy(self) -> None:
        """Drop trailing free slots; when more than `idle_share` of the rest are free, move the last
        live rows down into the free slots (copies only the moved rows)."""
        self._drop_free_tail()
        if not self.rows:  # the buffers stay for the rows still to come this session
            return
        free = [i for i, r in enumerate(self.rows) if r is None]
        if len(free) <= self.idle_share * len(self.rows):
            return
        for dst in free:
            src = len(self.rows) - 1
            if src <= dst:
                break
            self.cache.move(src, dst, self.length[src])
            self.version += 1
            self.stats["moved_rows"] += 1
            self.rows[dst], self.length[dst], self.last[dst] = self.rows[src], self.length[src], self.last[src]
            self.holds[dst], self.holds[src] = self.holds[src], False
            self.rows[src] = None
            self._drop_free_tail()

    def keep_index(self, live: list[int], n: int) -> torch.Tensor | None:
        """The live slots' rows among n forward rows (None: all n are live); rebuilt when rows change."""
        if len(live) == n:
            return None
        if self._keep_rows is None or self._keep_rows[0] != self.version:
            self._keep_rows = (self.version, torch.tensor(live, device=self.device))
        return self._keep_rows[1]

    def prefix_step(self, n: int) -> PrefixStep | None:
        """How a decode step over the first n slots reads the shared prefix once (shared_prefix.py),
        or None: no block, fewer than `min_prefix_rows` slots hold it, or fewer than half (then the other rows'
        own prefix reads, gathered, would cost more than the one read saves). Rebuilt when rows change."""
        cached = self._prefix_step
        if cached is None or cached[0] != self.version or cached[1] is not self.prefix:
            step = None
            if self.prefix is not None:
                own = [i for i in range(n) if not self.holds[i]]
                if 2 * len(own) <= n and n - len(own) >= self.min_prefix_rows:
                    step = PrefixStep(self.prefix.kv, torch.tensor(own, device=self.device) if own else None)
            self._prefix_step = (self.version, self.prefix, step)
        return self._prefix_step[2]

    def row_sampling(self, rows: list[Row]) -> RowSampling:
        """The live rows' sampling settings as tensors, rebuilt only when the rows changed."""
        if self._sampling is None or self._sampling[0] != self.version:
            self._sampling = (self.version, RowSampling.of([r.req.sampling for r in rows], self.device))
        return self._sampling[1]

    def _model_key(self) -> tuple:
        model = self.model()
        p = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        return id(model), getattr(p, "dtype", None), self.device

    def _drop_free_tail(self) -> None:
        while self.rows and self.rows[-1] is None:
            del self.rows[-1], self.length[-1], self.last[-1], self.holds[-1]
