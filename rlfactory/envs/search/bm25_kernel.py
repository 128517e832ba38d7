"""MaxScore top-k of one BM25 query as one compiled call (numba, `pip install 'rlfactory[retrieval]'`).

The numpy MaxScore in bm25.py makes a few dozen small numpy calls a query, and their overhead, not
the arithmetic, is most of its cost at 1M passages (about 1.3 ms a query). Here the same method runs
as one loop: the docs of the rarest terms are the candidates, each scored by looking it up in every
term's postings (a galloping search from the previous candidate's place: the candidates come in doc
order), the k best kept as it goes. The arithmetic is the numpy path's, step for step: a doc's
weights summed in float64 in term-id order, then cast to float32 and scaled by k1 + 1 in float32;
the bound the same float64 sum of the other terms' largest weights; ties to the earlier doc. So
the answers are those of the full ranking to the bit, and where the bound does not prove them
(`None`), the caller scores every doc as before.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

def _gallop(docs: np.ndarray, lo: int, hi: int, x: int) -> int:
    """The first position in docs[lo:hi] (sorted) holding a doc >= x, else hi; cheap when it is near lo."""
    if lo >= hi or docs[lo] >= x:
        return lo
    prev, step = lo, 1  # docs[prev] < x
    while prev + step < hi and docs[prev + step] < x:
        prev += step
        step *= 2
    left, right = prev + 1, min(prev + step, hi)  # the answer is in [left, right]
    while left < right:
        mid = (left + right) // 2
        if docs[mid] < x:
            left = mid + 1
        else:
            right = mid
    return left


def _maxscore(indices: np.ndarray, data: np.ndarray, starts: np.ndarray, ends: np.ndarray, maxima: np.ndarray,
              k: int, n_docs: int, scale: np.float32) -> tuple[np.ndarray, np.ndarray, bool]:
    """(docs [k], scores [k] float32, proven) for the terms whose postings are indices/data[starts[j]:ends[j]]
    (term-id order; each sorted by doc); `proven` False: the bound did not prove the top k."""
    m = len(starts)
    lengths = ends - starts
    order = np.argsort(lengths, kind="mergesort")  # rarest first; equal lengths in term-id order
    best_d = np.zeros(k, dtype=np.int64)
    best_s = np.zeros(k, dtype=np.float32)
    pos = np.zeros(m, dtype=np.int64)
    w = np.zeros(m, dtype=np.float64)  # a candidate's weight in each term (0: not there)
    rest = np.zeros(m + 1, dtype=np.float64)  # rest[r]: the largest weights of order[r:], summed
    for r in range(m - 1, -1, -1):
        rest[r] = rest[r + 1] + maxima[order[r]]
    filled = 0  # the best so far carry over from round to round: their scores are exact
    budget = n_docs // 16
    for n_rare in range(1, m):
        is_rare = np.zeros(m, dtype=np.bool_)
        taken = 0
        for r in range(n_rare):
            is_rare[order[r]] = True
            taken += lengths[order[r]]
        if taken > budget:
            return best_d, best_s, False
        bound = 0.0
        for j in range(m):  # term-id order, as the totals are summed
            if not is_rare[j]:
                bound += maxima[j]
        if n_rare == 1:
            j = order[0]
            cand = indices[starts[j]:ends[j]].astype(np.int64)
        else:
            parts = np.empty(taken, dtype=np.int64)
            at = 0
            for r in range(n_rare):
                j = order[r]
                for p in range(starts[j], ends[j]):
                    parts[at] = indices[p]
                    at += 1
            parts.sort()
            n_unique = 1
            for p in range(1, taken):
                if parts[p] != parts[p - 1]:
                    parts[n_unique] = parts[p]
                    n_unique += 1
            cand = parts[:n_unique]
        if len(cand) < k:
            continue
        for j in range(m):
            pos[j] = starts[j]
        for c in range(len(cand)):
            doc = cand[c]
            seen = False  # scored exactly by an earlier round already (it is among the best)
            for i in range(filled):
                if best_d[i] == doc:
                    seen = True
            if seen:
                continue
            # look the doc up rarest term first; stop once even the largest weights of the terms
            # left cannot lift it into the top k (with a margin far above float64 rounding)
            partial = 0.0
            alive = True
            for r in range(m):
                j = order[r]
                if filled == k and np.float32((partial + rest[r]) * (1.0 + 1e-6)) * scale < best_s[k - 1]:
                    alive = False
                    break
                p = _gallop(indices, pos[j], ends[j], doc)
                pos[j] = p
                w[j] = 0.0
                if p < ends[j] and indices[p] == doc:
                    w[j] = np.float64(data[p])
                    partial += w[j]
            if not alive:
                continue
            total = 0.0
            for j in range(m):  # term-id order, as the numpy path sums
                total += w[j]
            score = np.float32(total) * scale
            # keep the k best, by score, then the earlier doc (a later round meets earlier docs again)
            if filled < k:
                i = filled
                filled += 1
            elif score > best_s[k - 1] or (score == best_s[k - 1] and doc < best_d[k - 1]):
                i = k - 1
            else:
                continue
            while i > 0 and (best_s[i - 1] < score or (best_s[i - 1] == score and best_d[i - 1] > doc)):
                best_s[i] = best_s[i - 1]
                best_d[i] = best_d[i - 1]
                i -= 1
            best_s[i] = score
            best_d[i] = doc
        if best_s[k - 1] > np.float32(bound) * scale:
            return best_d, best_s, True
    return best_d, best_s, False


_kernel: Callable[..., tuple[np.ndarray, np.ndarray, bool]] | None | bool = None


def maxscore_kernel() -> Callable[..., tuple[np.ndarray, np.ndarray, bool]] | None:
    """`_maxscore` compiled (numba, imported on first use: it takes a second or so), or None when
    numba is not installed (BM25Index then runs the numpy MaxScore). Compiled once a machine: cached
    beside this file."""
    global _kernel, _gallop
    if _kernel is None:
        try:
            import numba
        except ImportError:
            _kernel = False
            return None
        _gallop = numba.njit(cache=True, nogil=True)(_gallop)  # the kernel calls it by this global name
        _kernel = numba.njit(cache=True, nogil=True)(_maxscore)
    return _kernel or None
