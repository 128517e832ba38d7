"""LocalGenerator: a transformers causal LM served with continuous batching and a KV cache.

Requests are queued by `submit`; one worker coroutine drives the model while there is work. Each
iteration of the worker is one `DecodeLoop.step` (decode.py), run in a dedicated thread so the
event loop keeps serving tool calls meanwhile: it prefills the requests that arrived since the
last iteration into free slots of the running batch, runs one decode step for every sequence in
it, and hands back each sequence that hit a stop token, a stop string or its max_new_tokens. So a
request joins the batch at the next step after it arrives and leaves it the step it finishes;
nobody waits for the slowest sequence of a batch.

Kept between worker sessions: the caches kept under a request's `session` (released by `forget`,
which the engine calls when a trajectory ends) and the decode cache's buffers (freed by
`free_cache`, or when `generator.model` is replaced by another model). Once the queue drains the
batch itself is dropped, so the trainer may update or replace `generator.model` between rollouts.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import torch

from rlfactory.openmp import release_pool
from rlfactory.generation.admission import AdmissionWait
from rlfactory.generation.attention_masks import mask_plan
from rlfactory.generation.decode import DecodeLoop
from rlfactory.generation.decode_graph import StaticDecode
from rlfactory.generation.heap import keep_freed_memory
from rlfactory.generation.rows import Row
from rlfactory.generation.vision import VisionPrefill, vision_body
from rlfactory.chat.vision import PixelSource
from rlfactory.protocols import GenRequest, GenResult, generate_all


class LocalGenerator:
    """Serve `model` (a transformers causal LM) to many coroutines at once.

    `stop_token_ids` / `stop_strings` are the defaults for requests that do not set their own;
    stop strings and `GenResult.text` need `tokenizer` (anything with `decode(ids)`).
    `logits_processor(requests, generated, logits) -> logits`, when given, may change each row's
    next-token logits [B, V] before sampling (`generated[i]`: the ids sampled so far for
    `requests[i]`); recorded logprobs are then those of the processed logits.
    Full-attention and sliding-window layers are supported (Mistral, Gemma 2/3, gpt-oss, Qwen2 with
    `use_sliding_window`: masks by real positions, see attention_masks.py); other layer kinds
    (linear attention, chunked attention) are refused with NotImplementedError.
    Waiting requests join the batch by `GenRequest.priority` (lower first; see `_admit`).
    On a CUDA device with `cuda_graphs` (and sdpa or eager attention), decode steps run at fixed
    shapes replayed from a CUDA graph (decode_graph.py): same tokens, a fraction of the host time.
    On the CPU it fixes glibc's heap thresholds for the process (heap.py: freed temporaries are
    reused rather than given back and faulted in again at the next step).
    `admission_wait`: the most a step of a small batch is held for turns about to arrive, in decode
    steps' time (admission.py; 0: never held).
    `pixels` (a vision-language model's ToolManager) lets requests carry images (`GenRequest.images`):
    each is encoded once, in the prefill of its turn, at the model's own M-RoPE positions
    (vision.py); decode steps of rows after images run without CUDA graphs.
    """

    def __init__(
        self,
        model: Any,
        pad_id: int,
        stop_token_ids: Sequence[int] = (),
        *,
        tokenizer: Any = None,
        stop_strings: Sequence[str] = (),
        device: str | torch.device = "cpu",
        max_batch: int = 256,
        seed: int | None = None,
        logits_processor: Callable[[list[GenRequest], list[list[int]], torch.Tensor], torch.Tensor] | None = None,
        cuda_graphs: bool = True,
        pixels: PixelSource | None = None,
        admission_wait: float = 1.0,
    ) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch = int(max_batch)
        self.rng = torch.Generator(device=self.device)
        if seed is not None:
            self.rng.manual_seed(int(seed))
        if self.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer")
        mask_plan(model)  # refuses layer kinds and attention kernels it cannot mask, before any work
        if self.device.type == "cpu":
            keep_freed_memory()  # a step's temporaries reuse the heap instead of faulting in fresh pages (heap.py)
        static = StaticDecode(graphs=True, pad_id=self.pad_id) if cuda_graphs and self.device.type == "cuda" else None
        vision = VisionPrefill(pixels) if pixels is not None else None
        if vision is not None:
            vision_body(model)  # a model that takes no pixels is refused here, not at the first image
        self.loop = DecodeLoop(lambda: self.model, self.pad_id, self.device, self.rng, tokenizer, logits_processor,
                               static=static, vision=vision, max_slots=self.max_batch)
        self.loop.stats.update(admission_waits=0, admission_wait_s=0.0)
        self._pending: list[Row] = []
        self.admission = AdmissionWait(admission_wait)
        self._arrival: asyncio.Event | None = None  # set by submit while the worker holds a step
        self._worker: asyncio.Task | None = None
        self._free_pending = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlfactory-gen")
        self.threads: int | None = None
        """Torch CPU threads of the generation thread; None = the process's (as when the generator
        was made). Asynchronous training lowers it while the learner trains (they share the cores)."""
        self._process_threads = torch.get_num_threads()

    @property
    def logits_processor(self) -> Callable | None:
        return self.loop.forward.logits_processor

    @logits_processor.setter
    def logits_processor(self, fn: Callable | None) -> None:
        self.loop.forward.logits_processor = fn

    @property
    def stats(self) -> dict[str, float]:
        """Counters: decode steps, prefills, prefilled / reused / shared tokens, sampled tokens, busy
        seconds; with CUDA graphs also graph captures and replays."""
        static = self.loop.decode.static
        if static is None:
            return self.loop.stats
        return {**self.loop.stats, **static.stats}

    @property
    def busy(self) -> bool:
        """True while requests are queued or being generated (read from any thread)."""
        worker = self._worker
        return worker is not None and not worker.done()

    @property
    def kept_sessions(self) -> int:
        """How many trajectories' caches are kept between turns right now."""
        return len(self.loop.kept)

    # ---- public API -------------------------------------------------------------------------

    async def submit(self, request: GenRequest) -> GenResult:
        loop = asyncio.get_running_loop()
        stop_ids = self.stop_token_ids if request.stop_token_ids is None else request.stop_token_ids
        stops = self.stop_strings if request.stop_strings is None else tuple(request.stop_strings)
        if stops and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer")
        if not request.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")
        if request.images and self.loop.prefill.vision is None:
            raise ValueError(f"a request holds {len(request.images)} image(s) but this generator has no image "
                             "processor: LocalGenerator(pixels=...) takes the vision-language ToolManager")
        if request.images:  # here, not in the batch's prefill, where it would fail every row with it
            self.loop.prefill.vision.check(self.model, request.prompt_ids, request.images)
        row = Row(request, loop.create_future(), frozenset(int(t) for t in stop_ids), stops, time.perf_counter())
        self._pending.append(row)
        self.admission.arrived(row.t_submit)
        if self._arrival is not None:
            self._arrival.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run())
        return await row.future

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await generate_all(self, requests)

    def forget(self, session: str | None = None) -> None:
        """Drop the cache kept for `session` (None: for every session)."""
        self.loop.kept.forget(session)

    def free_cache(self) -> None:
        """Free the decode cache's buffers (kept between worker sessions so that a rollout does not
        reallocate and regrow them whenever its batch drains, e.g. while every trajectory waits for
        a tool) once no generation is running: call it when the memory is needed elsewhere, e.g.
        before a training step."""
        if self._worker is None or self._worker.done():
            self.loop.release()
        else:
            self._free_pending = True

    def reseed(self, seed: int) -> None:
        """Reseed the sampling RNG (the trainer does this per step for reproducible draws)."""
        self.rng.manual_seed(int(seed))

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.loop.release()

    # ---- worker -----------------------------------------------------------------------------

    async def _run(self) -> None:
        aio = asyncio.get_running_loop()
        model = self.model
        was_training = bool(getattr(model, "training", False))
        if was_training:
            model.eval()
        new: list[Row] = []
        try:
            while self._pending or self.loop.live:
                # One turn of the event loop before each step: what is ready runs first (the
                # trajectories of rows just handed back, tool results just read), so a trajectory
                # that submits its next turn at once joins this step rather than the one after,
                # and that Python runs now instead of contending with the step for the GIL.
                await asyncio.sleep(0)
                await self._hold_for_arrivals()
                new, self._pending = self._admit()
                done = await aio.run_in_executor(self._executor, self._step, new)
                self.admission.stepped(self.loop.decode_s)
                new = []
                for row in done:
                    if not row.future.done():
                        row.future.set_result(self._result(row))
        except BaseException as e:  # fail every waiting request rather than leave it hanging
            rows = new + self._pending + self.loop.live_rows()
            self._pending = []
            for row in rows:
                if not row.future.done():
                    row.future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if not isinstance(e, Exception):
                raise
        finally:
            self.loop.reset()
            if self._free_pending:
                self.loop.release()
                self._free_pending = False
            if was_training:
                model.train()

    async def _hold_for_arrivals(self) -> None:
        """The bounded admission wait (admission.py): when the batch is small and turns keep
        arriving, wait until the batch has doubled or the bound has passed, whichever is first."""
        batch = self.loop.live + len(self._pending)
        # Trajectories between turns: their caches are kept; a waiting row's session is still there.
        away = len(self.loop.kept) - sum(r.req.session is not None for r in self._pending)
        t0 = time.perf_counter()
        wait = self.admission.wait_s(t0, batch, away)
        if wait <= 0:
            return
        self._arrival = asyncio.Event()
        try:
            while self.loop.live + len(self._pending) < 2 * batch:
                left = t0 + wait - time.perf_counter()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(self._arrival.wait(), left)
                except TimeoutError:
                    break
                self._arrival.clear()
        finally:
            self._arrival = None
        self.loop.stats["admission_waits"] += 1
        self.loop.stats["admission_wait_s"] += time.perf_counter() - t0

    def _admit(self) -> tuple[list[Row], list[Row]]:
        """(rows that join the batch now, rows that keep waiting): the waiting rows of the lowest
        priority among those waiting and generating, in arrival order, as many as there is room."""
        if not self._pending:
            return [], []
        first = min(r.req.priority for r in self._pending + self.loop.live_rows())
        room = self.max_batch - self.loop.live
        now = [r for r in self._pending if r.req.priority == first][:room]
        joined = set(map(id, now))
        return now, [r for r in self._pending if id(r) not in joined]

    def _step(self, new: list[Row]) -> list[Row]:
        threads = self.threads or self._process_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)  # this thread's own count (OpenMP's is per thread)
        done = self.loop.step(new)
        if not self.loop.live:
            release_pool()  # the batch drained: don't throttle whoever computes next (openmp.py)
        return done

    def _result(self, row: Row) -> GenResult:
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=False) if self.tokenizer is not None else ""
        return GenResult(
            token_ids=row.tokens,
            logprobs=row.logprobs,
            finish_reason="stop" if row.finish == "stop" else "length",
            text=text,
            stop_token=row.stop_token,
            queue_s=row.t_start - row.t_submit,
            gen_s=time.perf_counter() - row.t_start,
        )
