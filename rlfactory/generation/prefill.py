"""Prefill: new requests join the running batch.

Each new request takes a free slot of the decode cache, whatever cache it can reuse is copied
there (its own trajectory's cache from its previous turn, a kept session, or a prefix it shares
with the other new rows, computed once), and a forward over those slots writes the new tokens
right after it (masks by position); their first token is sampled. New rows of very different
lengths (one brings a 256-token tool response, another a few tokens) prefill in separate forwards
on the CPU, where that saves more padded positions than the extra forward costs
(`prefill_groups`). Attention kernels that take only padding masks (flash, flex) prefill in a
left-padded cache of their own instead and each row is then copied into its slot.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from rlfactory.generation.attention_masks import MaskPlan
from rlfactory.generation.forward import Forward
from rlfactory.generation.kept import KeptCaches
from rlfactory.generation.kv_cache import RowKV, cache_kwarg, cache_of_rows, new_cache, take_row
from rlfactory.generation.rows import Row
from rlfactory.generation.shared_prefix import SharedPrefix, common_length
from rlfactory.generation.slots import Slots
from rlfactory.generation.stops import StopCheck
from rlfactory.generation.vision import VisionPrefill, pixel_kwargs

PREFILL_OVERHEAD_TOKENS = 48
"""What one more prefill forward costs on the CPU, in prefilled tokens: rlfactory's tiny 10M model
on 2 CPU cores (1 or 2 threads) took 7-10 ms for a forward of 8 tokens and 0.12-0.2 ms per token
more. A prefill of rows of 512, 64 and 64 new tokens took 400 ms padded into one forward against
146 ms in three (1 thread)."""


def prefill_groups(lengths: list[int], device: torch.device) -> list[list[int]]:
    """The forwards that prefill rows of these new-token counts (positions into `lengths`). On the
    CPU, where a forward costs its tokens, rows of very different lengths go in separate forwards
    where that saves more padded positions than PREFILL_OVERHEAD_TOKENS (the split of
    rlfactory/passes.py's `plan_micro_batches`, rows without prompts). On an accelerator a small
    model's forward costs its kernel launches, not its padded positions (decode_graph.py: ~45 ms of
    launches for well under 5 ms of GPU work), so they stay one."""
    n = len(lengths)
    top = max(lengths, default=0)
    # No split can save more padding than one forward holds: one forward, without planning (the
    # plan is Python, O(rows^2): 2-7 ms a call in the rollout benchmark, every step with arrivals).
    if device.type != "cpu" or n < 2 or sum(top - x for x in lengths) <= PREFILL_OVERHEAD_TOKENS:
        return [list(range(n))]
    return length_groups(lengths, PREFILL_OVERHEAD_TOKENS)


def length_groups(lengths: list[int], overhead: int) -> list[list[int]]:
    """The cheapest split of rows into forwards, a forward costing `overhead` plus its rows times its
    longest row: `plan_micro_batches(lengths, 0s, 0s, overhead=overhead)`'s cost, planned over the
    distinct lengths (some split that cuts only between different lengths is cheapest: a row in a
    later forward as short as the earlier forward's longest costs no more there). Returns each
    forward's row positions in ascending order, shortest forward first."""
    values = sorted(set(lengths))
    count = Counter(lengths)
    rows = [0]  # rows of the first k distinct lengths
    for v in values:
        rows.append(rows[-1] + count[v])
    best = [0] + [float("inf")] * len(values)
    cut = [0] * (len(values) + 1)
    for k in range(1, len(values) + 1):
        for i in range(k - 1, -1, -1):  # the last forward holds lengths values[i:k]
            total = best[i] + (rows[k] - rows[i]) * values[k - 1] + overhead
            if total < best[k]:
                best[k], cut[k] = total, i
    bounds, k = [], len(values)
    while k > 0:
        bounds.append((values[cut[k]], values[k - 1]))
        k = cut[k]
    return [[p for p, x in enumerate(lengths) if lo <= x <= hi] for lo, hi in reversed(bounds)]


class Prefill:
    """`prefill(rows)` seats the new rows and samples their first token; returns the rows already
    done (max_new_tokens <= 0, or a stop at their first token)."""

    def __init__(self, forward: Forward, slots: Slots, kept: KeptCaches, stops: StopCheck, pad_id: int,
                 device: torch.device, stats: dict[str, float], min_shared_prefix: int = 16,
                 vision: VisionPrefill | None = None) -> None:
        self.forward = forward
        self.slots = slots
        self.kept = kept
        self.stops = stops
        self.pad_id = pad_id
        self.device = device
        self.stats = stats
        self.min_shared_prefix = min_shared_prefix
        self.vision = vision  # image rows' pixels and M-RoPE positions (None: text only)

    def __call__(self, rows: list[Row]) -> list[Row]:
        now = time.perf_counter()
        for r in rows:
            r.t_start = now
        done = [r for r in rows if r.req.max_new_tokens <= 0]
        for r in done:
            r.finish = "length"
        rows = [r for r in rows if r.req.max_new_tokens > 0]
        if not rows:
            return done
        pasts, news = map(list, zip(*(self.kept.reuse(r, self.vision, self.forward.model()) for r in rows)))
        self._share_prefix(pasts, news)
        plan = self.forward.position_plan()
        lengths = [len(n) for n in news]
        expected = self.slots.live + len(rows)  # all of this step's rows, so one group's seats do not size the cache
        for group in prefill_groups(lengths, self.device):
            part = ([rows[i] for i in group], [pasts[i] for i in group], [news[i] for i in group], expected)
            done += self._in_slots(*part, plan) if plan is not None else self._padded(*part)
            self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(lengths)
        return done

    def _in_slots(self, rows: list[Row], pasts: list[RowKV | None], news: list[list[int]], expected: int,
                  plan: MaskPlan) -> list[Row]:
        """Prefill in the decode cache itself: each row takes a free slot, its past (kept or shared
        cache) is copied there, and one forward over those slots writes its new tokens right after
        it. New tokens are right-aligned in the forward (its last query is each row's last token);
        a shorter row's padding queries write past its end, where its decode steps overwrite them
        before anything reads them, and no real query sees them (masks by position)."""
        slots = self.slots
        n_past = [p[0][0].shape[1] if p else 0 for p in pasts]
        q = max(len(n) for n in news)
        seats = [slots.seat(row, past, p + q + row.req.max_new_tokens + 1, expected)
                 for row, past, p in zip(rows, pasts, n_past)]
        ids = torch.full((len(rows), q), self.pad_id, dtype=torch.long)
        cols = torch.empty((len(rows), q), dtype=torch.long)
        for i, (n, p) in enumerate(zip(news, n_past)):
            pad = q - len(n)
            ids[i, pad:] = torch.tensor(n, dtype=torch.long)
            cols[i, pad:] = torch.arange(p, p + len(n))
            cols[i, :pad] = torch.arange(p + len(n), p + q)
        ids, cols = ids.to(self.device), cols.to(self.device)
        cache = slots.cache
        # New rows seated in consecutive slots (the free ones at the end, as on the CPU) are read back
        # as a view of the cache: an index_select copied every new row's whole cache in every layer.
        consecutive = seats == list(range(seats[0], seats[0] + len(seats)))
        cache.begin_step(cols, rows=slice(seats[0], seats[-1] + 1) if consecutive
                         else torch.tensor(seats, device=self.device))
        keys = torch.arange(cache.width, device=self.device).expand(len(rows), -1)  # a key's column is its position
        mask = plan.build(keys, torch.ones_like(keys, dtype=torch.bool), cols)
        pos, pixels = self._positions(rows, n_past, news, cols)
        tokens, lps = self.forward.draw(rows, self.forward.logits(rows, ids, mask, pos, cache, pixels=pixels))
        done = self.stops.record(rows, tokens, lps)
        for row, slot, tok, p, n in zip(rows, seats, tokens, n_past, news):
            slots.length[slot], slots.last[slot] = p + len(n), tok
            if row.finish is not None:  # done at its first token: keep its cache, free the slot
                slots.end(slot, self.kept)
        if done:
            slots.tidy()
        return done

    def _positions(self, rows: list[Row], n_past: list[int], news: list[list[int]], cols: torch.Tensor
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """(position ids, pixel keywords) of an in-slot prefill: the columns for text rows; with
        image rows, [3, B, q] M-RoPE positions (each text row's columns in all three) and the new
        images' pixels, which the vision encoder sees once, here."""
        if not any(r.req.images for r in rows):
            return cols, None
        if self.vision is None:
            raise ValueError("a request holds images but the generator has no image processor "
                             "(LocalGenerator(pixels=...): the vision-language ToolManager)")
        model = self.forward.model()
        q = cols.shape[1]
        pos = cols.unsqueeze(0).repeat(3, 1, 1)
        parts = []
        for i, (row, p, n) in enumerate(zip(rows, n_past, news)):
            if not row.req.images:
                parts.append(None)
                continue
            v = self.vision.row(model, row.req.prompt_ids, row.req.images, p)
            row.rope_delta = v.delta
            pos[:, i, : q - len(n)] += v.delta  # padding queries: past the row's end, as its decode steps
            pos[:, i, q - len(n):] = v.positions.to(pos.device)
            parts.append(v)
        return pos, pixel_kwargs(parts, self.device)

    def _padded(self, rows: list[Row], pasts: list[RowKV | None], news: list[list[int]], expected: int) -> list[Row]:
        """Prefill for attention kernels that take only 2D padding masks (flash, flex): the rows'
        pasts right-aligned in a cache of their own, the new tokens left-padded after them; each
        row's cache is then copied into a slot of the decode cache."""
        if any(r.req.images for r in rows):
            raise NotImplementedError("requests with images prefill in the decode cache, with masks by position: "
                                      "set model.attn_implementation to sdpa or eager")
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
        tokens, lps = self.forward.draw(rows, self.forward.logits(rows, ids, mask, pos, cache))
        done = self.stops.record(rows, tokens, lps)
        for i, (row, tok) in enumerate(zip(rows, tokens)):
            if row.finish is None:
                self.slots.admit(row, take_row(cache, i, mask[i].nonzero().squeeze(1)), tok, expected)
            elif row.req.session is not None:
                self.kept.keep(row, take_row(cache, i, mask[i].nonzero().squeeze(1)))
        return done

    def _share_prefix(self, pasts: list[RowKV | None], news: list[list[int]]) -> None:
        """Rows without a kept cache that start with the same ids (a shared system prompt, the
        n samples of one prompt) get that common prefix computed once, by a one-row forward. Where
        decode steps read a shared block once (shared_prefix.py), the first such prefix becomes the
        decode cache's block, and later rows that start with its ids take it as their past. Then
        each group of rows that shares more than that (the n samples of each of several prompts)
        gets the rest of its own prefix computed once on top of it (`_share_groups`)."""
        rows = [i for i, p in enumerate(pasts) if p is None]  # the rest continue a kept cache of their own
        if rows and self.slots.prefix is not None:
            self._from_block(rows, pasts, news)
        self._share_common([i for i in rows if pasts[i] is None], pasts, news)
        self._share_groups(rows, pasts, news)

    def _share_common(self, fresh: list[int], pasts: list[RowKV | None], news: list[list[int]]) -> None:
        """The prefix common to all rows in `fresh` (no past yet), computed once."""
        if len(fresh) < 2:
            return
        first = news[fresh[0]]
        common = self._text_prefix(first, min(len(news[i]) for i in fresh) - 1)  # each row keeps >= 1 id to prefill
        for i in fresh[1:]:
            common = common_length(news[i][:common], first)
        if common < self.min_shared_prefix:
            return
        shared = self._extend(None, first[:common])
        self.stats["shared_prefix_tokens"] += common * (len(fresh) - 1)
        if self.slots.prefix is None and self.forward.reads_prefix_once():
            self.slots.prefix = SharedPrefix(tuple(first[:common]), shared)
        for i in fresh:
            pasts[i], news[i] = shared, news[i][common:]

    def _share_groups(self, rows: list[int], pasts: list[RowKV | None], news: list[list[int]]) -> None:
        """Rows (no kept cache; their past, if any, the prefix they all share) that start their new
        ids alike, at least min_shared_prefix of them, form a group: GRPO's n samples of a prompt,
        when a step brings several prompts whose common start is only the system prompt's first
        line (BFCL's ~600-token prompts each list their own functions: every sample prefilled its
        prompt in full). Each group's common ids are computed once, by a one-row forward on top of
        the rows' past, and become every member's past. Text models only: a vision-language
        model's positions after a past are the model's M-RoPE state, not the cache length, so its
        rows keep the batch's common prefix alone."""
        if len(rows) < 2 or getattr(self.forward.model().config, "image_token_id", None) is not None:
            return
        groups: list[tuple[list[int], int]] = []  # (members, ids they all share)
        for i in rows:
            limit = self._text_prefix(news[i], len(news[i]) - 1)  # each row keeps >= 1 id to prefill
            best, shared = None, 0
            for g, (members, n) in enumerate(groups):
                if pasts[members[0]] is pasts[i]:
                    head, k = news[members[0]], min(n, limit)
                    m = k if head[:k] == news[i][:k] else common_length(head[:k], news[i])  # a sample: one C compare
                    # a row joins the group it shares most with, if that keeps at least half of what
                    # the group shares: two prompts whose function lists start alike stay two groups
                    if m > shared and m >= max(self.min_shared_prefix, n // 2):
                        best, shared = g, m
            if best is None:
                groups.append(([i], limit))
            else:
                groups[best] = (groups[best][0] + [i], shared)
        for members, n in groups:
            if len(members) < 2 or n < self.min_shared_prefix:
                continue
            kv = self._extend(pasts[members[0]], news[members[0]][:n])
            self.stats["shared_prefix_tokens"] += n * (len(members) - 1)
            for i in members:
                pasts[i], news[i] = kv, news[i][n:]

    def _extend(self, past: RowKV | None, ids: list[int]) -> RowKV:
        """The cache of `past` (None: nothing) followed by `ids`, by a one-row forward."""
        cache = cache_of_rows([past])[0] if past else new_cache()
        width = past[0][0].shape[1] if past else 0
        model = self.forward.model()
        model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device), **cache_kwarg(model, cache),
              use_cache=True, logits_to_keep=1)
        return take_row(cache, 0, torch.arange(width + len(ids), device=self.device))

    def _from_block(self, fresh: list[int], pasts: list[RowKV | None], news: list[list[int]]) -> None:
        """Fresh rows that start with the decode cache's shared block take it as their past. A row
        sharing at least half of it (and min_shared_prefix ids) cuts the block to what they share
        (every row holding the block holds its start): the first rows' common prefix runs a few ids
        into their questions ("Task "), which the next rows may not share."""
        for i in fresh:
            block = self.slots.prefix
            n = common_length(block.ids, news[i][: self._text_prefix(news[i], len(news[i]) - 1)])
            if n < block.length:
                if n < max(self.min_shared_prefix, block.length // 2):
                    continue
                block = self.slots.prefix = block.cut(n)
            pasts[i], news[i] = block.kv, news[i][n:]
            self.stats["shared_prefix_tokens"] += n

    def _text_prefix(self, ids: list[int], n: int) -> int:
        """How many of `ids`' first n can be shared: text positions are 1-D up to the first image only."""
        image_id = getattr(self.forward.model().config, "image_token_id", None)
        if image_id is not None and image_id in ids[:n]:
            return ids.index(image_id)
        return n
