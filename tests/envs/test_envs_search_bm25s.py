"""The search env's BM25 on bm25s: the scores of the numpy index it replaced (golden numbers taken
from that index at 3005164 on make_world(0, 20, 6)), a saved index loaded memory-mapped answers the
same, and `rlfactory index` builds it from JSON lines."""

from __future__ import annotations

import json

import pytest

from rlfactory.envs.search.bm25 import BM25Index
from rlfactory.envs.search.world import make_world

# query -> top 3 (passage index, score) of the numpy BM25 (k1 = 0.9, b = 0.4); ties in corpus order
GOLDEN = {
    "In which country was Sidi Ranu born?": [(6, 8.62376), (22, 5.82267), (0, 0.46558)],
    "Where is the company Zuku Veze works for based?": [(29, 10.08862), (1, 1.65899), (14, 1.65899)],
    "When was Zuku Veze born?": [(29, 10.08862), (0, 0.46558), (2, 0.46558)],
    "In which country was Sapo Razi born?": [(18, 10.08862), (0, 0.46558), (2, 0.46558)],
    "the the of": [(0, 0.0), (1, 0.0), (2, 0.0)],  # stop words only
    "zzz unknown": [(0, 0.0), (1, 0.0), (2, 0.0)],  # no term in the corpus
    "Bubas": [(5, 3.17866), (14, 2.30982), (7, 2.17098)],
}


def _texts() -> list[str]:
    return [p["contents"] for p in make_world(0, 20, 6).passages]


def _check(index: BM25Index) -> None:
    for query, want in GOLDEN.items():
        got = index.search(query, 3)
        assert [i for i, _ in got] == [i for i, _ in want], query
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5, abs=1e-5), query


def test_bm25s_scores_match_the_numpy_index_it_replaced():
    _check(BM25Index(_texts()))


def test_a_saved_index_loads_memory_mapped_with_the_same_scores(tmp_path):
    BM25Index(_texts()).save(tmp_path / "idx")
    loaded = BM25Index.load(tmp_path / "idx", mmap=True)
    assert loaded.n_docs == 42
    _check(loaded)
    assert BM25Index([]).search("anything", 3) == []
