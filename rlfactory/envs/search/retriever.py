"""A retrieval server with Search-R1's HTTP API: BM25 over a JSON-lines corpus, or an index built by
`rlfactory index` (BM25 memory-mapped, or dense: an encoder + FAISS).

    python -m rlfactory.envs.search.retriever --corpus corpus.jsonl --port 8000
    python -m rlfactory.envs.search.retriever --index idx/ --port 8000

`POST /retrieve` with `{"queries": [...], "topk": 3, "return_scores": true}` answers
`{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}` (one list per query);
with `return_scores: false` each list holds the documents themselves, as in Search-R1's
retrieval_server.py. `GET /health` answers `{"status": "ok", "docs": N}` once the index is built.
With `--corpus` the BM25 index is built in memory at start-up; with `--index` nothing is built:
the saved index is mapped from disk and documents are read from the corpus by offset.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rlfactory.envs.search.batcher import MicroBatcher, log_error
from rlfactory.envs.search.bm25 import BM25Index, load_corpus
from rlfactory.envs.search.corpus_store import Documents, InMemoryDocs, dumps
from rlfactory.server_process import exit_with_parent

# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals httpx's
# keep-alive expiry, so a client could reuse a connection the moment the server closed it: its
# request then met a reset (httpx.ReadError), often when the server's loop was late (a busy CPU)
# and ran the close before reading the request that had already arrived. Longer than the clients'
# expiry (httpx 5 s, aiohttp 15 s), the client always lets go first.
KEEP_ALIVE_S = 75


def build_app(docs: Sequence[dict[str, Any]] | Documents, default_topk: int = 3, index: Any = None) -> Starlette:
    """`docs`: the documents by position (a list, or a CorpusStore); `index`: anything with
    `search(query, k) -> [(position, score)]` (default: BM25 over `docs`).

    Requests are answered in one worker thread, those that arrive together as one batch
    (rlfactory.envs.search.batcher: a thread hand-off per request cost more than the search);
    the JSON answer is written there too, each document's JSON spliced in as `docs.json_bytes`
    gives it (a corpus line as it is). An error in one request answers that request with 500
    and its cause; the others in its batch are answered as usual."""
    index = index or BM25Index([d["contents"] for d in docs])
    store: Documents = docs if isinstance(docs, Documents) else InMemoryDocs(docs)

    def answer(request: tuple[list[str], int, bool]) -> bytes:
        queries, topk, with_scores = request
        lists = []
        for q in queries:
            hits = index.search(q, topk)
            if with_scores:
                items = [b'{"document":%s,"score":%s}' % (store.json_bytes(i), _score(s)) for i, s in hits]
            else:
                items = [store.json_bytes(i) for i, _ in hits]
            lists.append(b"[" + b",".join(items) + b"]")
        return b'{"result":[' + b",".join(lists) + b"]}"

    batcher: MicroBatcher[tuple[list[str], int, bool], bytes] = MicroBatcher(answer, name="retrieve")

    async def retrieve(request: Request) -> Response:
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
        try:
            content = await batcher.submit((queries, topk, bool(body.get("return_scores", False))))
        except Exception as e:  # noqa: BLE001 -- answered to this request, logged; the server goes on
            log_error("retriever: /retrieve", e)
            return JSONResponse({"error": f"retrieval failed: {type(e).__name__}: {e}"}, status_code=500)
        return Response(content, media_type="application/json")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "docs": len(docs)})

    app = Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])])
    app.state.batcher = batcher
    return app


def _score(s: float) -> bytes:
    """A score as JSON, as json.dumps writes it (a float's repr; NaN and infinity are refused)."""
    if type(s) is float and math.isfinite(s):
        return float.__repr__(s).encode()
    return dumps(s)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description="BM25 retrieval server with Search-R1's /retrieve API")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="JSON lines, one {id, contents} per line (BM25 built at start-up)")
    source.add_argument("--index", help="a folder built by `rlfactory index` (loaded, memory-mapped)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    ap.add_argument("--keep-alive", type=float, default=KEEP_ALIVE_S, metavar="S",
                    help="seconds an idle HTTP connection stays open (longer than clients keep theirs)")
    ap.add_argument("--exit-with-parent", type=int, default=None, metavar="PID", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.exit_with_parent:
        exit_with_parent(a.exit_with_parent)
    if a.index:
        from rlfactory.envs.search.index_build import load_index

        info, index, docs = load_index(a.index)
        app = build_app(docs, a.topk, index)
        print(f"retriever: {info.kind} index of {info.n_docs} docs ({info.corpus})", file=sys.stderr, flush=True)
    else:
        docs = load_corpus(a.corpus)
        app = build_app(docs, a.topk)
    print(f"retriever: {len(docs)} docs, http://{a.host}:{a.port}/retrieve", file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False, timeout_keep_alive=a.keep_alive)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
