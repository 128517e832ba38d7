"""Dense retrieval at scale: FAISS flat (exact) against HNSW and IVF on the same passage vectors,
as ratios against flat, on the generated corpus of benchmarks/retrieval_scale.py.

    .venv/bin/python benchmarks/dense_scale.py [--n 100000] [--work DIR]

The encoder is a folder rlfactory makes (BERT's architecture, random weights, tiny:1m's
tokenizer; no download): its vectors carry no meaning, so recall is measured against flat's own
top 3 (what the approximate indexes give up), not against relevance. The passages are encoded
once (timed on its own); each FAISS index is then built from the same vectors. Per index: build
time, size, top-3 search latency in process (FAISS alone, and with the query's encoding, which
is what a request pays), and recall@3 against flat. HNSW: M = 32, efSearch 64; IVF: nlist =
4 sqrt(N), nprobe = nlist / 8 (rlfactory.envs.search.dense's defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from retrieval_scale import make_corpus  # noqa: E402


def make_encoder(folder: Path) -> None:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rlfactory.tiny import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512)).save_pretrained(folder)
    tok.save_pretrained(folder)


def main() -> int:
    import faiss
    import torch

    from rlfactory.envs.search.bm25 import load_corpus
    from rlfactory.envs.search.dense import DenseIndex, Encoder

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--work", default=None)
    ap.add_argument("--reuse", action="store_true", help="the FAISS indexes and build figures of an earlier run in --work")
    a = ap.parse_args()
    # one intra-op thread: on 2 shared cores torch's thread-pool barriers stall (224 ms to encode one
    # query with 2 threads at load 10, in a trial run)
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)  # the same for FAISS's OpenMP: flat took 45 ms a query with 2 threads at load 10
    work = Path(a.work or tempfile.mkdtemp(prefix="rlf-dense-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; CPUs: {os.cpu_count()}; torch threads {torch.get_num_threads()}",
          flush=True)
    corpus = work / f"corpus_{a.n}.jsonl"
    queries = make_corpus(corpus, a.n)[:a.queries]
    if not a.reuse:
        make_encoder(work / "encoder")
    enc = Encoder(work / "encoder", max_length=32)  # the FAISS side is measured; 32 tokens keep encoding 100k passages to minutes
    saved = json.loads((work / "dense_scale.json").read_text()) if a.reuse else {}
    if a.reuse:
        vectors, encode_s, dim = None, saved["encode_s"], saved["dim"]
    else:
        texts = [d["contents"] for d in load_corpus(corpus)]
        t = time.perf_counter()
        vectors = np.ascontiguousarray(np.concatenate(
            [enc.encode(["passage: " + x for x in texts[i:i + 4096]], 64) for i in range(0, len(texts), 4096)]),
            dtype=np.float32)
        encode_s = time.perf_counter() - t
        dim = vectors.shape[1]
    print(f"\n== {a.n} passages, dim {dim}: encoded in {encode_s:.1f} s ({encode_s / a.n * 1000:.2f} ms a passage, "
          f"max_length 32), load average {os.getloadavg()[0]:.1f}"
          + (" (indexes reused: encoding and build figures from the earlier run)" if a.reuse else ""), flush=True)
    qvec = np.concatenate([enc.encode(["query: " + q]) for q in queries])
    rows = {}
    for kind in ("flat", "hnsw", "ivf"):
        t = time.perf_counter()
        nlist = None
        path = work / f"{kind}.index"
        if a.reuse:
            index, build_s = faiss.read_index(str(path)), saved[kind]["build_s"]
            nlist = int(faiss.extract_index_ivf(index).nlist) if kind == "ivf" else None
        elif kind == "flat":
            index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        else:
            nlist = max(1, int(4 * np.sqrt(a.n)))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
        if not a.reuse:
            index.add(vectors)
            build_s = time.perf_counter() - t
            faiss.write_index(index, str(path))
        if kind == "hnsw":
            index.hnsw.efSearch = 64
        elif kind == "ivf":
            index.nprobe = max(1, nlist // 8)
        searcher = DenseIndex(enc, index, kind, nlist, "query: ", "passage: ")
        t = time.perf_counter()
        top = [index.search(qvec[i:i + 1], 3)[1][0] for i in range(len(queries))]
        faiss_ms = (time.perf_counter() - t) / len(queries) * 1000
        t = time.perf_counter()
        for q in queries:
            searcher.search(q, 3)
        full_ms = (time.perf_counter() - t) / len(queries) * 1000
        rows[kind] = {"build_s": build_s, "mb": path.stat().st_size / 2**20, "faiss_ms": faiss_ms, "full_ms": full_ms,
                      "top": top}
    flat = rows["flat"]
    for kind, r in rows.items():
        recall = np.mean([len(set(a_.tolist()) & set(b.tolist())) / 3 for a_, b in zip(r["top"], flat["top"])])
        print(f"{kind}: build {r['build_s']:.2f} s, {r['mb']:.0f} MB; top-3 in process: FAISS {r['faiss_ms']:.3f} ms, "
              f"with the query's encoding {r['full_ms']:.2f} ms; recall@3 vs flat {recall:.3f}"
              + ("" if kind == "flat" else f"; ratios vs flat: build {r['build_s'] / flat['build_s']:.2f}x, size "
                 f"{r['mb'] / flat['mb']:.2f}x, FAISS search {r['faiss_ms'] / flat['faiss_ms']:.3f}x, with encoding "
                 f"{r['full_ms'] / flat['full_ms']:.3f}x"), flush=True)
    print(f"load average at end: {os.getloadavg()}")
    if not a.reuse:
        (work / "dense_scale.json").write_text(json.dumps({"encode_s": encode_s, "dim": dim, **{
            k: {x: y for x, y in r.items() if x != "top"} for k, r in rows.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
