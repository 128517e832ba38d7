"""The retriever server as it was before issue 33's latency work (at a081f0e), kept as the same-run
baseline of benchmarks/retrieval_scale.py: each request handed to Starlette's thread pool of its
own, and BM25 search that scores every posting of the query's terms (a full pass over all docs
when they are long) instead of MaxScore pruning. Same index folder, same answers. It runs under
the same uvicorn settings as the server (keep-alive included: at uvicorn's default 5 s, as at
a081f0e, a benchmark's httpx client met connections reset under it), so the two differ only in
the work this baseline stands for.

    python benchmarks/retriever_before.py --index idx/ --port 8000
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rlfactory.envs.search.bm25 import BM25Index, tokenize
from rlfactory.envs.search.retriever import KEEP_ALIVE_S


class UnprunedBM25:
    """BM25Index.search as it was: the union of the postings (short ones) or one pass over all docs."""

    def __init__(self, index: BM25Index) -> None:
        self.index, self.n_docs = index, index.n_docs

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        index = self.index
        k = max(0, min(k, index.n_docs))
        ids = sorted({index._vocab[t] for t in tokenize(query) if t in index._vocab})
        if k == 0 or not ids:
            return [(i, 0.0) for i in range(k)]
        indptr = index._csc()[0]
        spans = [(int(indptr[t]), int(indptr[t + 1])) for t in ids]
        if sum(b - a for a, b in spans) * 8 >= index.n_docs:
            return index._full(spans, k)
        return index._union(spans, k)


def build_app_before(docs: Sequence[dict[str, Any]], default_topk: int, index: Any) -> Starlette:
    """rlfactory.envs.search.retriever.build_app at a081f0e (a thread-pool hand-off per request)."""

    def answer(queries: list[str], topk: int, with_scores: bool) -> list[list[dict[str, Any]]]:
        result = []
        for q in queries:
            hits = index.search(q, topk)
            if with_scores:
                result.append([{"document": docs[i], "score": s} for i, s in hits])
            else:
                result.append([docs[i] for i, _ in hits])
        return result

    async def retrieve(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        queries = body.get("queries") if isinstance(body, dict) else None
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return JSONResponse({"error": "`queries` must be a list of strings"}, status_code=422)
        topk = body.get("topk") or default_topk
        if not isinstance(topk, int) or topk < 1:
            return JSONResponse({"error": "`topk` must be a positive integer"}, status_code=422)
        with_scores = bool(body.get("return_scores", False))
        return JSONResponse({"result": await run_in_threadpool(answer, queries, topk, with_scores)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "docs": len(docs)})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])])


def main() -> None:
    import uvicorn

    from rlfactory.envs.search.index_build import load_index

    ap = argparse.ArgumentParser()
    ap.add_argument("--index", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    _, index, docs = load_index(a.index)
    uvicorn.run(build_app_before(docs, 3, UnprunedBM25(index)), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False, timeout_keep_alive=KEEP_ALIVE_S)


if __name__ == "__main__":
    main()
