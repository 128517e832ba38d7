"""`rlfactory index CORPUS --out DIR`: build a BM25 or dense search index of a JSON-lines corpus
(rlfactory/envs/search/index_build.py), for `python -m rlfactory.envs.search.retriever --index DIR`."""

from __future__ import annotations

import argparse
import sys


def _index(args: argparse.Namespace) -> int:
    from rlfactory.envs.search.index_build import build_index

    try:
        info = build_index(args.corpus, args.out, args.kind, k1=args.k1, b=args.b, encoder=args.encoder,
                           faiss_index=args.faiss, nlist=args.nlist, batch_size=args.batch_size,
                           progress=not args.no_progress)
    except (ValueError, ImportError) as e:
        print(f"rlfactory index: {e}", file=sys.stderr)
        return 2
    print(f"indexed {info.n_docs} docs ({info.kind}) in {info.build_s:.1f} s -> {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build a search index (BM25 or dense) of a JSON-lines corpus")
    p.add_argument("corpus", help="JSON lines, one {id, contents} per line (Search-R1's corpus layout)")
    p.add_argument("--out", required=True, help="the index folder to write")
    p.add_argument("--kind", choices=["bm25", "dense"], default="bm25")
    p.add_argument("--k1", type=float, default=0.9, help="bm25: k1")
    p.add_argument("--b", type=float, default=0.4, help="bm25: b")
    p.add_argument("--encoder", help="dense: a Hugging Face encoder folder (e5, bge, ...)")
    p.add_argument("--faiss", choices=["flat", "hnsw", "ivf"], default="flat", help="dense: the FAISS index")
    p.add_argument("--nlist", type=int, help="dense, ivf: inverted lists (default 4 sqrt(n))")
    p.add_argument("--batch-size", type=int, default=64, help="dense: passages per encoder batch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_index)
