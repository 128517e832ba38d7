"""The decode loop behind LocalGenerator: slots, prefill, decode steps, stops, kept caches.

Runs in the generator's thread, one `step(new_rows)` at a time:
  1. prefill: each new request takes a free slot of the decode cache, whatever cache it can reuse
     is copied there (its own trajectory's cache from its previous turn, a kept session, or a
     prefix it shares with the other new rows, computed once), and a forward over those slots
     writes the new tokens right after it (masks by position); their first token is sampled.
     New rows of very different lengths (one brings a 256-token tool response, another a few
     tokens) prefill in separate forwards on the CPU, where that saves more padded positions than
     the extra forward costs (`prefill_groups`).
     Attention kernels that take only padding masks (flash, flex) prefill in a left-padded cache
     of their own instead and each row is then copied into its slot.
  2. decode: one forward over all slots (tokens left-aligned, each row writes its own column), a
     token sampled per live row, stops checked; finished rows free their slot (and keep their
     cache when their request names a session). With a `StaticDecode` (on a GPU) the forward runs
     at fixed shapes from a CUDA graph (decode_graph.py); the sampled tokens and their logprobs
     come back to the host in one copy per step.
Nothing moves in the decode cache when rows come and go (see kv_cache.SlotCache); a row's wait
to join is at most one step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlfactory.passes import plan_micro_batches
from rlfactory.generation.attention_masks import MaskPlan, mask_plan
from rlfactory.generation.decode_graph import StaticDecode, static_mask_plan
from rlfactory.protocols import GenRequest
from rlfactory.generation.kv_cache import RowKV, SlotCache, cache_kwarg, cache_of_rows, new_cache, take_row
from rlfactory.generation.sampling import RowSampling, sample, seeded_uniforms

PREFILL_OVERHEAD_TOKENS = 48
"""What one more prefill forward costs on the CPU, in prefilled tokens: rlfactory's tiny 10M model
on 2 CPU cores (1 or 2 threads) took 7-10 ms for a forward of 8 tokens and 0.12-0.2 ms per token
more. A prefill of rows of 512, 64 and 64 new tokens took 400 ms padded into one forward against
146 ms in three (1 thread)."""


def prefill_groups(lengths: list[int], device: torch.device) -> list[list[int]]:
    """The forwards that prefill rows of these new-token counts (positions into `lengths`). On the
    CPU, where a forward costs its tokens, rows of very different lengths go in separate forwards
    where that saves more padded positions than PREFILL_OVERHEAD_TOKENS (rlfactory/passes.py). On
    an accelerator a small model's forward costs its kernel launches, not its padded positions
    (decode_graph.py: ~45 ms of launches for well under 5 ms of GPU work), so they stay one."""
    if device.type != "cpu":
        return [list(range(len(lengths)))]
    none = [0] * len(lengths)
    return plan_micro_batches(lengths, none, none, overhead=PREFILL_OVERHEAD_TOKENS)


def to_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], list[float]]:
    """Sampled tokens [B] and their logprobs [B] as Python lists, in one device->host copy (exact:
    token ids and float32 values are both exact in float64)."""
    both = torch.stack([tokens.to(torch.float64), logprobs.to(torch.float64)]).tolist()
    return [int(t) for t in both[0]], both[1]


@dataclass
class Row:
    req: GenRequest
    future: asyncio.Future
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    t_submit: float
    t_start: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_token: int | None = None


class DecodeLoop:
    """State of the running batch. `model()` returns the model to run (read at every forward)."""

    def __init__(self, model: Callable[[], Any], pad_id: int, device: torch.device, rng: torch.Generator,
                 tokenizer: Any = None, logits_processor: Callable | None = None, min_shared_prefix: int = 16,
                 static: StaticDecode | None = None) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.rng = rng
        self.tokenizer = tokenizer
        self.logits_processor = logits_processor
        self.min_shared_prefix = min_shared_prefix
        self.static = static  # fixed-shape (CUDA graph) decode steps; None = trimmed eager steps
        self.cache: SlotCache | None = None
        self.rows: list[Row | None] = []  # per slot; trailing free slots are dropped
        self.length: list[int] = []  # tokens in the cache, per slot
        self.last: list[int] = []  # sampled token not yet fed, per slot
        self._sampling: tuple[int, RowSampling] | None = None
        self._version = 0  # bumped whenever a slot changes hands
        self.sessions: dict[str, tuple[list[int], RowKV]] = {}
        self.lock = threading.Lock()
        self.gates: dict[tuple[str, ...], list[bool]] = {}
        self._plan: tuple[int, MaskPlan | None, MaskPlan | None] | None = None
        self._keep_rows: tuple[int, torch.Tensor | None] | None = None
        self._cache_key: tuple | None = None  # (model, dtype, device) the cache's buffers were made for
        self.stats = {"steps": 0, "prefills": 0, "prefill_tokens": 0, "reused_tokens": 0,
                      "shared_prefix_tokens": 0, "moved_rows": 0, "tokens": 0, "busy_s": 0.0, "cache_grows": 0}

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.rows)

    def live_rows(self) -> list[Row]:
        return [r for r in self.rows if r is not None]

    def reset(self) -> None:
        """Drop the running batch (the kept sessions stay, and so do the cache's buffers: the next
        rows write their columns before anything reads them; `release` frees them)."""
        self.rows, self.length, self.last, self._sampling, self._keep_rows = [], [], [], None, None

    def release(self) -> None:
        """Drop the running batch and free the cache's buffers (and recorded CUDA graphs)."""
        self.reset()
        self.cache = None
        if self.static is not None:
            self.static.release()

    def step(self, new: list[Row]) -> list[Row]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            done = self._prefill(new) if new else []
            if self.live:
                done += self._decode()
        self.stats["busy_s"] += time.perf_counter() - t0
        return done

    # ---- forward passes ---------------------------------------------------------------------

    def mask_plan(self) -> MaskPlan | None:
        """None for full-attention models (2D padding masks); else how to build position masks."""
        return self._plans()[1]

    def position_plan(self) -> MaskPlan | None:
        """Masks by position for any layer kind (slots are left-aligned: a column is a position);
        None when the model's attention kernel takes only 2D padding masks (flash, flex)."""
        return self._plans()[2]

    def static_plan(self) -> MaskPlan | None:
        """The masks of fixed-shape steps; None when they are off or the model's kernel cannot run them."""
        return self._plans()[2] if self.static is not None else None

    def _plans(self) -> tuple[int, MaskPlan | None, MaskPlan | None]:
        model = self.model()
        if self._plan is None or self._plan[0] != id(model):
            plan = mask_plan(model)
            self._plan = (id(model), plan, static_mask_plan(model, plan))
        return self._plan

    def _logits(self, rows: list[Row], input_ids, mask, pos, cache, keep: torch.Tensor | None = None) -> torch.Tensor:
        model = self.model()
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, **cache_kwarg(model, cache),
                    use_cache=True, logits_to_keep=1)
        return self._process(rows, out.logits[:, -1, :], keep)

    def _process(self, rows: list[Row], logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """The live rows' logits [len(rows), V] (`keep`: their rows in `logits`), after the processor."""
        if keep is not None:
            logits = logits.index_select(0, keep)
        if self.logits_processor is not None:
            logits = self.logits_processor([r.req for r in rows], [r.tokens for r in rows], logits)
        return logits

    def _prefill(self, rows: list[Row]) -> list[Row]:
        now = time.perf_counter()
        for r in rows:
            r.t_start = now
        done = [r for r in rows if r.req.max_new_tokens <= 0]
        for r in done:
            r.finish = "length"
        rows = [r for r in rows if r.req.max_new_tokens > 0]
        if not rows:
            return done
        pasts, news = map(list, zip(*(self._reuse(r) for r in rows)))
        self._share_prefix(pasts, news)
        plan = self.position_plan()
        lengths = [len(n) for n in news]
        for group in prefill_groups(lengths, self.device):
            part = ([rows[i] for i in group], [pasts[i] for i in group], [news[i] for i in group])
            done += self._prefill_in_slots(*part, plan) if plan is not None else self._prefill_padded(*part)
            self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(lengths)
        return done

    def _prefill_in_slots(self, rows: list[Row], pasts: list[RowKV | None], news: list[list[int]],
                          plan: MaskPlan) -> list[Row]:
        """Prefill in the decode cache itself: each row takes a free slot, its past (kept or shared
        cache) is copied there, and one forward over those slots writes its new tokens right after
        it. New tokens are right-aligned in the forward (its last query is each row's last token);
        a shorter row's padding queries write past its end, where its decode steps overwrite them
        before anything reads them, and no real query sees them (masks by position)."""
        n_past = [p[0][0].shape[1] if p else 0 for p in pasts]
        q = max(len(n) for n in news)
        expected = self.live + len(rows)
        slots = []
        for row, past, p in zip(rows, pasts, n_past):
            slot = self._claim(p + q + row.req.max_new_tokens + 1, expected)
            if past:
                self.cache.place(slot, past)
            self.rows[slot], self.length[slot], self.last[slot] = row, p, self.pad_id
            slots.append(slot)
        ids = torch.full((len(rows), q), self.pad_id, dtype=torch.long)
        cols = torch.empty((len(rows), q), dtype=torch.long)
        for i, (n, p) in enumerate(zip(news, n_past)):
            pad = q - len(n)
            ids[i, pad:] = torch.tensor(n, dtype=torch.long)
            cols[i, pad:] = torch.arange(p, p + len(n))
            cols[i, :pad] = torch.arange(p + len(n), p + q)
        ids, cols = ids.to(self.device), cols.to(self.device)
        cache = self.cache
        cache.begin_step(cols, rows=torch.tensor(slots, device=self.device))
        keys = torch.arange(cache.width, device=self.device).expand(len(rows), -1)  # a key's column is its position
        mask = plan.build(keys, torch.ones_like(keys, dtype=torch.bool), cols)
        logits = self._logits(rows, ids, mask, cols, cache)
        tokens, lps = to_host(*sample(logits, RowSampling.of([r.req.sampling for r in rows], self.device), self.rng,
                                      self._uniforms(rows)))
        done = self._record(rows, tokens, lps)
        for row, slot, tok, p, n in zip(rows, slots, tokens, n_past, news):
            self.length[slot], self.last[slot] = p + len(n), tok
            if row.finish is not None:  # done at its first token: keep its cache, free the slot
                self._keep(row, cache.take(slot, self.length[slot]))
                self.rows[slot], self.length[slot], self.last[slot] = None, 0, self.pad_id
        if done:
            self._tidy()
        return done

    def _prefill_padded(self, rows: list[Row], pasts: list[RowKV | None], news: list[list[int]]) -> list[Row]:
        """Prefill for attention kernels that take only 2D padding masks (flash, flex): the rows'
        pasts right-aligned in a cache of their own, the new tokens left-padded after them; each
        row's cache is then copied into a slot of the decode cache."""
        if any(pasts):
            cache, past_mask = cache_of_rows(pasts)
        else:
            cache, past_mask = new_cache(), torch.zeros((len(rows), 0), dtype=torch.long)
        past_mask = past_mask.to(self.device)
        width = max(len(n) for n in news)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, n in enumerate(news):
            ids[i, width - len(n):] = torch.tensor(n, dtype=torch.long)
            new_mask[i, width - len(n):] = 1
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        # Position ids continue each row's past; padding positions get 0 (they are masked out).
        pos = (past_mask.sum(1, keepdim=True) + new_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([past_mask, new_mask], dim=1)
        logits = self._logits(rows, ids, mask, pos, cache)
        tokens, lps = to_host(*sample(logits, RowSampling.of([r.req.sampling for r in rows], self.device), self.rng,
                                      self._uniforms(rows)))
        done = self._record(rows, tokens, lps)
        expected = self.live + sum(r.finish is None for r in rows)
        for i, (row, tok) in enumerate(zip(rows, tokens)):
            if row.finish is None:
                self._admit(row, take_row(cache, i, mask[i].nonzero().squeeze(1)), tok, expected)
            elif row.req.session is not None:
                self._keep(row, take_row(cache, i, mask[i].nonzero().squeeze(1)))
        return done

    def _decode(self) -> list[Row]:
        cache = self.cache
        live = [i for i, r in enumerate(self.rows) if r is not None]
        rows = [self.rows[i] for i in live]
        static = self.static_plan()
        if static is not None:  # every slot, all columns: fixed shapes, replayed from a CUDA graph
            logits = self.static.logits(self.model(), static, cache, self.last, self.length)
            logits = self._process(rows, logits, self._keep_index(live, logits.shape[0]))
        else:
            write = torch.tensor(self.length, dtype=torch.long, device=self.device)
            cache.begin_step(write)
            # Free slots still run (cheaper than compacting every time); they see only their column 0.
            cols = torch.arange(cache.width, device=self.device).unsqueeze(0)
            plan = self.mask_plan()
            if plan is None:
                mask: Any = (cols <= write.unsqueeze(1)).long()
            else:  # left-aligned slots: a key's column is its position
                mask = plan.build(cols.expand(len(write), -1), cols <= write.unsqueeze(1), write.unsqueeze(1))
            last = torch.tensor(self.last, dtype=torch.long, device=self.device).unsqueeze(1)
            logits = self._logits(rows, last, mask, write.unsqueeze(1), cache, self._keep_index(live, len(self.rows)))
        self.stats["steps"] += 1
        tokens, lps = to_host(*sample(logits, self._row_sampling(live, rows), self.rng, self._uniforms(rows)))
        for i, tok in zip(live, tokens):
            self.length[i] += 1
            self.last[i] = tok
        done = self._record(rows, tokens, lps)
        if done:
            for i in live:
                row = self.rows[i]
                if row.finish is not None:
                    if row.req.session is not None:
                        self._keep(row, cache.take(i, self.length[i]))
                    self.rows[i], self.length[i], self.last[i] = None, 0, self.pad_id
            self._version += 1
            self._tidy()
        return done

    def _keep_index(self, live: list[int], n: int) -> torch.Tensor | None:
        """The live slots' rows among n forward rows (None: all n are live); rebuilt when rows change."""
        if len(live) == n:
            return None
        if self._keep_rows is None or self._keep_rows[0] != self._version:
            self._keep_rows = (self._version, torch.tensor(live, device=self.device))
        return self._keep_rows[1]

    def _row_sampling(self, live: list[int], rows: list[Row]) -> RowSampling:
        """The live rows' sampling settings as tensors, rebuilt only when the rows changed."""
        if self._sampling is None or self._sampling[0] != self._version:
            self._sampling = (self._version, RowSampling.of([r.req.sampling for r in rows], self.device))
        return self._sampling[1]

    def _uniforms(self, rows: list[Row]) -> torch.Tensor | None:
        """The rows' uniform numbers for this draw when any row is seeded (None: all draw from rng).
        A seeded row's number is a function of its seed and of how many tokens it has drawn."""
        if all(r.req.seed is None for r in rows):
            return None
        u = torch.rand(len(rows), generator=self.rng, device=self.device, dtype=torch.float64).cpu()
        seeded = [i for i, r in enumerate(rows) if r.req.seed is not None]
        u[seeded] = seeded_uniforms([rows[i].req.seed for i in seeded], [len(rows[i].tokens) for i in seeded])
        return u

    # ---- slots --------------------------------------------------------------------------------

    def _claim(self, need: int, expected: int) -> int:
        """A free slot with room for `need` columns (growing the cache when it must); `expected`:
        how many rows the batch is about to hold (sizes a new cache)."""
        self._version += 1
        key = self._model_key()
        if self.cache is not None and not self.rows and key != self._cache_key:
            self.release()  # buffers made for another model (or dtype, device): not reusable
        if self.cache is None:
            self._cache_key = key
            self.cache = SlotCache(slots=max(8, expected), columns=max(need, 64), device=self.device)
        slot = next((i for i, r in enumerate(self.rows) if r is None), len(self.rows))
        if slot == len(self.rows):
            self.rows.append(None)
            self.length.append(0)
            self.last.append(self.pad_id)
        c = self.cache
        if slot >= c.slots or need > c.columns:  # grow geometrically: copies stay rare
            # Doubling (not 1.5x): a multi-turn rollout's contexts grow every turn, and each growth
            # zeroes and copies every slot's buffers while the whole batch waits (on the CPU a
            # 256-slot tiny:1m cache is ~300 MB): one growth where 1.5x took two.
            c.reserve(slots=2 * c.slots if slot >= c.slots else 0,
                      columns=max(need, 2 * c.columns) if need > c.columns else 0)
            self.stats["cache_grows"] += 1
        return slot

    def _model_key(self) -> tuple:
        model = self.model()
        p = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        return id(model), getattr(p, "dtype", None), self.device

    def _admit(self, row: Row, kv: RowKV, token: int, expected: int = 8) -> None:
        """Put a row prefilled in a cache of its own into a free slot."""
        n = kv[0][0].shape[1]
        slot = self._claim(n + row.req.max_new_tokens + 1, expected)
        self.cache.place(slot, kv)
        self.rows[slot], self.length[slot], self.last[slot] = row, n, token

    def _tidy(self) -> None:
        """Drop trailing free slots; when over a quarter of the rest are free, move the last live
        rows down into the free slots (copies only the moved rows)."""
        self._drop_free_tail()
        if not self.rows:  # the buffers stay for the rows still to come this session
            return
        free = [i for i, r in enumerate(self.rows) if r is None]
        if len(free) * 4 <= len(self.rows):
            return
        for dst in free:
            src = len(self.rows) - 1
            if src <= dst:
                break
            self.cache.move(src, dst, self.length[src])
            self._version += 1
            self.stats["moved_rows"] += 1
            self.rows[dst], self.length[dst], self.last[dst] = self.rows[src], self.length[src], self.last[src]
            self.rows[src] = None
            self._drop_free_tail()

    def _drop_free_tail(self) -> None:
        while self.rows and self.rows[-1] is None:
            del self.rows[-1], self.length[-1], self.last[-1]

    # ---- stops ----------------------------------------------------------------------------------

    def _record(self, rows: list[Row], tokens: list[int], lps: list[float]) -> list[Row]:
        """Append each row's new token and logprob; mark and return the rows that are done."""
        finished = []
        self.stats["tokens"] += len(rows)
        for row, tok, lp in zip(rows, tokens, lps):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            if tok in row.stop_ids:
                row.finish, row.stop_token = "stop", tok
            elif row.stop_strings and self._gate(row.stop_strings)[tok] and self._hit_stop_string(row):
                row.finish = "stop"
            elif len(row.tokens) >= row.req.max_new_tokens:
                row.finish = "length"
            if row.finish is not None:
                finished.append(row)
        return finished

    def _gate(self, stops: tuple[str, ...]) -> list[bool]:
        """Per token id: could this token complete one of `stops`? (Cheap filter before decoding.)"""
        gate = self.gates.get(stops)
        if gate is None:
            vocab = int(getattr(getattr(self.model(), "config", None), "vocab_size", 0) or 0)
            n_tok = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else vocab
            lasts = {s[-1] for s in stops if s}
            one_each = [[i] for i in range(n_tok)]
            if hasattr(self.tokenizer, "batch_decode"):
                texts = self.tokenizer.batch_decode(one_each, skip_special_tokens=False)
            else:
                texts = [self.tokenizer.decode(ids, skip_special_tokens=False) for ids in one_each]
            gate = [any(c in t for c in lasts) or "\ufffd" in t or t == "" for t in texts]
            gate += [True] * max(0, vocab - n_tok)
            self.gates[stops] = gate
        return gate

    def _hit_stop_string(self, row: Row) -> bool:
        window = max(len(s) for s in row.stop_strings) + 4
        tail = self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=False)
        return any(s in tail for s in row.stop_strings)

    # ---- caches kept between turns ------------------------------------------------------------

    def _reuse(self, row: Row) -> tuple[RowKV | None, list[int]]:
        """(kept cache, ids still to prefill) for a request; the kept ids must prefix the prompt."""
        prompt = row.req.prompt_ids
        if row.req.session is None:
            return None, prompt
        with self.lock:
            kept = self.sessions.pop(row.req.session, None)
        if kept is None or len(kept[0]) >= len(prompt) or prompt[: len(kept[0])] != kept[0]:
            return None, prompt
        self.stats["reused_tokens"] += len(kept[0])
        return kept[1], prompt[len(kept[0]):]

    def _keep(self, row: Row, kv: RowKV) -> None:
        """Keep a finished row's cache (every token fed so far) under its session."""
        if row.req.session is None:
            return
        ids = list(row.req.prompt_ids) + row.tokens[:-1]  # the last token was never fed
        if len(ids) == kv[0][0].shape[1]:
            with self.lock:
                self.sessions[row.req.session] = (ids, kv)

    def _share_prefix(self, pasts: list[RowKV | None], news: list[list[int]]) -> None:
        """Rows without a kept cache that start with the same ids (a shared system prompt, the
        n samples of one prompt) get that common prefix computed once, by a one-row forward."""
        fresh = [i for i, p in enumerate(pasts) if p is None]
        if len(fresh) < 2:
            return
        first = news[fresh[0]]
        common = min(len(news[i]) for i in fresh) - 1  # each row keeps >= 1 id to prefill
        for i in fresh[1:]:
            row, k = news[i], 0
            while k < common and row[k] == first[k]:
                k += 1
            common = k
        if common < self.min_shared_prefix:
            return
        ids = torch.tensor([first[:common]], dtype=torch.long, device=self.device)
        cache = new_cache()
        model = self.model()
        model(input_ids=ids, **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)
        shared = take_row(cache, 0, torch.arange(common, device=self.device))
        self.stats["shared_prefix_tokens"] += common * (len(fresh) - 1)
        for i in fresh:
            pasts[i], news[i] = shared, news[i][common:]
