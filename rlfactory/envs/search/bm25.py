"""BM25 over a list of passages, on `bm25s` (sparse matrices; an index saved to a folder and
memory-mapped when loaded, so a million passages answer in milliseconds).

Scoring follows Lucene/Pyserini: idf = ln(1 + (N - n + 0.5) / (n + 0.5)), term weight
idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)), defaults k1 = 0.9, b = 0.4 (bm25s's
"lucene" method leaves out the constant factor k1 + 1, which is put back so that scores are those
of the numpy index this replaced). Tokens are lower-cased alphanumeric runs without Lucene's
English stop words; a query term counts once. Ties are broken by corpus order, so results are
deterministic.

For a corpus of your own (JSON lines, one `{"id", "contents"}` per line, the first line of
`contents` being the title), `BM25Corpus` is search in one line and a tool in two:

    corpus = BM25Corpus.from_jsonl("corpus.jsonl")
    corpus.search_text("who founded Hessvik", k=2)       # Search-R1's "Doc 1(Title: ...) ..." text
    EnvTools(python=[corpus.as_tool(topk=2)])            # a typed, documented `search` tool

`rlfactory index corpus.jsonl --out idx/` builds and saves the index of a large corpus once; the
retriever server (`python -m rlfactory.envs.search.retriever --index idx/`) loads it memory-mapped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from rlfactory.envs.search.bm25_kernel import maxscore_kernel

_TOKEN = re.compile(r"[a-z0-9]+")
# Lucene's EnglishAnalyzer default stop set.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The `k` best (index, score) of `scores` [n], best first; ties go to the earlier index."""
    n = len(scores)
    k = max(0, min(k, n))
    if k == 0:
        return []
    if k < n:
        # Keep every index whose score reaches the k-th best, so that ties are broken by order.
        kth = np.partition(scores, n - k)[n - k]
        cand = np.nonzero(scores >= kth)[0]
    else:
        cand = np.arange(n)
    order = cand[np.lexsort((cand, -scores[cand]))][:k]
    return [(int(i), float(scores[i])) for i in order]


