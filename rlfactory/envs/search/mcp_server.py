"""The MCP `search` tool: asks a Search-R1-style retriever, answers Search-R1's passage text.

    python -m rlfactory.envs.search.mcp_server --url http://127.0.0.1:8000 [--topk 3]

Runs over stdio. Each call posts `{"queries": [query], "topk": k, "return_scores": true}` to
`URL/retrieve` and formats the documents like Search-R1's `_passages2string`:
`Doc 1(Title: Kalo Mire) Kalo Mire was born in ...` one line per document.
"""

from __future__ import annotations

import argparse
import logging
from typing import Annotated, Any

import httpx
from pydantic import Field


def format_results(docs: list[dict[str, Any]]) -> str:
    """Search-R1's `_passages2string`: the first line of `contents` is the title, the rest the text.
    `docs` are either `{"document": {...}, "score": s}` items or the documents themselves."""
    out = []
    for i, item in enumerate(docs):
        doc = item.get("document", item)
        title, _, text = doc.get("contents", "").partition("\n")
        out.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(out)


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
    ap.add_argument("--url", required=True, help="retriever base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    from rlfactory.tools.servers._serve import serve

    serve(build_server(a.url, a.topk, a.timeout), [])  # stdio, with rlfactory's lighter pipe loop
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
