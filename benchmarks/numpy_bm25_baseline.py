"""Today's (until 0d99642) BM25 of the search env, kept verbatim as the baseline of
benchmarks/retrieval_scale.py: an in-memory numpy inverted index (Python lists while building)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from rlfactory.envs.search.bm25 import tokenize


class NumpyBM25Index:
    """An inverted index: per term, the ids of the docs holding it (int32, shape [df]) and the
    term frequencies (float32, shape [df])."""

    def __init__(self, texts: list[str], k1: float = 0.9, b: float = 0.4) -> None:
        self.k1, self.b = k1, b
        self.n_docs = len(texts)
        postings: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        lengths = np.zeros(self.n_docs, dtype=np.float32)
        for i, text in enumerate(texts):
            counts = Counter(tokenize(text))
            lengths[i] = sum(counts.values())
            for term, tf in counts.items():
                ids, tfs = postings[term]
                ids.append(i)
                tfs.append(tf)
        avgdl = float(lengths.mean()) if self.n_docs else 1.0
        # Length normalisation per doc, shape [n_docs]: k1 * (1 - b + b * dl / avgdl).
        self._norm = self.k1 * (1.0 - self.b + self.b * lengths / max(avgdl, 1e-9))
        self._postings: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for term, (ids, tfs) in postings.items():
            df = len(ids)
            idf = float(np.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5)))
            self._postings[term] = (np.asarray(ids, dtype=np.int32), np.asarray(tfs, dtype=np.float32), idf)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every doc for `query`, shape [n_docs]."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        for term in set(tokenize(query)):
            hit = self._postings.get(term)
            if hit is None:
                continue
            ids, tfs, idf = hit
            out[ids] += idf * tfs * (self.k1 + 1.0) / (tfs + self._norm[ids])
        return out

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best (doc index, score), best first; ties go to the earlier doc."""
        k = max(0, min(k, self.n_docs))
        if k == 0:
            return []
        s = self.scores(query)
        if k < self.n_docs:
            # Keep every doc whose score reaches the k-th best, so that ties are broken by order.
            kth = np.partition(s, self.n_docs - k)[self.n_docs - k]
            cand = np.nonzero(s >= kth)[0]
        else:
            cand = np.arange(self.n_docs)
        order = cand[np.lexsort((cand, -s[cand]))][:k]
        return [(int(i), float(s[i])) for i in order]



def serve(corpus: str, port: int) -> None:
    """Today's retriever: the whole corpus in memory, this index built at start-up, Search-R1's API."""
    import sys
    import time

    import uvicorn

    from rlfactory.envs.search.bm25 import load_corpus
    from retriever_before import build_app_before

    t0 = time.perf_counter()
    docs = load_corpus(corpus)
    index = NumpyBM25Index([d["contents"] for d in docs])
    print(f"built {len(docs)} docs in {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
    uvicorn.run(build_app_before(docs, 3, index), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    import sys

    serve(sys.argv[1], int(sys.argv[2]))
