"""A retrieval server with Search-R1's HTTP API, BM25 over a JSON-lines corpus.

    python -m rlfactory.envs.search.retriever --corpus corpus.jsonl --port 8000

`POST /retrieve` with `{"queries": [...], "topk": 3, "return_scores": true}` answers
`{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}` (one list per query);
with `return_scores: false` each list holds the documents themselves, as in Search-R1's
retrieval_server.py. `GET /health` answers `{"status": "ok", "docs": N}` once the index is built.
The index is built in memory at start-up (fine up to about a million short passages); for
Wikipedia-scale corpora run Search-R1's own server and give the env its URL (`retriever_url`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rlfactory.envs.search.bm25 import BM25Index, load_corpus
from rlfactory.server_process import exit_with_parent


def build_app(docs: list[dict[str, Any]], default_topk: int = 3, index: BM25Index | None = None) -> Starlette:
    index = index or BM25Index([d["contents"] for d in docs])

    async def retrieve(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except Exception:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        queries = body.get("queries") if isinstance(body, dict) else None
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return JSONResponse({"error": "`queries` must be a list of strings"}, status_code=422)
        topk = body.get("topk") or default_topk
        if not isinstance(topk, int) or topk < 1:
            return JSONResponse({"error": "`topk` must be a positive integer"}, status_code=422)
        with_scores = bool(body.get("return_scores", False))
        result = []
        for q in queries:
            hits = index.search(q, topk)
            if with_scores:
                result.append([{"document": docs[i], "score": s} for i, s in hits])
            else:
                result.append([docs[i] for i, _ in hits])
        return JSONResponse({"result": result})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "docs": len(docs)})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])])



def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description="BM25 retrieval server with Search-R1's /retrieve API")
    ap.add_argument("--corpus", required=True, help="JSON lines, one {id, contents} per line")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    ap.add_argument("--exit-with-parent", type=int, default=None, metavar="PID", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.exit_with_parent:
        exit_with_parent(a.exit_with_parent)
    docs = load_corpus(a.corpus)
    app = build_app(docs, a.topk)
    print(f"retriever: {len(docs)} docs, http://{a.host}:{a.port}/retrieve", file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
