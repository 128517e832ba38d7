"""Static-shape decode steps for DecodeLoop, replayed from a CUDA graph on a GPU.

A decode step of a small model on a GPU is bound by the host, not the GPU: transformers runs each
layer's few dozen kernels from Python, so a step of a 0.6B model at batch 64 costs ~45 ms of
launches for well under 5 ms of GPU work. vLLM and SGLang fix this the same way, and so does this
module: the step is run at shapes that do not change from step to step, recorded once as a CUDA
graph, and replayed (one launch) every step after that.

Fixed shapes: every slot of the SlotCache runs (free slots feed a pad token at position 0 and are
dropped before sampling), and attention covers all of its columns with a mask built inside the
step from each row's write position (key column c is visible to the row writing at column w when
c <= w: the slots are left-aligned, so a column is a position). The shapes change only when the
cache grows (geometrically, so rarely) or a new cache is made (each worker session); a step at a
new shape runs eagerly first (`capture_after` steps: short bursts never pay for a capture), then
the graph is recorded and replayed until the shape changes again. The graph reads its inputs from
tensors it owns (token ids, write positions) that the host refills before each replay.

`StaticDecode(graphs=False)` runs the same fixed-shape step without a graph (on any device: the CPU
tests compare it with the trimmed eager decode step of decode_step.py). A graph is only valid for
the model object and the cache buffers it was recorded with, so it is keyed on both and dropped with the session's
cache (a trainer may change the model between rollouts: switch adapters, move it, replace it).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from rlfactory.generation.attention_masks import FULL, MaskPlan
from rlfactory.generation.kv_cache import SlotCache, cache_kwarg

log = logging.getLogger(__name__)

GRAPH_ATTENTION = ("sdpa", "eager")
"""Attention kernels that take the ready 4D masks of the fixed-shape step."""


def static_mask_plan(model: Any, plan: MaskPlan | None) -> MaskPlan | None:
    """The mask plan of a fixed-shape step: the sliding-window plan itself, or for full-attention
    models a one-kind plan (the step always passes a 4D mask). None when the attention kernel does
    not take 4D masks (flash, flex): then only the trimmed eager step can run the model."""
    if plan is not None:
        return plan
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in GRAPH_ATTENTION:
        return None
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return MaskPlan(frozenset({FULL}), window=0, as_dict=False, additive=impl != "sdpa", dtype=dtype)


class StaticDecode:
    """Decode forwards over all slots of a SlotCache at fixed shapes, from a CUDA graph when `graphs`.

    `logits(model, plan, cache, last, write)` runs one step: `last[i]` / `write[i]` are slot i's
    token to feed and the column it writes (= its length), for the slots in use (the rest of the
    cache's slots feed a pad token at column 0). Returns logits [slots, V] (float, the model's
    dtype), valid until the next call.
    """

    def __init__(self, graphs: bool, pad_id: int = 0, capture_after: int = 2) -> None:
        self.graphs = graphs
        self.pad_id = pad_id
        self.capture_after = capture_after
        self.stats = {"graph_captures": 0, "graph_replays": 0, "static_steps": 0}
        self._key: tuple | None = None
        self._seen = 0  # eager steps run at the current key
        self._graph: Any = None
        self._ids: torch.Tensor | None = None  # [S, 1] long
        self._pos: torch.Tensor | None = None  # [S, 1] long
        self._host: torch.Tensor | None = None  # [2, S] long staging (pinned on CUDA)
        self._cols: torch.Tensor | None = None  # [C]
        self._out: torch.Tensor | None = None  # [S, V] the step's logits

    def release(self) -> None:
        """Drop the graph and the buffers (the session's cache is going away)."""
        self._key, self._graph, self._ids, self._pos, self._host, self._cols, self._out = (None,) * 7
        self._seen = 0

    def logits(self, model: Any, plan: MaskPlan, cache: SlotCache, last: list[int], write: list[int]) -> torch.Tensor:
        key = (id(model), id(cache), cache.slots, cache.columns, cache.layers[0].buf_k.data_ptr(),
               cache.write_pos.data_ptr())
        if key != self._key:
            self._new_shape(key, cache)
        self._load(last, write)
        self.stats["static_steps"] += 1
        if self._graph is not None:
            self._graph.replay()
            self.stats["graph_replays"] += 1
            return self._out
        self._seen += 1
        if not (self.graphs and self._seen > self.capture_after):
            return self._forward(model, plan, cache)
        out = self._capture(model, plan, cache)
        return out if out is not None else self._forward(model, plan, cache)

    # ---- internals ------------------------------------------------------------------------------

    def _new_shape(self, key: tuple, cache: SlotCache) -> None:
        self._graph, self._out, self._key, self._seen = None, None, key, 0
        s, dev = cache.slots, cache.write_pos.device
        self._ids = torch.full((s, 1), self.pad_id, dtype=torch.long, device=dev)
        self._pos = torch.zeros((s, 1), dtype=torch.long, device=dev)
        self._host = torch.zeros((2, s), dtype=torch.long, pin_memory=dev.type == "cuda")
        self._cols = torch.arange(cache.columns, device=dev)

    def _load(self, last: list[int], write: list[int]) -> None:
        """Refill the step's inputs in place: one host->device copy."""
        host, n = self._host, len(last)
        host[0].fill_(self.pad_id)
        host[1].zero_()
        host[0, :n] = torch.tensor(last, dtype=torch.long)
        host[1, :n] = torch.tensor(write, dtype=torch.long)
        self._ids[:, 0].copy_(host[0], non_blocking=True)
        self._pos[:, 0].copy_(host[1], non_blocking=True)

    def _forward(self, model: Any, plan: MaskPlan, cache: SlotCache) -> torch.Tensor:
        """The fixed-shape step (what the graph records): reads only tensors it owns and the cache."""
        pos = self._pos
        cache.write_pos.copy_(pos[:, 0])
        cache.begin_full_step()
        cols = self._cols.unsqueeze(0).expand(pos.shape[0], -1)  # a key's column is its position
        mask = plan.build(cols, cols <= pos, pos)
        out = model(input_ids=self._ids, attention_mask=mask, position_ids=pos, **cache_kwarg(model, cache),
                    use_cache=True, logits_to_keep=1)
        self._out = out.logits[:, -1, :]
        return self._out

    def _capture(self, model: Any, plan: MaskPlan, cache: SlotCache) -> torch.Tensor | None:
        """Run this step eagerly on a side stream (the warm-up CUDA graphs want), record it, and
        return the eager run's logits. On any failure: log it once, turn graphs off, return None."""
        try:
            side = torch.cuda.Stream(device=cache.write_pos.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self._forward(model, plan, cache).clone()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # A dead generator's graphs freed by the cyclic GC in the middle of this capture break
            # it (seen in the GPU tests on torch 2.11, whose capture no longer collects first).
            gc.collect()
            # thread_local: the decode thread records; other threads (tools, the event loop) may
            # use CUDA meanwhile without invalidating the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._forward(model, plan, cache)
        except Exception as e:  # noqa: BLE001 - any model code that cannot be recorded
            log.warning("rollout.cuda_graphs: cannot record %s's decode step as a CUDA graph (%s: %s); "
                        "decoding without graphs from now on", type(model).__name__, type(e).__name__, e)
            self.graphs = False
            self._graph = None
            torch.cuda.synchronize()
            return None
        self._graph = graph
        self.stats["graph_captures"] += 1
        return out
