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


def _corpus(tmp_path):
    texts = _texts()
    path = tmp_path / "corpus.jsonl"
    # one line without an id (its id is its line number) and a blank line, as Search-R1 corpora may have
    lines = [json.dumps({"id": f"p{i}", "contents": t}) if i else json.dumps({"contents": t}) for i, t in enumerate(texts)]
    path.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    return path, texts


def test_rlfactory_index_builds_a_folder_the_retriever_server_serves(tmp_path, capsys):
    import httpx

    from rlfactory.cli.main import main
    from rlfactory.envs.search.service import RetrieverProcess

    path, texts = _corpus(tmp_path)
    assert main(["index", str(path), "--out", str(tmp_path / "idx")]) == 0
    captured = capsys.readouterr()
    assert "indexed 42 docs (bm25)" in captured.out and "index corpus.jsonl" in captured.err  # the progress bar
    with RetrieverProcess(index=tmp_path / "idx") as server:
        reply = httpx.post(server.url + "/retrieve", json={"queries": list(GOLDEN)[:2] + ["Bubas"], "topk": 3,
                                                           "return_scores": True}, timeout=30).json()
    for query, hits in zip(list(GOLDEN)[:2] + ["Bubas"], reply["result"]):
        want = GOLDEN[query]
        assert [h["document"]["contents"] for h in hits] == [texts[i] for i, _ in want]
        assert [h["score"] for h in hits] == pytest.approx([s for _, s in want], rel=1e-5)
    first = hits[0]["document"]
    assert first["id"] == "p5"
    # the corpus's first line has no id: it gets its line number, as load_corpus gives it
    from rlfactory.envs.search.index_build import load_index

    _, _, store = load_index(tmp_path / "idx")
    assert store[0]["id"] == "0" and store[3]["id"] == "p3" and len(store) == 42


