"""`rlfactory index`: build a search index of a JSON-lines corpus (Search-R1's layout, one
`{"id", "contents"}` a line) into a folder that the retriever server loads.

    rlfactory index corpus.jsonl --out idx/                                  # BM25 (bm25s)
    rlfactory index corpus.jsonl --out idx/ --kind dense --encoder e5-small/ --faiss hnsw

The folder holds index.json (what was built from which corpus), the corpus's line offsets, and
bm25/ (bm25s's arrays) or dense/ (the FAISS index and the encoder's settings).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Protocol

import numpy as np

from rlfactory.envs.search.corpus_store import CorpusStore, scan_corpus

MANIFEST = "index.json"


class Searcher(Protocol):
    n_docs: int

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best (doc position, score), best first."""


@dataclass
class IndexInfo:
    kind: Literal["bm25", "dense"]
    corpus: str  # absolute path of the corpus it was built from
    n_docs: int
    build_s: float
    params: dict[str, Any]


def _count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += chunk.count(b"\n")
    return n


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="doc", unit_scale=True, file=sys.stderr, disable=not enabled)


def build_index(corpus: str | Path, out: str | Path, kind: Literal["bm25", "dense"] = "bm25", *,
                k1: float = 0.9, b: float = 0.4, encoder: str | None = None, faiss_index: str = "flat",
                nlist: int | None = None, batch_size: int = 64, progress: bool = True) -> IndexInfo:
    """Index `corpus` into the folder `out` (created; an existing index there is replaced)."""
    corpus, out = Path(corpus).resolve(), Path(out)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus not found: {corpus}")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a half-built folder has no manifest: never loaded
    t0 = time.perf_counter()
    bar = _progress(_count_lines(corpus), progress, f"index {corpus.name}")
    texts: list[str] = []

    def keep(i: int, contents: str) -> None:
        texts.append(contents)
        bar.update(1)

    if kind == "bm25":
        from rlfactory.envs.search.bm25 import BM25Index

        offsets, lines = scan_corpus(corpus, keep)
        bar.close()
        print(f"rlfactory index: {len(offsets)} docs read; building the BM25 matrix", file=sys.stderr, flush=True)
        BM25Index(_drain(texts), k1, b).save(out / "bm25")
        params: dict[str, Any] = {"k1": k1, "b": b}
    elif kind == "dense":
        from rlfactory.envs.search.dense import DenseIndex

        if not encoder:
            raise ValueError("--kind dense needs --encoder FOLDER (a Hugging Face encoder, e.g. e5-small-v2)")
        offsets, lines = scan_corpus(corpus, keep)
        bar.close()
        index = DenseIndex.build(texts, encoder, faiss_index, nlist=nlist, batch_size=batch_size, progress=progress)
        index.save(out / "dense")
        params = {"encoder": str(Path(encoder).resolve()), "faiss": faiss_index, "nlist": index.nlist}
    else:
        raise ValueError(f"unknown index kind {kind!r} (bm25 or dense)")
    np.save(out / "offsets.npy", offsets)
    np.save(out / "lines.npy", lines)
    info = IndexInfo(kind=kind, corpus=str(corpus), n_docs=len(offsets), build_s=round(time.perf_counter() - t0, 3),
                     params=params)
    (out / MANIFEST).write_text(json.dumps(asdict(info), indent=1))
    return info


def _drain(items: list[str]) -> Iterator[str]:
    """Yield the texts and drop each one as it is consumed (the token ids are what the build keeps)."""
    for i in range(len(items)):
        yield items[i]
        items[i] = ""


def load_index(folder: str | Path, mmap: bool = True) -> tuple[IndexInfo, Searcher, CorpusStore]:
    """(what it is, its searcher, the corpus's documents by position) of an index folder."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{folder} holds no finished index (no {MANIFEST}; build one with `rlfactory index`)")
    info = IndexInfo(**json.loads(manifest.read_text()))
    if info.kind == "bm25":
        from rlfactory.envs.search.bm25 import BM25Index

        searcher: Searcher = BM25Index.load(folder / "bm25", mmap=mmap)
    else:
        from rlfactory.envs.search.dense import DenseIndex

        searcher = DenseIndex.load(folder / "dense")
    store = CorpusStore(info.corpus, np.load(folder / "offsets.npy"), np.load(folder / "lines.npy"))
    if len(store) != info.n_docs or searcher.n_docs != info.n_docs:
        raise ValueError(f"{folder}: the index holds {searcher.n_docs} docs, the corpus offsets {len(store)}, "
                         f"index.json {info.n_docs}: rebuild it")
    return info, searcher, store
