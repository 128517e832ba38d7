"""KV caches for LocalGenerator: the slot cache of the running batch, kept rows, padded prefills.

The running batch lives in a `SlotCache`: one slot per sequence, decode steps and prefills write
in place (no per-step `torch.cat` of the whole cache, which is what DynamicLayer does and what
dominates a CPU decode step for long contexts), and nothing else moves when a row joins or
leaves. A finished turn's cache is kept as a `RowKV` (its real columns) and copied into a slot
again for the trajectory's next turn. `new_cache` / `cache_of_rows` / `take_row` serve the padded
prefill of attention kernels that cannot take masks by position (prefill.py).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def cache_kwarg(model: Any, cache: Any) -> dict[str, Any]:
    """`{name: cache}`, the cache argument of a forward call of `model` under the name its forward
    takes: transformers 5.24 renamed `past_key_values` to `cache` (the old name warns, and goes in
    5.40), models of earlier releases and remote code know only `past_key_values`, and a forward
    with **kwargs would silently drop a name it does not know. A peft model is asked of its base."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return {_cache_name(type(base)): cache}


@functools.cache
def _cache_name(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The cache a forward returned (`out.cache` from transformers 5.24, `out.past_key_values` before)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def new_cache() -> DynamicCache:
    """An empty cache for a prefill forward."""
    return DynamicCache()


RowKV = list[tuple[torch.Tensor, torch.Tensor]]
"""One sequence's cache: per layer (keys, values), each [heads, L, head_dim], no padding."""


def take_row(cache: DynamicCache, i: int, columns: torch.Tensor) -> RowKV:
    """Row i's keys/values at `columns` (its real, unpadded columns, in order)."""
    return [(layer.keys[i].index_select(1, columns), layer.values[i].index_select(1, columns)) for layer in cache.layers]


def cache_of_rows(pasts: list[RowKV | None]) -> tuple[DynamicCache, torch.Tensor]:
    """A cache holding each row's past right-aligned (rows without a past are all padding),
    and its mask [B, P] (long, 1 on real columns). P = longest past."""
    some = next(p for p in pasts if p)
    lengths = [p[0][0].shape[1] if p else 0 for p in pasts]
    width = max(lengths)
    ref_k, ref_v = some[0]
    mask = torch.zeros((len(pasts), width), dtype=torch.long, device=ref_k.device)
    data = []
    for layer_idx in range(len(some)):
        h, d, dv = ref_k.shape[0], ref_k.shape[2], ref_v.shape[2]
        keys = ref_k.new_zeros((len(pasts), h, width, d))
        values = ref_v.new_zeros((len(pasts), h, width, dv))
        for i, (p, n) in enumerate(zip(pasts, lengths)):
            if p:
                keys[i, :, width - n :] = p[layer_idx][0]
                values[i, :, width - n :] = p[layer_idx][1]
        data.append((keys, values))
    cache = DynamicCache(ddp_cache_data=data)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return cache, mask


class SlotLayer(DynamicLayer):
    """One layer of a SlotCache: buffers [slots, heads, columns, head_dim]."""

    def __init__(self, owner: "SlotCache", keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.buf_k, self.buf_v = keys, values
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write each row's new keys/values [B, heads, Q, head_dim] at that row's own columns
        (`owner.step_cols` [B, Q]) and return the step's rows' buffers up to `owner.width`."""
        o = self.owner
        rows, cols = o.step_rows(key_states.shape[0]), o.step_cols
        self.buf_k[rows.unsqueeze(1), :, cols] = key_states.transpose(1, 2)
        self.buf_v[rows.unsqueeze(1), :, cols] = value_states.transpose(1, 2)
        if o.rows is None:  # the first B slots: a view, nothing copied
            return self.buf_k[: len(rows), :, : o.width], self.buf_v[: len(rows), :, : o.width]
        if isinstance(o.rows, slice):  # consecutive slots (new rows seated at the end): a view too
            return self.buf_k[o.rows, :, : o.width], self.buf_v[o.rows, :, : o.width]
        return self.buf_k[:, :, : o.width].index_select(0, rows), self.buf_v[:, :, : o.width].index_select(0, rows)

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return getattr(self, "buf_k", None)

    @keys.setter
    def keys(self, value) -> None:  # DynamicLayer.__init__ assigns None
        pass

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return getattr(self, "buf_v", None)

    @values.setter
    def values(self, value) -> None:
        pass


class SlotCache(DynamicCache):
    """The decode cache of LocalGenerator: one slot per sequence, tokens left-aligned.

    Slot s holds its sequence's keys/values at columns [0, length_s), so a column is a position.
    A forward over some slots (`begin_step`) writes each row's new tokens at the columns it is
    given: a decode step writes one column per slot (its length), a prefill writes a row's new
    tokens right after its past, which was `place`d there first. Rows of any length share a step
    with no padding to shift; a finished sequence frees its slot and a new one takes it. Nothing
    else moves, except when the buffers grow (columns or slots) or are compacted.

    The buffers are made on the first `place` or forward (`like`, when given, makes them at once):
    their heads, head size and dtype are the model's, per layer.
    """

    def __init__(self, like: RowKV | None = None, *, slots: int, columns: int,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.layer_class_to_replicate = None
        self.layers = []
        self._slots, self._columns = int(slots), int(columns)
        dev = torch.device(device) if device is not None else (like[0][0].device if like else torch.device("cpu"))
        self.row_index = torch.arange(self._slots, device=dev)
        self.write_pos = torch.zeros(self._slots, dtype=torch.long, device=dev)
        self.step_cols = self.write_pos[:, None]
        self.rows: torch.Tensor | slice | None = None  # the step's slots; None: slots [0, B)
        self.width, self.query_len = 1, 1
        if like:
            self.layers = self._new_layers([(k.shape[0], k.shape[2], v.shape[2], k.dtype) for k, v in like])

    def _new_layers(self, shapes: list[tuple[int, int, int, torch.dtype]]) -> list[SlotLayer]:
        """Empty layers of these (heads, key size, value size, dtype), at the cache's capacity."""
        dev = self.write_pos.device
        return [SlotLayer(self, torch.zeros((self._slots, h, self._columns, dk), dtype=dt, device=dev),
                                 torch.zeros((self._slots, h, self._columns, dv), dtype=dt, device=dev))
                       for h, dk, dv, dt in shapes]

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def columns(self) -> int:
        return self._columns

    def step_rows(self, b: int) -> torch.Tensor:
        if self.rows is None:
            return self.row_index[:b]
        return self.row_index[self.rows] if isinstance(self.rows, slice) else self.rows

    def begin_step(self, write_pos: torch.Tensor, rows: torch.Tensor | slice | None = None) -> None:
        """Before a forward: where each of its rows writes its new tokens, `write_pos` [B] (one token
        each, a decode step) or [B, Q] (a prefill), and which slots the rows are (`rows` [B]; a
        slice of consecutive slots or None, slots [0, B): read back as views, not copied). Every
        row sees columns [0, width)."""
        if write_pos.dim() == 1:
            b = write_pos.shape[0]
            self.write_pos[:b] = write_pos
            self.step_cols = self.write_pos[:b, None]
        else:
            self.step_cols = write_pos
        self.rows = rows
        self.query_len = self.step_cols.shape[1]
        self.width = int(self.step_cols.max()) + 1

    def begin_full_step(self) -> None:
        """Before a fixed-shape decode step over every slot and column (decode_graph.py): slot i
        writes at `write_pos[i]`, which the caller fills in place (no host sync)."""
        self.step_cols, self.rows, self.query_len, self.width = self.write_pos[:, None], None, 1, self._columns

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx == len(self.layers):  # the first forward makes the buffers, from the model's own shapes
            self.layers += self._new_layers([(key_states.shape[1], key_states.shape[3], value_states.shape[3],
                                              key_states.dtype)])
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns before the step's queries (the model's masks and positions read this)."""
        return self.width - self.query_len

    def reserve(self, slots: int, columns: int) -> None:
        """Grow the buffers to at least `slots` x `columns` (copying what they hold)."""
        s, c = max(slots, self._slots), max(columns, self._columns)
        if s == self._slots and c == self._columns:
            return
        for layer in self.layers:
            for name in ("buf_k", "buf_v"):
                old = getattr(layer, name)
                new = old.new_zeros((s, old.shape[1], c, old.shape[3]))
                new[: old.shape[0], :, : old.shape[2]] = old
                setattr(layer, name, new)
        self._slots, self._columns = s, c
        self.row_index = torch.arange(s, device=self.row_index.device)
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(s - self.write_pos.shape[0])])
        self.step_cols = self.write_pos[:, None]

    def place(self, slot: int, row: RowKV) -> None:
        """Copy one sequence's cache (per layer [heads, L, head_dim]) into `slot`, columns [0, L)."""
        if not self.layers:
            self.layers = self._new_layers([(k.shape[0], k.shape[2], v.shape[2], k.dtype) for k, v in row])
        for layer, (k, v) in zip(self.layers, row):
            n = k.shape[1]
            layer.buf_k[slot, :, :n] = k
            layer.buf_v[slot, :, :n] = v

    def take(self, slot: int, length: int) -> RowKV:
        return [(layer.buf_k[slot, :, :length].clone(), layer.buf_v[slot, :, :length].clone()) for layer in self.layers]

    def move(self, src: int, dst: int, length: int) -> None:
        for layer in self.layers:
            layer.buf_k[dst, :, :length] = layer.buf_k[src, :, :length]
            layer.buf_v[dst, :, :length] = layer.buf_v[src, :, :length]
