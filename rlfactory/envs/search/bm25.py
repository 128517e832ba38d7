"""BM25 over a list of passages, with numpy (no extra dependency).

Scoring follows Lucene/Pyserini: idf = ln(1 + (N - n + 0.5) / (n + 0.5)), term weight
idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)), defaults k1 = 0.9, b = 0.4.
Tokens are lower-cased alphanumeric runs without Lucene's English stop words. Ties are broken by
corpus order, so results are deterministic.

For a corpus of your own (JSON lines, one `{"id", "contents"}` per line, the first line of
`contents` being the title), `BM25Corpus` is search in one line and a tool in two:

    corpus = BM25Corpus.from_jsonl("corpus.jsonl")
    corpus.search_text("who founded Hessvik", k=2)       # Search-R1's "Doc 1(Title: ...) ..." text
    EnvTools(python=[corpus.as_tool(topk=2)])            # a typed, documented `search` tool
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")
# Lucene's EnglishAnalyzer default stop set.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25Index:
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
        from rlfactory.envs.search.mcp_server import format_results

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
