"""Fusion: RRF and weighted score fusion against worked examples computed by hand, depth, exclude,
batching, settings checks, and a hybrid of two real retrievers."""
from __future__ import annotations

import importlib.util
from collections.abc import Collection, Sequence

import pytest

from metarag.errors import ConfigError
from metarag.records import Hit, Passage
from metarag.retrieve.base import Retriever
from metarag.retrieve.fusion import FusionRetriever, FusionSettings
from metarag.retrieve.memory import MemoryRetriever


class Ranked:
    """A retriever that returns a fixed best-first list of (id, score) for every query, as told."""

    def __init__(self, name: str, ranking: Sequence[tuple[str, float]], *, honours_exclude: bool = True):
        self.name = name
        self.ranking = list(ranking)
        self.honours_exclude = honours_exclude
        self.asked: list[tuple[str, int, frozenset[str]]] = []

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        self.asked.append((query, k, frozenset(exclude)))
        kept = [(pid, s) for pid, s in self.ranking if not (self.honours_exclude and pid in exclude)]
        return [Hit(Passage(pid, f"title {pid}", f"text {pid}"), s, self.name) for pid, s in kept[:k]]


class Batched(Ranked):
    """`Ranked` with a `search_many`, counting the batches it was asked."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[list[str]] = []

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        self.batches.append(list(queries))
        return [self.search(q, k, exclude) for q in queries]


def ids(hits):
    return [h.passage.id for h in hits]


# Three retrievers' lists for the worked example (scores do not matter to RRF).
BM25_LIST = [("A", 9.0), ("B", 7.0), ("C", 1.0)]
DENSE_LIST = [("B", 0.9), ("D", 0.8), ("A", 0.7)]
THIRD_LIST = [("C", 3.0), ("B", 2.0)]


def three() -> list[Ranked]:
    return [Ranked("bm25", BM25_LIST), Ranked("dense", DENSE_LIST), Ranked("third", THIRD_LIST)]


def test_rrf_matches_the_worked_example():
    # RRF with k=60: each list adds 1/(60 + rank), ranks from 1.
    #   A: 1/61 (bm25 #1) + 1/63 (dense #3)
    #   B: 1/62 (bm25 #2) + 1/61 (dense #1) + 1/62 (third #2)
    #   C: 1/63 (bm25 #3) + 1/61 (third #1)           = A's score exactly
    #   D: 1/62 (dense #2)
    # A and C tie; A was ranked #1 by the first retriever, before C's #1 by the third, so A first.
    fused = FusionRetriever(three())
    assert isinstance(fused, Retriever) and fused.name == "hybrid"
    hits = fused.search("q", 10)
    assert ids(hits) == ["B", "A", "C", "D"]
    assert [h.score for h in hits] == pytest.approx([1 / 61 + 2 / 62, 1 / 61 + 1 / 63, 1 / 63 + 1 / 61, 1 / 62],
                                                    abs=1e-15)
    assert {h.retriever for h in hits} == {"hybrid"}
    assert hits[0].passage == Passage("B", "title B", "text B")
    # k keeps the best k of the fused list.
    assert ids(fused.search("q", 2)) == ["B", "A"]


def test_rrf_k_is_settable():
    # k=1: A = 1/2 + 1/4, B = 1/3 + 1/2 + 1/3, C = 1/4 + 1/2, D = 1/3.
    hits = FusionRetriever(three(), FusionSettings(rrf_k=1)).search("q", 4)
    assert ids(hits) == ["B", "A", "C", "D"]
    assert [h.score for h in hits] == pytest.approx([7 / 6, 3 / 4, 3 / 4, 1 / 3])


def test_rrf_weights_scale_each_retriever():
    # Weights (2, 1, 0): A = 2/61 + 1/63, B = 2/62 + 1/61, C = 2/63, D = 1/62.
    hits = FusionRetriever(three(), FusionSettings(weights=(2, 1, 0))).search("q", 4)
    assert ids(hits) == ["A", "B", "C", "D"]
    assert [h.score for h in hits] == pytest.approx([2 / 61 + 1 / 63, 2 / 62 + 1 / 61, 2 / 63, 1 / 62])


def test_each_retriever_is_asked_for_depth_and_only_depth_counts():
    retrievers = three()
    FusionRetriever(retrievers).search("q", 5)
    # The study's setup: the top 100 of each, fused, top 5 kept.
    assert [r.asked for r in retrievers] == [[("q", 100, frozenset())]] * 3
    # depth 1: only each list's first passage counts: A, B and C 1/61 each, A first (first list).
    # With the whole lists B wins (see the worked example): the depth cut changed the answer.
    [hit] = FusionRetriever(three(), FusionSettings(depth=1)).search("q", 1)
    assert hit.passage.id == "A" and hit.score == pytest.approx(1 / 61)
    assert ids(FusionRetriever(three()).search("q", 1)) == ["B"]
    # A k beyond the depth is still filled: each retriever is asked for k.
    retrievers = three()
    assert len(FusionRetriever(retrievers, FusionSettings(depth=1)).search("q", 3)) == 3
    assert retrievers[0].asked == [("q", 3, frozenset())]


def test_weighted_fusion_min_max_normalizes_each_retriever():
    # bm25 scores 9, 7, 1 normalize to (s - 1) / 8: A 1, B 0.75, C 0.
    # dense scores 0.9, 0.8, 0.7 normalize to (s - 0.7) / 0.2: B 1, D 0.5, A 0.
    two = [Ranked("bm25", BM25_LIST), Ranked("dense", DENSE_LIST)]
    hits = FusionRetriever(two, FusionSettings(method="weighted")).search("q", 4)
    # Default weights 1/2 each: A 0.5, B 0.875, C 0, D 0.25.
    assert ids(hits) == ["B", "A", "D", "C"]
    assert [h.score for h in hits] == pytest.approx([0.875, 0.5, 0.25, 0.0])
    # Weights 0.2 / 0.8: A 0.2, B 0.15 + 0.8 = 0.95, C 0, D 0.4.
    hits = FusionRetriever(two, FusionSettings(method="weighted", weights=(0.2, 0.8))).search("q", 4)
    assert ids(hits) == ["B", "D", "A", "C"]
    assert [h.score for h in hits] == pytest.approx([0.95, 0.4, 0.2, 0.0])


def test_weighted_fusion_of_equal_scores_counts_each_as_best():
    flat = Ranked("flat", [("X", 5.0), ("Y", 5.0)])
    single = Ranked("single", [("Y", 0.3)])
    hits = FusionRetriever([flat, single], FusionSettings(method="weighted")).search("q", 3)
    # flat: both normalize to 1; single: its only hit normalizes to 1. Y = 0.5 + 0.5, X = 0.5.
    assert ids(hits) == ["Y", "X"] and [h.score for h in hits] == pytest.approx([1.0, 0.5])


def test_exclude_is_passed_down_and_ranks_shift():
    retrievers = three()
    hits = FusionRetriever(retrievers).search("q", 5, exclude={"B"})
    assert all(asked[2] == frozenset({"B"}) for r in retrievers for asked in r.asked)
    # Without B: bm25 [A, C], dense [D, A], third [C]. A = 1/61 + 1/62, C = 1/62 + 1/61, D = 1/61.
    assert ids(hits) == ["A", "C", "D"]
    assert [h.score for h in hits] == pytest.approx([1 / 61 + 1 / 62, 1 / 62 + 1 / 61, 1 / 61])


def test_exclude_holds_even_for_a_retriever_that_ignores_it():
    leaky = [Ranked("bm25", BM25_LIST, honours_exclude=False), Ranked("dense", DENSE_LIST)]
    hits = FusionRetriever(leaky).search("q", 5, exclude=["A", "D"])
    assert ids(hits) == ["B", "C"]
    # bm25 still ranks B second (it returned A first); dense without A and D has only B, first.
    assert [h.score for h in hits] == pytest.approx([1 / 62 + 1 / 61, 1 / 63])


def test_search_many_batches_each_retriever_once():
    batched = [Batched("bm25", BM25_LIST), Batched("dense", DENSE_LIST)]
    fused = FusionRetriever(batched + [Ranked("third", THIRD_LIST)])
    many = fused.search_many(["q1", "q2", "q3"], 3)
    assert [b.batches for b in batched] == [[["q1", "q2", "q3"]]] * 2
    assert many == [fused.search(q, 3) for q in ("q1", "q2", "q3")]
    assert fused.search_many([], 3) == [] and fused.search("q", 0) == []


def test_settings_and_shapes_are_checked():
    with pytest.raises(ConfigError, match="did you mean rrf"):
        FusionSettings(method="rff")
    with pytest.raises(ConfigError, match="depth"):
        FusionSettings(depth=0)
    with pytest.raises(ConfigError, match="rrf_k"):
        FusionSettings(rrf_k=-1)
    with pytest.raises(ConfigError, match=">= 0"):
        FusionSettings(weights=(1.0, -0.5))
    with pytest.raises(ConfigError, match="all 0"):
        FusionSettings(weights=(0, 0))
    with pytest.raises(ConfigError, match="2 weights for 3 retrievers"):
        FusionRetriever(three(), FusionSettings(weights=(1, 1)))
    with pytest.raises(ConfigError, match="at least one"):
        FusionRetriever([])
    assert FusionSettings(weights=[1, 2]).weights == (1.0, 2.0)  # type: ignore[arg-type]


CITIES = [Passage(*fields) for fields in [
    ("p1", "Paris", "Paris is the capital and largest city of France."),
    ("p2", "Berlin", "Berlin is the capital of Germany."),
    ("p3", "Lyon", "Lyon is a city in France, known for its cuisine."),
    ("p4", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    ("p5", "Mars", "Mars is the fourth planet from the Sun."),
]]


@pytest.mark.skipif(importlib.util.find_spec("bm25s") is None, reason="bm25s not installed")
def test_hybrid_of_real_retrievers_equals_rrf_of_their_rankings():
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings

    sparse = BM25Retriever.build(CITIES, BM25Settings(stopwords=None))
    # A second, differently scored retriever: memory BM25 with other k1/b.
    other = MemoryRetriever(CITIES, "other", k1=2.0, b=1.0)
    fused = FusionRetriever([sparse, other])
    for query in ("capital of France", "Paris tower", "planet"):
        expected: dict[str, float] = {}
        for ranking in (sparse.search(query, 100), other.search(query, 100)):
            for rank, hit in enumerate(ranking, 1):
                expected[hit.passage.id] = expected.get(hit.passage.id, 0.0) + 1 / (60 + rank)
        hits = fused.search(query, 5)
        assert {h.passage.id: h.score for h in hits} == pytest.approx(
            dict(sorted(expected.items(), key=lambda item: -item[1])[:5]))
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
