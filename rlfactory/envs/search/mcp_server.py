"""The MCP `search` tool: asks a Search-R1-style retriever, answers Search-R1's passage text.

    python -m rlfactory.envs.search.mcp_server --url http://127.0.0.1:8000 [--topk 3]
    python -m rlfactory.envs.search.mcp_server --corpus corpus.jsonl [--topk 3]

Runs over stdio. With `--corpus` it searches a JSON-lines corpus itself (BM25, in the server's
process; a relative path is taken from the MCP config's folder). With `--url` each call posts
`{"queries": [query], "topk": k, "return_scores": true}` to `URL/retrieve`. Either way the
documents are formatted like Search-R1's `_passages2string`:
`Doc 1(Title: Kalo Mire) Kalo Mire was born in ...` one line per document.
"""

from __future__ import annotations

import argparse
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


def build_server(url: str, topk: int = 3, timeout_s: float = 30.0):
    from mcp.server.mcpserver import MCPServer

    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request on stderr
    server = MCPServer("search", log_level="WARNING")
    endpoint = url.rstrip("/") + "/retrieve"
    # One client for the server's lifetime (connection reuse across calls).
    client = httpx.AsyncClient(timeout=timeout_s)

    @server.tool(description="Search the knowledge corpus and return the top passages.", structured_output=False)
    async def search(query: Annotated[str, Field(description="What to look up, e.g. a name from the question.")]) -> str:
        r = await client.post(endpoint, json=retrieve_payload([query], topk))
        r.raise_for_status()
        return format_results(r.json()["result"][0])

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