def test_index_of_a_bad_corpus_is_one_line(tmp_path, capsys):
    from rlfactory.cli.main import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\n{"id": "2", "text": "no contents"}\n')
    assert main(["index", str(bad), "--out", str(tmp_path / "idx"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == f"rlfactory index: {bad}:2: a corpus line needs a string `contents` field"
    assert not (tmp_path / "idx" / "index.json").exists()


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_dense_index_over_an_encoder_folder(tmp_path, kind):
    pytest.importorskip("faiss")
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rlfactory.envs.search.index_build import build_index, load_index
    from rlfactory.tiny import resolve_model

    # an encoder folder of BERT's architecture with random weights and the tiny model's tokenizer
    enc = tmp_path / "encoder"
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=256)).save_pretrained(enc)
    tok.save_pretrained(enc)
    path, texts = _corpus(tmp_path)
    info = build_index(path, tmp_path / "idx", "dense", encoder=str(enc), faiss_index=kind, nlist=4, progress=False)
    assert info.n_docs == 42 and info.params["faiss"] == kind
    _, searcher, store = load_index(tmp_path / "idx")
    if kind == "ivf":
        searcher.index.nprobe = 4  # every list: exact
    for i in (0, 7, 41):  # a passage's own text (as a passage) is its nearest neighbour: cosine 1
        searcher.query_prefix = searcher.passage_prefix
        (best, score), *_ = searcher.search(texts[i], 3)
        assert store[best]["contents"] == texts[i] and score == pytest.approx(1.0, abs=1e-4)


def test_search_over_the_matching_postings_equals_the_full_ranking():
    from rlfactory.envs.search.bm25 import top_k

    world = make_world(0, 20, 6)
    index = BM25Index([p["contents"] for p in world.passages])
    queries = [q.text for split in ("train", "test") for q in world.questions[split]] + ["Bubas", "zzz", ""]
    for query in queries:
        for k in (1, 3, 10, 42, 50):  # 42, 50: more than match, so zero-score docs pad in corpus order
            got, full = index.search(query, k), top_k(index.scores(query), k)
            assert [i for i, _ in got] == [i for i, _ in full], (query, k)
            assert [s for _, s in got] == pytest.approx([s for _, s in full], rel=1e-6, abs=1e-6)


def test_rare_and_common_terms_take_both_scoring_paths_and_agree_with_the_full_ranking():
    import random

    from rlfactory.envs.search.bm25 import top_k

    rng = random.Random(0)
    common, rare = [f"c{i}" for i in range(5)], [f"r{i}" for i in range(3000)]
    texts = [" ".join(rng.choice(common) for _ in range(6)) + " " + " ".join(rng.sample(rare, 3)) for _ in range(2000)]
    index = BM25Index(texts)
    for query in ["r1 r2", "r7", "c1", "c0 r5", "c2 c3 r9 r10", "nothing"]:
        # "r*" postings are short (a sort of the few matching docs); "c*" ones long (a pass over all docs)
        for k in (1, 3, 10):
            got, full = index.search(query, k), top_k(index.scores(query), k)
            assert [i for i, _ in got] == [i for i, _ in full], (query, k)
            assert [s for _, s in got] == pytest.approx([s for _, s in full], rel=1e-6, abs=1e-6)


def _zipf_texts(n: int, seed: int = 0) -> list[str]:
    """Passages as the retrieval benchmark makes them: a two-word title of rare words, then a
    Zipf-distributed body whose head words are in nearly every passage."""
    import numpy as np

    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        body = np.minimum(rng.zipf(1.15, size=int(rng.integers(20, 41))) - 1, 1999)
        title = rng.integers(0, 2000, size=2)
        texts.append(f"w{title[0]} w{title[1]}\n" + " ".join(f"w{i}" for i in body))
    return texts


def test_maxscore_pruning_gives_the_full_passes_ranking_to_the_bit():
    import random

    texts = _zipf_texts(3000)
    index = BM25Index(texts)
    index.prune_min_docs = 0  # prune at this size too (by default only from 50k docs, where it pays)
    rng = random.Random(1)
    queries = [" ".join(rng.choice(t.split()) for _ in range(4)) for t in rng.sample(texts, 150)]
    queries += ["w0 w1 w2", "w0", "w1 w3 w1999", "w5 w1234"]  # only common terms; a rare one with them
    pruned = 0
    for query in queries:
        ids = sorted({index._vocab[t] for t in query.split() if t in index._vocab})
        indptr = index._bm25.scores["indptr"]
        spans = [(int(indptr[t]), int(indptr[t + 1])) for t in ids]
        for k in (1, 3, 10):
            got, full = index._pruned(ids, spans, k), index._full(spans, k)
            if got is not None:
                pruned += 1
                assert got == full, (query, k)  # same docs, same scores, exactly
            assert index.search(query, k) == full, (query, k)
    assert pruned > 300  # most benchmark-like queries are answered by pruning, not by the full pass
    assert index._pruned(*_ids_spans(index, "w0 w1 w2"), 3) is None  # common terms only: no candidates to prune with


def _ids_spans(index: BM25Index, query: str):
    ids = sorted({index._vocab[t] for t in query.split() if t in index._vocab})
    indptr = index._bm25.scores["indptr"]
    return ids, [(int(indptr[t]), int(indptr[t + 1])) for t in ids]


def test_maxscore_pruning_falls_back_when_its_bound_is_not_below_the_kth_score():
    # docs 0..9 hold the rare term once among 200 words (a low weight); the common term is in half the
    # other docs, up to 7 times in a short one: a doc outside the candidates outscores them all
    texts = [f"rare {'x ' * 200}" for _ in range(10)] + [("common " * (1 + i % 7) if i % 2 else "") + f"y{i}"
                                                         for i in range(390)]
    index = BM25Index(texts)
    ids, spans = _ids_spans(index, "rare common")
    assert index._pruned(ids, spans, 3) is None
    assert index.search("rare common", 3) == index._full(spans, 3)


def test_many_short_postings_on_a_large_index_are_pruned_with_the_unions_ranking_to_the_bit():
    import random
    from collections import Counter

    texts = _zipf_texts(3000)
    index = BM25Index(texts)
    index.prune_min_docs, index.prune_min_postings = 0, 20  # as from 50k docs and 20k postings by default
    index.compiled = False  # the numpy MaxScore (the compiled one: the test below)
    rng = random.Random(2)
    # words in under 2% of the docs: a query's postings stay under 1/8 of them (the union's path)
    df = Counter(w for t in texts for w in set(t.split()))
    vocab = sorted(w for w, n in df.items() if n < 60)
    queries = [" ".join(rng.sample(vocab, 4)) for _ in range(150)]
    pruned = 0
    for query in queries:
        ids, spans = _ids_spans(index, query)
        total = sum(b - a for a, b in spans)
        assert total * 8 < index.n_docs, query
        for k in (1, 3, 10):
            union = index._union(spans, k)
            if total >= index.prune_min_postings and index._pruned(ids, spans, k) is not None:
                pruned += 1
            assert index.search(query, k) == union, (query, k)  # same docs, same scores, exactly
    assert pruned > 100


@pytest.mark.parametrize("copies", [1, 2])
def test_compiled_maxscore_gives_the_full_passes_ranking_to_the_bit(copies):
    """bm25_kernel (numba) against the full pass, on every path a query takes; with each passage
    twice (copies=2) every score ties with another doc's, and the earlier doc must come first."""
    import random

    pytest.importorskip("numba")
    texts = _zipf_texts(3000 // copies, seed=3) * copies
    index = BM25Index(texts)
    index.prune_min_docs = 0  # as on a large index
    rng = random.Random(4)
    queries = [" ".join(rng.choice(t.split()) for _ in range(rng.randint(2, 5))) for t in rng.sample(texts, 150)]
    queries += ["w0 w1 w2", "w0", "w1 w3 w1999", "w5 w1234", "nothing here", "w7 nothing"]
    proven = 0
    for query in queries:
        ids, spans = _ids_spans(index, query)
        for k in (1, 3, 10):
            full = index._full(spans, k) if ids else [(i, 0.0) for i in range(k)]
            got = index._compiled(ids, k) if ids else None
            if got is not None:
                proven += 1
                assert got == full, (query, k)  # same docs, same scores, exactly
                assert got == index._pruned(ids, spans, k) or index._pruned(ids, spans, k) is None
            assert index.search(query, k) == full, (query, k)
    assert proven > 200  # most queries are answered by the kernel, not by the full pass


def test_compiled_maxscore_breaks_a_tie_met_in_a_later_round_by_the_earlier_doc():
    pytest.importorskip("numba")
    # t1 and t2 are equally rare; doc 9 holds t1 twice, doc 8 t2 twice (the same weight). The first
    # round scores t1's docs and cannot prove doc 9 (t2's weight may match it); the second meets doc 8,
    # tied with doc 9 and earlier: it comes first, as in the full ranking.
    texts = ["c f1 f2 f3", "t1 c f4 f5", "t2 c f6 f7"] + [f"c x{i} y{i} z{i}" for i in range(5)]
    texts += ["t2 t2 f8 f9", "t1 t1 f10 f11"] + [f"c g{i} h{i} i{i}" for i in range(70)]  # 80 docs: 5 candidates allowed
    index = BM25Index(texts)
    index.prune_min_docs = 0
    ids, spans = _ids_spans(index, "t1 t2 c")
    full = index._full(spans, 2)
    assert [d for d, _ in full] == [8, 9] and full[0][1] == full[1][1]
    assert index._compiled(ids, 1) == full[:1] and index._compiled(ids, 2) == full


def test_term_maxima_are_each_terms_largest_weight_and_nan_where_its_docs_are_unsorted():
    import numpy as np

    from rlfactory.envs.search.bm25 import term_maxima

    index = BM25Index(_zipf_texts(500, seed=5))
    indptr, indices, data = index._csc()
    want = [float(data[a:b].max()) if b > a else 0.0 for a, b in zip(indptr[:-1], indptr[1:])]
    for chunk in (7, 1 << 24):  # the order check in small chunks and in one
        assert term_maxima(indptr, indices, data, chunk).tolist() == want
    # by hand: term 0 sorted, term 1 empty, term 2 unsorted (5 before 3), term 3 a repeated doc
    indptr = np.array([0, 2, 2, 5, 7])
    indices = np.array([1, 4, 0, 5, 3, 2, 2], dtype=np.int32)
    data = np.array([0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 3.0], dtype=np.float32)
    for chunk in (1, 2, 3, 100):
        got = term_maxima(indptr, indices, data, chunk)
        assert got[:2].tolist() == [1.5, 0.0] and np.isnan(got[2]) and np.isnan(got[3])
