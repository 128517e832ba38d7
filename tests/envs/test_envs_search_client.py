"""The search tool's retriever client: concurrent calls go as one `/retrieve` request of many
queries (Search-R1's API takes a list), with the answers of one-query requests."""

from __future__ import annotations

import asyncio
import json

import httpx
from rlfactory.envs.search.bm25 import BM25Index
from rlfactory.envs.search.mcp_server import RetrieveClient
from rlfactory.envs.search.retriever import build_app
from rlfactory.envs.search.service import RetrieverProcess
from rlfactory.envs.search.world import make_world


def test_concurrent_calls_share_requests_and_get_the_one_query_answers(tmp_path):
    world = make_world(0, 20, 6)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(p) for p in world.passages) + "\n")
    queries = [q.text for split in ("train", "test") for q in world.questions[split]][:40] + ["zzz unknown"]
    with RetrieverProcess(corpus) as server:
        alone = [httpx.post(server.url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}).json()
                 ["result"][0] for q in queries]

        async def go() -> tuple[list, int]:
            client = RetrieveClient(server.url, topk=3)
            try:
                first = await client.search(queries[0])  # a lone call: one request of its own
                assert client.requests == 1 and first == alone[0]
                got = await asyncio.gather(*(client.search(q) for q in queries))
                return got, client.requests - 1
            finally:
                await client.aclose()

        async def small_batches() -> tuple[list, int]:
            client = RetrieveClient(server.url, topk=3, max_batch=8)
            try:
                return await asyncio.gather(*(client.search(q) for q in queries)), client.requests
            finally:
                await client.aclose()

        got, requests = asyncio.run(go())
        got8, requests8 = asyncio.run(small_batches())
    assert got == alone and got8 == alone  # same documents, same scores, in the order of the calls
    assert requests == 1  # 41 calls made together: one request
    assert requests8 == 6  # 8 queries a request at most: 4 requests at once, then 2 more


class _FailsOn:
    """The corpus's BM25, raising on one query (as a search error would)."""

    def __init__(self, texts: list[str], bad: str) -> None:
        self.index, self.bad = BM25Index(texts), bad

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        if query == self.bad:
            raise RuntimeError("boom")
        return self.index.search(query, k)


def test_an_error_answers_its_own_call_only():
    docs = make_world(0, 20, 6).passages
    app = build_app(docs, 3, _FailsOn([d["contents"] for d in docs], "bad query"))

    async def go() -> tuple[list, int]:
        client = RetrieveClient("http://retriever", topk=3)
        client.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=30)
        try:
            got = await asyncio.gather(*(client.search(q) for q in ["Bubas", "bad query", "Zuku Veze"]),
                                       return_exceptions=True)
            return got, client.requests
        finally:
            await client.aclose()
            app.state.batcher.close()

    (bubas, bad, zuku), requests = asyncio.run(go())
    assert isinstance(bad, httpx.HTTPStatusError) and bad.response.status_code == 500
    assert "RuntimeError: boom" in bad.response.json()["error"]
    index = BM25Index([d["contents"] for d in docs])
    for hits, query in ((bubas, "Bubas"), (zuku, "Zuku Veze")):
        want = index.search(query, 3)
        assert [h["document"]["contents"] for h in hits] == [docs[i]["contents"] for i, _ in want]
        assert [h["score"] for h in hits] == [s for _, s in want]
    assert requests == 4  # the batch's 500, then each query alone


def test_a_call_made_as_the_last_sender_stops_is_sent():
    """The caller answered by a sender's last batch resumes before that sender's task is done with:
    a call it makes at once must start a sender of its own (it used to wait for the next call, or
    for its tool timeout)."""

    async def go() -> list:
        client = RetrieveClient("http://retriever", topk=1)

        async def post(queries):  # the retriever, answering at once
            client.requests += 1
            await asyncio.sleep(0)
            return [[{"document": {"contents": q}, "score": 1.0}] for q in queries]

        client._post = post
        try:
            first = await client.search("a")
            async with asyncio.timeout(5):  # awaited directly: the call is made in this very step
                second = await client.search("b")
            return [first, second, client.requests]
        finally:
            await client.aclose()

    first, second, requests = asyncio.run(go())
    assert first[0]["document"]["contents"] == "a" and second[0]["document"]["contents"] == "b"
    assert requests == 2
