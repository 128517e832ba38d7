"""The MCP `search` tool: asks a Search-R1-style retriever, answers Search-R1's passage text.

    python -m rlfactory.envs.search.mcp_server --url http://127.0.0.1:8000 [--topk 3]
    python -m rlfactory.envs.search.mcp_server --corpus corpus.jsonl [--topk 3]

Runs over stdio. With `--corpus` it searches a JSON-lines corpus itself (BM25, in the server's
process; a relative path is taken from the MCP config's folder). With `--url` calls post
`{"queries": [...], "topk": k, "return_scores": true}` to `URL/retrieve`, the calls made while a
request is in flight together in the next one (`RetrieveClient`). Either way the
documents are formatted like Search-R1's `_passages2string`:
`Doc 1(Title: Kalo Mire) Kalo Mire was born in ...` one line per document.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Annotated, Any

import httpx
from pydantic import Field

from rlfactory.envs.search.prompts import format_results


def retrieve_payload(queries: list[str], topk: int) -> dict[str, Any]:
    return {"queries": queries, "topk": topk, "return_scores": True}


_sync_clients: dict[float, httpx.Client] = {}


def search_sync(url: str, query: str, topk: int = 3, timeout_s: float = 30.0) -> str:
    """The same text as the MCP tool, without MCP (used by solvers that write demonstrations).
    One client per process keeps the connection open: a fresh client per call costs ~30 ms."""
    client = _sync_clients.get(timeout_s)
    if client is None:
        client = _sync_clients[timeout_s] = httpx.Client(timeout=timeout_s)
    r = client.post(url.rstrip("/") + "/retrieve", json=retrieve_payload([query], topk))
    r.raise_for_status()
    return format_results(r.json()["result"][0])


def build_corpus_server(corpus: str, topk: int = 3):
    """The same `search` tool over a JSON-lines corpus searched in this process (BM25)."""
    from mcp.server.mcpserver import MCPServer

    from rlfactory.envs.search.bm25 import BM25Corpus

    index = BM25Corpus.from_jsonl(corpus)
    server = MCPServer("search", log_level="WARNING")

    @server.tool(description="Search the knowledge corpus and return the top passages.", structured_output=False)
    async def search(query: Annotated[str, Field(description="What to look up, e.g. a name from the question.")]) -> str:
        return index.search_text(query, topk)

    return server


class RetrieveClient:
    """Search calls to a Search-R1 `/retrieve` server, the calls made while a request is in flight
    sent together as the next request (`/retrieve` takes a list of queries). A rollout's trajectories
    search at once: 64 concurrent calls cost a few HTTP requests instead of 64, each of which cost
    the server and this client more CPU than the search itself (and httpx's connection pool, per
    request, time that grows with the requests in flight). Up to `max_batch` queries a request; once
    a full batch waits, up to `max_in_flight` requests at once. Answers are those of one-query requests.
    A batch answered with an error status is retried query by query, so an error answers its own
    call only."""

    def __init__(self, url: str, topk: int = 3, timeout_s: float = 30.0, max_batch: int = 64,
                 max_in_flight: int = 4) -> None:
        self.endpoint, self.topk = url.rstrip("/") + "/retrieve", topk
        self.max_batch, self.max_in_flight = max_batch, max_in_flight
        self.client = httpx.AsyncClient(timeout=timeout_s)
        self._pending: list[tuple[str, asyncio.Future[list[dict[str, Any]]]]] = []
        self._senders: set[asyncio.Task[None]] = set()  # held: the loop keeps only a weak reference
        self.requests = 0  # HTTP requests sent so far (for tests and benchmarks)

    async def search(self, query: str) -> list[dict[str, Any]]:
        """The top `topk` hits of `query`, as `/retrieve` gives them (`{"document", "score"}` each)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[dict[str, Any]]] = loop.create_future()
        self._pending.append((query, future))
        # one request in flight, more (up to max_in_flight) once a full batch waits: many calls
        # are not held to one batch a round trip
        if not self._senders or (len(self._pending) >= self.max_batch and len(self._senders) < self.max_in_flight):
            sender = loop.create_task(self._send())  # runs after this loop pass: the pass's calls join
            self._senders.add(sender)
        return await future

    async def _post(self, queries: list[str]) -> list[list[dict[str, Any]]]:
        self.requests += 1
        r = await self.client.post(self.endpoint, json=retrieve_payload(queries, self.topk))
        r.raise_for_status()
        result = r.json()["result"]
        if len(result) != len(queries):
            raise ValueError(f"the retriever answered {len(result)} lists for {len(queries)} queries")
        return result

    async def _send(self) -> None:
        try:
            await self._send_pending()
        finally:
            # Leave the set in the same loop step as the last look at _pending: a done-callback ran
            # a step later, and a call made in between (the answered callers resume first) saw a
            # sender that had already stopped, started none, and waited for the next call's sender,
            # or for its tool timeout when no other call came (all of a rollout step's searches
            # waited 30 s at once).
            self._senders.discard(asyncio.current_task())

    async def _send_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            results: list[Any]
            try:
                results = await self._post([q for q, _ in batch])
            except httpx.HTTPStatusError as e:
                if len(batch) == 1:
                    results = [e]
                else:  # one query's error fails the request: each query alone answers its own call
                    answers = await asyncio.gather(*(self._post([q]) for q, _ in batch), return_exceptions=True)
                    results = [a if isinstance(a, Exception) else a[0] for a in answers]
            except (httpx.HTTPError, ValueError, KeyError) as e:  # every call of the batch hears it
                results = [e] * len(batch)
            for (_, future), result in zip(batch, results):
                if future.done():  # its call was cancelled (a tool timeout)
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def aclose(self) -> None:
        await self.client.aclose()


def build_server(url: str, topk: int = 3, timeout_s: float = 30.0):
    from mcp.server.mcpserver import MCPServer

    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request on stderr
    server = MCPServer("search", log_level="WARNING")
    # One client for the server's lifetime (connection reuse across calls; concurrent calls batched).
    client = RetrieveClient(url, topk, timeout_s)

    @server.tool(description="Search the knowledge corpus and return the top passages.", structured_output=False)
    async def search(query: Annotated[str, Field(description="What to look up, e.g. a name from the question.")]) -> str:
        return format_results(await client.search(query))

    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="MCP search tool over a Search-R1-style retriever")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="retriever base URL, e.g. http://127.0.0.1:8000")
    where.add_argument("--corpus", help="a JSON-lines corpus ({id, contents} per line) to search in this process")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    from rlfactory.tools.servers._serve import serve

    server = build_corpus_server(a.corpus, a.topk) if a.corpus else build_server(a.url, a.topk, a.timeout)
    serve(server, [])  # stdio, with rlfactory's lighter pipe loop
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
