"""Hybrid retrieval: the ranked lists of any number of retrievers fused into one.

Reciprocal Rank Fusion (Cormack, Clarke & Büttcher, SIGIR 2009), as the MetaRAG reproducibility
study (§4.3.2) fuses BM25 and dense retrieval, or a weighted sum of min-max normalized scores.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from metarag.errors import ConfigError, close_matches
from metarag.records import Hit, Passage
from metarag.retrieve.base import Retriever

FUSION_METHODS = ("rrf", "weighted")


@dataclass(frozen=True)
class FusionSettings:
    """How several retrievers' rankings merge; defaults: the MetaRAG reproducibility study, §4.3.2.

    The study retrieves the top 100 passages from BM25 and from a dense (E5) retriever
    independently, merges the two lists with Reciprocal Rank Fusion and keeps the top 5 (the k a
    method asks for). `method` "rrf" scores a passage sum_r w_r / (rrf_k + rank_r) over the
    retrievers that returned it within their top `depth` (rank 1 is the best; rrf_k = 60 is Cormack
    et al.'s). "weighted" scores it sum_r w_r * (s_r - min_r) / (max_r - min_r): each retriever's
    scores min-max normalized over the list it returned (all 1 when they are all equal), 0 where it
    did not return the passage. `weights` (one per retriever) None means 1 each for "rrf" and 1/n
    each for "weighted", so weighted scores stay within [0, 1].
    """

    method: str = "rrf"
    rrf_k: int = 60
    depth: int = 100
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ConfigError(f"unknown fusion method {self.method!r}{close_matches(self.method, FUSION_METHODS)}")
        if self.rrf_k < 0:
            raise ConfigError(f"fusion rrf_k must be >= 0, got {self.rrf_k}")
        if self.depth < 1:
            raise ConfigError(f"fusion depth must be >= 1, got {self.depth}")
        if self.weights is not None:
            # A list given from a config file is frozen to a tuple, so the settings stay hashable.
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
            if not self.weights or any(not math.isfinite(w) or w < 0 for w in self.weights):
                raise ConfigError(f"fusion weights must be finite and >= 0, got {self.weights}")
            if not any(self.weights):
                raise ConfigError("fusion weights are all 0: no retriever would count")


class FusionRetriever:
    """A retriever over several others: each returns its top `depth`, the lists are fused, the best k kept.

    Passages are the same passage when their ids are. Ties in the fused score go to the passage
    some retriever ranked higher (then to the earlier retriever). `exclude` is passed down, so each
    retriever fills its `depth` from the passages not excluded.
    """

    def __init__(self, retrievers: Sequence[Retriever], settings: FusionSettings = FusionSettings(), *,
                 name: str = "hybrid"):
        if not retrievers:
            raise ConfigError("fusion needs at least one retriever")
        if settings.weights is not None and len(settings.weights) != len(retrievers):
            raise ConfigError(f"fusion has {len(settings.weights)} weights for {len(retrievers)} retrievers "
                              f"({', '.join(r.name for r in retrievers)})")
        self.retrievers = list(retrievers)
        self.settings = settings
        self.name = name
        if settings.weights is not None:
            self.weights = settings.weights
        elif settings.method == "rrf":
            self.weights = (1.0,) * len(retrievers)
        else:
            self.weights = (1.0 / len(retrievers),) * len(retrievers)

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k best passages for `query` by fused score, skipping ids in `exclude`."""
        return self.search_many([query], k, exclude)[0]

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        """`search` for each of `queries`; each retriever answers them all in one batch when it can."""
        if k <= 0 or not queries:
            return [[] for _ in queries]
        excluded = frozenset(exclude)
        # Fetch at least k from each, so a k beyond the depth can still be filled.
        depth = max(self.settings.depth, k)
        per_retriever = [batch_search(r, list(queries), depth, excluded) for r in self.retrievers]
        return [self.fuse([rankings[i] for rankings in per_retriever], k, excluded) for i in range(len(queries))]

    def fuse(self, rankings: Sequence[Sequence[Hit]], k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k best passages of `rankings` (one best-first list per retriever, in order), fused."""
        if len(rankings) != len(self.retrievers):
            raise ConfigError(f"fusion of {len(self.retrievers)} retrievers given {len(rankings)} rankings")
        contributions = (self._rrf(rankings) if self.settings.method == "rrf" else self._weighted(rankings))
        scores: dict[str, float] = {}
        passages: dict[str, Passage] = {}
        # Walk the lists rank by rank, retriever by retriever: that order breaks ties in the score.
        for rank in range(max((len(r) for r in rankings), default=0)):
            for which, ranking in enumerate(rankings):
                if rank >= len(ranking):
                    continue
                passage = ranking[rank].passage
                if passage.id in exclude:  # a retriever that ignored exclude must not leak it through
                    continue
                passages.setdefault(passage.id, passage)
                scores[passage.id] = scores.get(passage.id, 0.0) + contributions[which][rank]
        # sorted() is stable, so equal scores keep the rank-by-rank order of first appearance.
        best = sorted(scores, key=lambda pid: -scores[pid])[:k]
        return [Hit(passages[pid], scores[pid], self.name) for pid in best]

    def _rrf(self, rankings: Sequence[Sequence[Hit]]) -> list[list[float]]:
        k0 = self.settings.rrf_k
        return [[w / (k0 + rank) for rank in range(1, len(ranking) + 1)]
                for w, ranking in zip(self.weights, rankings)]

    def _weighted(self, rankings: Sequence[Sequence[Hit]]) -> list[list[float]]:
        contributions = []
        for w, ranking in zip(self.weights, rankings):
            scores = [h.score for h in ranking]
            low, high = min(scores, default=0.0), max(scores, default=0.0)
            if high > low:
                contributions.append([w * (s - low) / (high - low) for s in scores])
            else:  # one passage, or all tied: each is this retriever's best
                contributions.append([w] * len(scores))
        return contributions


def batch_search(retriever: Retriever, queries: Sequence[str], k: int, exclude: Collection[str] = ()
                 ) -> list[list[Hit]]:
    """`retriever.search_many` where it has one (one batch), else `search` query by query."""
    batch = getattr(retriever, "search_many", None)
    if batch is not None:
        return batch(queries, k, exclude)
    return [retriever.search(q, k, exclude) for q in queries]
