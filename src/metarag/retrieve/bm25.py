"""Sparse retrieval: BM25 over a corpus with bm25s (Lucene scoring), built, saved and loaded.

`retrieve/index.py` decides when to build or reuse; this module only knows one index folder.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from metarag.errors import ConfigError, DataError, MissingDependency, close_matches
from metarag.records import Hit, Passage
from metarag.retrieve.store import LRUCache, cached_search, read_meta, saved_settings, write_meta
from metarag.settings import check_ranges, setting

BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


@dataclass(frozen=True)
class BM25Settings:
    """How a BM25 index tokenizes and scores; defaults are Pyserini's (Lucene BM25, k1=0.9, b=0.4).

    The MetaRAG reproducibility study retrieved with Pyserini's BM25, whose defaults these are.
    `stopwords` names a bm25s stopword list ("en") or is None. No stemming (Pyserini stems with
    Porter): it would need PyStemmer, and the index stays dependency-light without it.
    `cache_size` is how many recent (query, k, exclude) answers a retriever keeps within a run; it
    does not shape the index (see `index_fields`).
    """

    k1: float = setting(0.9, ge=0)
    b: float = setting(0.4, ge=0, le=1)
    method: str = "lucene"
    stopwords: str | None = "en"
    cache_size: int = setting(1024, ge=0)

    def __post_init__(self) -> None:
        if self.method not in BM25_METHODS:
            hint = close_matches(self.method, BM25_METHODS)
            raise ConfigError(f"unknown BM25 method {self.method!r}{hint}")
        check_ranges(self)


# Settings that change how a search runs, not what the index holds: never a reason to rebuild.
OUTSIDE_FINGERPRINT = ("cache_size",)


def index_fields(settings: BM25Settings) -> dict[str, Any]:
    """The settings that shape a saved index: what its fingerprint records."""
    return {k: v for k, v in dataclasses.asdict(settings).items() if k not in OUTSIDE_FINGERPRINT}


def _import_bm25s() -> ModuleType:
    try:
        import bm25s
    except ModuleNotFoundError as exc:
        if exc.name != "bm25s":  # bm25s is there but broken: that is not a missing extra
            raise
        raise MissingDependency("bm25s", "bm25") from None
    return bm25s


class BM25Retriever:
    """BM25 search over passages (title and text) with a bm25s index; use `build` or `load`.

    Like Lucene, only passages sharing a token with the query are returned. Hits come best first,
    equal scores in corpus order, as with `MemoryRetriever` (also for ties at the k-th place). The
    last `settings.cache_size` answers are kept, so a query repeated within a run (same k and
    exclude) is not scored again.
    """

    name = "bm25"

    def __init__(self, passages: Sequence[Passage], engine: Any, settings: BM25Settings):
        self.passages = list(passages)
        self.settings = settings
        # Where the index is saved, once it is (set by `load` and by `open_bm25`).
        self.index_dir: Path | None = None
        self._engine = engine
        self._bm25s = _import_bm25s()
        self.cache: LRUCache[tuple[str, int, frozenset[str]], tuple[Hit, ...]] = LRUCache(settings.cache_size)
        num_docs = int(engine.scores["num_docs"])
        if num_docs != len(self.passages):
            raise DataError(f"the BM25 index holds {num_docs} passages but {len(self.passages)} were given")

    # ---------------------------------------------------------------------------------- build
    @classmethod
    def build(cls, passages: Sequence[Passage], settings: BM25Settings = BM25Settings(), *,
              show_progress: bool = False) -> BM25Retriever:
        """Index `passages` in memory."""
        bm25s = _import_bm25s()
        if not passages:
            raise DataError("cannot index an empty corpus")
        tokens = _tokenize(bm25s, [p.contents() for p in passages], settings, show_progress)
        if not any(tokens):
            words = "blank, punctuation or stopwords" if settings.stopwords else "blank or punctuation"
            raise DataError(f"none of the corpus's {len(passages)} passages has a word BM25 can index (all "
                            f"{words}): nothing to search")
        engine = bm25s.BM25(k1=settings.k1, b=settings.b, method=settings.method)
        engine.index(tokens, show_progress=show_progress)
        return cls(passages, engine, settings)

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the index into `directory` (created if needed): bm25s's files plus our metadata."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._engine.save(str(directory), show_progress=False)
        write_meta(directory, self.passages, settings=dataclasses.asdict(self.settings))

    @classmethod
    def load(cls, directory: str | os.PathLike[str], passages: Sequence[Passage], *,
             mmap: bool = True, settings: BM25Settings | None = None) -> BM25Retriever:
        """The index saved in `directory`, over `passages` (the same ones, in the same order).

        The score arrays are memory-mapped by default, so loading is quick, pages in on use and the
        pages are shared by every process serving the same index. `settings` None means those
        saved; given, they must match the saved ones except for search-only fields (cache_size).
        """
        bm25s = _import_bm25s()
        directory = Path(directory)
        meta = read_meta(directory, passages)
        settings = saved_settings(directory, meta, BM25Settings, settings, index_fields, "BM25")
        engine = bm25s.BM25.load(str(directory), mmap=mmap, show_progress=False)
        retriever = cls(passages, engine, settings)
        retriever.index_dir = directory
        return retriever

    # --------------------------------------------------------------------------------- search
    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k best passages for `query`, skipping ids in `exclude`."""
        return self.search_many([query], k, exclude)[0]

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = (), *,
                    n_threads: int = 0) -> list[list[Hit]]:
        """`search` for each of `queries` (all skipping `exclude`).

        `n_threads` > 0 scores the queries in a thread pool of that size; the default scores them in
        this thread, which is faster for one query and on few cores.
        """
        if k <= 0 or not queries:
            return [[] for _ in queries]
        excluded = frozenset(exclude)
        return cached_search(self.cache, queries, k, excluded,
                             lambda missing: self._search(missing, k, excluded, n_threads))

    def _search(self, queries: list[str], k: int, exclude: frozenset[str], n_threads: int) -> list[list[Hit]]:
        # Excluded passages may all rank on top, so ask for that many more, then filter.
        fetch = min(k + len(exclude), len(self.passages))
        tokens = _tokenize(self._bm25s, queries, self.settings, False)

        def one(query_tokens: list[str]) -> list[Hit]:
            indices, scores = self._top(query_tokens, fetch)
            return self._hits(indices, scores, k, exclude)

        if n_threads > 0 and len(queries) > 1:
            with ThreadPoolExecutor(max_workers=n_threads) as pool:
                return list(pool.map(one, tokens))
        return [one(t) for t in tokens]

    def _top(self, query_tokens: list[str], fetch: int) -> tuple[np.ndarray, np.ndarray]:
        """Corpus positions and scores of the `fetch` best passages with a positive score, best first,
        equal scores in corpus order (also at the cut: ties for the last place go to the earliest).

        bm25s scores every passage; its own top-k selection then partitions the whole score array,
        which numpy does very slowly when most scores are 0 (~1 s per query at 1M passages). Only
        passages sharing a token with the query can be hits, so selecting among those is the same
        answer, ~100 times sooner.
        """
        ids = self._engine.get_tokens_ids(query_tokens)
        if not ids:  # no query token is in the vocabulary
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        scores = self._engine.get_scores_from_ids(ids)
        candidates = np.flatnonzero(scores > 0)
        values = scores[candidates]
        if len(candidates) > fetch:
            cut = -np.partition(-values, fetch - 1)[fetch - 1]  # the fetch-th best score
            above = np.flatnonzero(values > cut)
            tied = np.flatnonzero(values == cut)[:fetch - len(above)]
            keep = np.concatenate([above, tied])
            candidates, values = candidates[keep], values[keep]
        order = np.lexsort((candidates, -values))
        return candidates[order], values[order]

    def _hits(self, indices: np.ndarray, scores: np.ndarray, k: int, exclude: Collection[str]) -> list[Hit]:
        hits = []
        for i, score in zip(indices.tolist(), scores.tolist()):
            passage = self.passages[i]
            if passage.id in exclude:
                continue
            hits.append(Hit(passage, score, self.name))
            if len(hits) == k:
                break
        return hits


def _tokenize(bm25s: ModuleType, texts: list[str], settings: BM25Settings, show_progress: bool) -> Any:
    try:
        # Plain token lists, not bm25s's id form: retrieve would only map the ids back to strings.
        return bm25s.tokenize(texts, stopwords=settings.stopwords, return_ids=False,
                              show_progress=show_progress)
    except ValueError as exc:  # bm25s's only ValueError here is an unknown stopword list
        raise ConfigError(f"BM25 stopwords {settings.stopwords!r}: {exc}") from None

