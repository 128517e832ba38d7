"""The retriever's micro-batching: requests that arrive while a batch runs go together as the next
one; each request gets its own answer, in its own order; an error answers its own request only.
Checked on MicroBatcher and on the real retriever server (uvicorn, HTTP) over a BM25 index."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from rlfactory.envs.search.batcher import MicroBatcher
from rlfactory.envs.search.bm25 import BM25Index
from rlfactory.envs.search.retriever import build_app
from rlfactory.envs.search.world import make_world
from rlfactory.serve.thread import AppThread


@pytest.mark.parametrize("thread", [True, False])
def test_batcher_answers_each_item_its_own_result_and_error(thread):
    seen: list[list[int]] = []
    batch: list[int] = []

    def fn(item: int) -> list[int]:
        batch.append(item)
        if item == 7:
            raise ValueError("item 7 is bad")
        return [item, item * item]

    async def run() -> list:
        batcher = MicroBatcher(fn, max_batch=8, thread=thread)
        original = batcher._run_each

        def record(items):  # the batches as handed off
            seen.append(list(items))
            return original(items)

        batcher._run_each = record
        results = await asyncio.gather(*(batcher.submit(i) for i in range(20)), return_exceptions=True)
        batcher.close()
        return results

    results = asyncio.run(run())
    for i, r in enumerate(results):
        if i == 7:
            assert isinstance(r, ValueError) and str(r) == "item 7 is bad"
        else:
            assert r == [i, i * i]
    # submitted in one loop pass: batches of at most 8, in arrival order, each item once
    assert [len(b) for b in seen] == [8, 8, 4] and sum(seen, []) == list(range(20)) == batch


class _GatedIndex:
    """BM25 search whose first query waits for the test's go (so that the others queue up behind
    it) and whose query "boom" fails."""

    def __init__(self, texts: list[str]) -> None:
        self.bm25, self.go, self.first = BM25Index(texts), threading.Event(), True

    def search(self, query: str, k: int):
        if self.first:
            self.first = False
            assert self.go.wait(60)
        if query == "boom":
            raise RuntimeError("the index broke on this query")
        return self.bm25.search(query, k)


def test_retriever_batches_concurrent_requests_and_answers_each_its_own():
    world = make_world(0, 20, 6)
    docs = [{"id": f"p{i}", "contents": p["contents"]} for i, p in enumerate(world.passages)]
    index = _GatedIndex([d["contents"] for d in docs])
    app = build_app(docs, 3, index)
    batcher = app.state.batcher
    questions = [q.text for split in ("train", "test") for q in world.questions[split]][:30]
    bodies = [{"queries": [questions[0]], "topk": 2}]  # the gated first request
    bodies += [{"queries": [q, questions[(i + 5) % len(questions)]], "topk": 1 + i % 3, "return_scores": True}
               for i, q in enumerate(questions[1:])]
    bodies.insert(10, {"queries": ["boom"], "topk": 3})

    async def send(url: str) -> list[httpx.Response]:
        async def until(done, what: str) -> None:
            deadline = time.monotonic() + 60
            while not done():
                assert time.monotonic() < deadline, what
                await asyncio.sleep(0.01)

        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.create_task(client.post(url + "/retrieve", json=bodies[0]))]
            await until(lambda: batcher.batches == 1, "the first request's batch did not start")
            tasks += [asyncio.create_task(client.post(url + "/retrieve", json=b)) for b in bodies[1:]]
            await until(lambda: batcher.waiting == len(bodies) - 1, f"{batcher.waiting} requests wait")
            index.go.set()
            return list(await asyncio.gather(*tasks))

    with AppThread(app) as srv:
        answers = asyncio.run(send(srv.url))
    assert batcher.batches == 2  # the gated request, then every request that came meanwhile in one batch
    for body, r in zip(bodies, answers):
        if body["queries"] == ["boom"]:
            assert r.status_code == 500
            assert r.json() == {"error": "retrieval failed: RuntimeError: the index broke on this query"}
            continue
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        assert len(result) == len(body["queries"])
        for query, got in zip(body["queries"], result):
            want = index.bm25.search(query, body["topk"])
            if body.get("return_scores"):
                assert [(h["document"]["id"], h["score"]) for h in got] == [(f"p{i}", s) for i, s in want]
            else:
                assert [h["id"] for h in got] == [f"p{i}" for i, _ in want]