class BM25Index:
    """BM25 over `texts` (a bm25s index: per term, the precomputed scores of the docs holding it,
    as a CSC sparse matrix). `save(folder)` writes it; `BM25Index.load(folder)` maps it back."""

    # Below this many docs a full pass (one bincount) costs less than pruning's dozen small numpy
    # calls: measured 0.66 vs 0.93 ms a query at 20k generated passages, 1.1 vs 0.35 ms at 100k.
    prune_min_docs = 50_000
    # Short postings (under 1/8 of the docs) are pruned too from this many: the union's sort grows
    # with all of them, pruning's work with the rarest terms' only (1M generated passages, under
    # load: from 30k postings 1.0 vs 6.6 ms a query; 10-30k about even; under 3k the union 2-3x cheaper).
    prune_min_postings = 20_000
    # MaxScore as one compiled call where numba is installed (rlfactory[retrieval]), for every query
    # on a large index: 0.32 vs 0.93 ms a query at 1M generated passages, 0.09 vs 0.97 at 100k (under load)
    compiled = True

    def __init__(self, texts: Iterable[str] | None = None, k1: float = 0.9, b: float = 0.4,
                 progress: Callable[[Iterable[str]], Iterable[str]] | None = None) -> None:
        import bm25s

        self.k1, self.b = k1, b
        self._maxima: np.ndarray | None = None  # each term's largest weight (see _term_maxima)
        self._unsorted = False  # some term's doc ids are not sorted (its maximum is NaN)
        self._scale = np.float32(k1 + 1.0)
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see _csc
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        if texts is None:  # `load` fills it in
            self.n_docs = 0
            return
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(text)] for text in (progress or iter)(texts)]
        self.n_docs = len(ids)
        vocab.setdefault("", len(vocab))  # bm25s's token of the empty doc
        if self.n_docs:
            self._bm25.index((ids, vocab), create_empty_token=False, show_progress=False)
        self._vocab = self._bm25.vocab_dict if self.n_docs else vocab

    def save(self, folder: str | Path) -> None:
        """Write the index to `folder` (numpy arrays, the vocabulary and the parameters, as bm25s saves them)."""
        self._bm25.save(str(folder), show_progress=False)
        (Path(folder) / "rlfactory_bm25.json").write_text(json.dumps({"n_docs": self.n_docs, "k1": self.k1, "b": self.b}))

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> "BM25Index":
        """The index saved in `folder`; with `mmap` its arrays stay on disk, paged in as queries touch them."""
        import bm25s

        meta = json.loads((Path(folder) / "rlfactory_bm25.json").read_text())
        index = cls(None, meta["k1"], meta["b"])
        index._bm25 = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
        index.n_docs, index._vocab = int(meta["n_docs"]), index._bm25.vocab_dict
        return index

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every doc for `query`, shape [n_docs]."""
        ids = sorted({self._vocab[t] for t in tokenize(query) if t in self._vocab})
        if not ids or not self.n_docs:
            return np.zeros(self.n_docs, dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids) * np.float32(self.k1 + 1.0)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best (doc index, score), best first; ties go to the earlier doc.

        Only the docs holding a query term are scored (the union of the terms' postings, read
        from the CSC arrays), so a query costs its postings, not the corpus size; when fewer than
        `k` docs match, the first non-matching docs follow with score 0, as a full ranking gives.
        On a large index a query is answered by MaxScore pruning where that is exact: compiled
        (`_compiled`) where numba is installed, else in numpy (`_pruned`) for long postings (a
        common term) or many short ones; else by one pass over all docs (long postings) or the
        union of the postings."""
        k = max(0, min(k, self.n_docs))
        ids = sorted({self._vocab[t] for t in tokenize(query) if t in self._vocab})
        if k == 0 or not ids:
            return [(i, 0.0) for i in range(k)]
        large = self.n_docs >= self.prune_min_docs
        compiled = large and self.compiled and maxscore_kernel() is not None
        if compiled:
            hits = self._compiled(ids, k)
            if hits is not None:
                return hits
        indptr = self._csc()[0]
        spans = [(int(indptr[t]), int(indptr[t + 1])) for t in ids]
        total = sum(b - a for a, b in spans)
        long = total * 8 >= self.n_docs
        if large and not compiled and (long or total >= self.prune_min_postings):
            hits = self._pruned(ids, spans, k)
            if hits is not None:
                return hits
        return self._full(spans, k) if long else self._union(spans, k)

    def search_many(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """`search` of each query, in order (one call for a batch of requests)."""
        return [self.search(q, k) for q in queries]

    def _csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices, data) as plain ndarrays: views of bm25s's (memory-mapped) arrays
        without np.memmap's per-slice Python overhead, which a query pays a dozen times."""
        if self._arrays is None:
            sc = self._bm25.scores
            self._arrays = (np.asarray(sc["indptr"]), np.asarray(sc["indices"]), np.asarray(sc["data"]))
        return self._arrays

    def _postings(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        _, indices, data = self._csc()
        return indices[a:b], data[a:b]

    def _full(self, spans: list[tuple[int, int]], k: int) -> list[tuple[int, float]]:
        """One pass over all docs: bincount of every posting (float64, terms in id order)."""
        parts = [self._postings(a, b) for a, b in spans]
        docs = np.concatenate([d for d, _ in parts])
        weights = np.concatenate([w for _, w in parts]).astype(np.float32)
        totals = np.bincount(docs, weights=weights, minlength=self.n_docs).astype(np.float32)
        return top_k(totals * np.float32(self.k1 + 1.0), k)

    def _union(self, spans: list[tuple[int, int]], k: int) -> list[tuple[int, float]]:
        """Score the union of the postings only (sorted doc ids), padded with zero-score docs."""
        parts = [self._postings(a, b) for a, b in spans]
        docs = np.concatenate([d for d, _ in parts])
        weights = np.concatenate([w for _, w in parts]).astype(np.float32)
        cand, inverse = np.unique(docs, return_inverse=True)  # sorted doc ids
        totals = np.bincount(inverse, weights=weights).astype(np.float32) * np.float32(self.k1 + 1.0)
        hits = [(int(cand[j]), float(totals[j])) for j, _ in top_k(totals, k)]
        if len(hits) < k:  # pad with the earliest docs that match nothing (score 0)
            matched = set(cand.tolist()) if len(cand) < 4 * k else None
            doc = 0
            while len(hits) < k:
                if (doc not in matched) if matched is not None else not np.isin(doc, cand):
                    hits.append((doc, 0.0))
                doc += 1
        return hits

    def _term_maxima(self) -> np.ndarray:
        """Each term's largest weight [n_terms] float64 (the bound MaxScore prunes by), computed once
        for all terms on first use (at 1M passages 0.02 s, where one by one as queries met the terms
        cost ~0.07 ms a query of a fresh server's first 2000)."""
        if self._maxima is None:
            maxima = term_maxima(*self._csc())
            self._unsorted = bool(np.isnan(maxima).any())  # set first: a thread that sees the maxima sees it
            self._maxima = maxima
        return self._maxima

    def _compiled(self, ids: list[int], k: int) -> list[tuple[int, float]] | None:
        """`_pruned` as one compiled call (bm25_kernel.maxscore, numba): the same answers to the bit,
        None where the bound does not prove them."""
        indptr, indices, data = self._csc()
        terms = np.array(ids, dtype=np.int64)
        maxima = self._term_maxima()[terms]
        if self._unsorted and np.isnan(maxima).any():
            return None
        docs, scores, proven = maxscore_kernel()(indices, data, indptr[terms], indptr[terms + 1], maxima, k,
                                                 self.n_docs, self._scale)
        return list(zip(docs.tolist(), scores.tolist())) if proven else None

    def _pruned(self, ids: list[int], spans: list[tuple[int, int]], k: int) -> list[tuple[int, float]] | None:
        """MaxScore: the docs of the rarest terms are the candidates, scored exactly (every query
        term looked up by binary search in its postings, summed in float64 in term-id order as the
        full pass sums them, so the scores are the same to the bit). A doc outside them holds only
        common terms, so it scores at most the sum of those terms' largest weights; when that bound
        is below the k-th best candidate, no such doc can enter the top k and the answer is exact.
        None when it is not (the caller then scores every doc)."""
        order = sorted(range(len(ids)), key=lambda j: spans[j][1] - spans[j][0])
        maxima = self._term_maxima()[ids].tolist()
        if any(m != m for m in maxima):  # NaN: a term's doc ids not sorted
            return None
        scale = np.float32(self.k1 + 1.0)
        budget = self.n_docs // 16  # candidates from postings this long at most: lookups stay cheap
        for n_rare in range(1, len(ids)):
            rare = sorted(order[:n_rare])
            if sum(spans[j][1] - spans[j][0] for j in rare) > budget:
                return None
            bound = 0.0
            for j in range(len(ids)):  # term-id order, as the totals are summed
                if j not in rare:
                    bound += maxima[j]
            if n_rare == 1:  # one term's doc ids: sorted and distinct already (term_maxima checked)
                cand = self._postings(*spans[rare[0]])[0]
            else:
                cand = np.unique(np.concatenate([self._postings(*spans[j])[0] for j in rare]))
            if len(cand) < k:
                continue
            totals = np.zeros(len(cand), dtype=np.float64)
            for a, b in spans:  # term-id order
                docs, weights = self._postings(a, b)
                pos = np.searchsorted(docs, cand)
                inside = pos < len(docs)
                found = np.zeros(len(cand), dtype=bool)
                found[inside] = docs[pos[inside]] == cand[inside]
                add = np.zeros(len(cand), dtype=np.float64)
                add[found] = weights[pos[found]]
                totals += add
            scores = totals.astype(np.float32) * scale
            best = top_k(scores, k)
            if scores[best[-1][0]] > np.float32(bound) * scale:
                return [(int(cand[j]), float(s)) for j, s in best]
        return None


def term_maxima(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, chunk: int = 1 << 24) -> np.ndarray:
    """Each term's largest weight [n_terms] float64 of CSC postings (term t's doc ids and weights are
    indices/data[indptr[t]:indptr[t + 1]]); 0 for a term without postings, NaN for one whose doc ids
    are not strictly increasing (MaxScore's binary search needs them sorted; bm25s writes them so).
    One pass over the postings, the order check in chunks (bounded memory at any size)."""
    out = np.zeros(len(indptr) - 1, dtype=np.float64)
    nonempty = np.flatnonzero(indptr[1:] > indptr[:-1])
    if len(nonempty):  # the segments between non-empty terms' starts are exactly their postings
        out[nonempty] = np.maximum.reduceat(data, indptr[nonempty])
    for lo in range(1, len(indices), chunk):
        hi = min(lo + chunk, len(indices))
        bad = np.flatnonzero(indices[lo:hi] <= indices[lo - 1:hi - 1]) + lo  # not above the posting before
        if len(bad):
            terms = np.searchsorted(indptr, bad, side="right") - 1
            out[terms[indptr[terms] != bad]] = np.nan  # a term's first posting follows another term's
    return out


def load_corpus(path: str | Path) -> list[dict[str, Any]]:
    """A JSON-lines corpus: one `{"id", "contents"}` object per line (Search-R1's format)."""
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            doc = json.loads(line)
            if "contents" not in doc:
                raise ValueError(f"{path}:{n}: a corpus line needs a `contents` field")
            doc.setdefault("id", str(n - 1))
            docs.append(doc)
    return docs


class BM25Corpus:
    """BM25 search over a list of `{"id", "contents"}` documents, in this process."""

    def __init__(self, docs: list[dict[str, Any]], k1: float = 0.9, b: float = 0.4) -> None:
        self.docs = docs
        self.index = BM25Index([d["contents"] for d in docs], k1, b)

    @classmethod
    def from_jsonl(cls, path: str | Path, k1: float = 0.9, b: float = 0.4) -> "BM25Corpus":
        """A corpus from a JSON-lines file (Search-R1's format, see `load_corpus`)."""
        return cls(load_corpus(path), k1, b)

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        """The `k` best documents for `query`, best first."""
        return [self.docs[i] for i, _ in self.index.search(query, k)]

    def search_text(self, query: str, k: int = 3) -> str:
        """The `k` best documents as Search-R1 shows them to the model: `Doc 1(Title: t) text`, a line each."""
        from rlfactory.envs.search.prompts import format_results

        return format_results(self.search(query, k))

    def as_tool(self, topk: int = 3, name: str = "search",
                description: str = "Search the corpus and return the top passages.") -> Callable[..., Any]:
        """A tool for `EnvTools(python=[...])`: `name(query: str) -> str`, answering `search_text`."""
        from rlfactory.tools.function import function_tool

        async def search(query: str) -> str:
            """Search the corpus.

            Args:
                query: What to look up, e.g. a name from the question.
            """
            return self.search_text(query, topk)

        return function_tool(search, name=name, description=description)
