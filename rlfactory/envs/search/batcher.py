"""Micro-batching for a server whose work runs in a thread: requests that arrive while a batch is
running wait and go together as the next batch, so one hand-off to the worker thread serves many
requests.

Why: the retriever's search takes well under a millisecond, and handing each request to a thread
pool of its own cost more than the search under load (a lock release and a GIL switch per
request, threads contending on 2 cores). One worker thread and one hand-off per batch remove
that, and a lone request still waits for one hand-off only. Each item is run on its own: an
error answers its own request and no other.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """`await batcher.submit(item)` -> `fn(item)`, run in one worker thread, items that arrive
    meanwhile batched together (at most `max_batch` a hand-off), answered in order per request.
    `thread=False` runs the batches on the event loop itself (for work too short to hand off)."""

    def __init__(self, fn: Callable[[T], R], max_batch: int = 256, name: str = "batch", thread: bool = True) -> None:
        self.fn, self.max_batch = fn, max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name) if thread else None
        self.batches = self.submitted = 0  # hand-offs and requests so far (for tests and logs)

    @property
    def waiting(self) -> int:
        """Requests waiting for the next batch."""
        return len(self._pending)

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        self.submitted += 1
        if not self._running:
            self._running = True
            # runs after this loop pass, so the pass's other requests join it; held, as the loop
            # keeps only a weak reference to a task
            self._task = loop.create_task(self._drain())
        return await future

    def _run_each(self, items: list[T]) -> list[R | Exception]:
        out: list[R | Exception] = []
        for item in items:
            try:
                out.append(self.fn(item))
            except Exception as e:  # noqa: BLE001 -- this request's error, answered to it alone
                out.append(e)
        return out

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
                self.batches += 1
                try:
                    if self._executor is None:
                        results = self._run_each([item for item, _ in batch])
                        await asyncio.sleep(0)  # let the requests that came meanwhile be read
                    else:
                        results = await loop.run_in_executor(self._executor, self._run_each, [item for item, _ in batch])
                except BaseException as e:  # the executor itself failed (shut down): every waiter hears it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
                    raise
                for (_, future), result in zip(batch, results):
                    if future.done():  # its request was cancelled (the client went away)
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._running = False
            if self._pending:  # left by a failure above: never strand a waiter
                err = RuntimeError("the batch worker stopped")
                for _, future in self._pending:
                    if not future.done():
                        future.set_exception(err)
                self._pending = []

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def log_error(where: str, e: BaseException) -> None:
    """One line on stderr for an error answered to a client (the server keeps serving)."""
    print(f"{where}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
