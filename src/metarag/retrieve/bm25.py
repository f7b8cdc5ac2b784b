"""Sparse retrieval: BM25 over a corpus with bm25s (Lucene scoring), built, saved and loaded.

`retrieve/index.py` decides when to build or reuse; this module only knows one index folder.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from metarag.errors import ConfigError, DataError, MissingDependency, close_matches
from metarag.records import Hit, Passage
from metarag.retrieve.index import read_meta, write_meta

BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


@dataclass(frozen=True)
class BM25Settings:
    """How a BM25 index tokenizes and scores; defaults are Pyserini's (Lucene BM25, k1=0.9, b=0.4).

    The MetaRAG reproducibility study retrieved with Pyserini's BM25, whose defaults these are.
    `stopwords` names a bm25s stopword list ("en") or is None. No stemming (Pyserini stems with
    Porter): it would need PyStemmer, and the index stays dependency-light without it.
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stopwords: str | None = "en"

    def __post_init__(self) -> None:
        if self.method not in BM25_METHODS:
            hint = close_matches(self.method, BM25_METHODS)
            raise ConfigError(f"unknown BM25 method {self.method!r}{hint}")
        if self.k1 < 0:
            raise ConfigError(f"BM25 k1 must be >= 0, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise ConfigError(f"BM25 b must be within [0, 1], got {self.b}")


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
    equal scores in corpus order (which of several passages tied for the k-th place get in is
    bm25s's choice).
    """

    name = "bm25"

    def __init__(self, passages: Sequence[Passage], engine: Any, settings: BM25Settings):
        self.passages = list(passages)
        self.settings = settings
        # Where the index is saved, once it is (set by `load` and by `open_bm25`).
        self.index_dir: Path | None = None
        self._engine = engine
        self._bm25s = _import_bm25s()
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
             mmap: bool = True) -> BM25Retriever:
        """The index saved in `directory`, over `passages` (the same ones, in the same order).

        The score arrays are memory-mapped by default, so loading is quick and pages in on use.
        """
        bm25s = _import_bm25s()
        directory = Path(directory)
        meta = read_meta(directory, passages)
        try:
            settings = BM25Settings(**meta["settings"])
        except (KeyError, TypeError) as exc:
            raise DataError(f"unreadable BM25 settings: {exc}", path=str(directory)) from None
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
        """`search` for each of `queries` (all skipping `exclude`), in one bm25s call.

        `n_threads` > 0 scores in bm25s's thread pool; the default scores in this thread, which is
        faster for one query and on few cores.
        """
        if k <= 0 or not queries:
            return [[] for _ in queries]
        if not isinstance(exclude, (set, frozenset)):
            exclude = set(exclude)
        # Excluded passages may all rank on top, so ask for that many more, then filter.
        fetch = min(k + len(exclude), len(self.passages))
        tokens = _tokenize(self._bm25s, list(queries), self.settings, False)
        indices, scores = self._engine.retrieve(tokens, k=fetch, show_progress=False, n_threads=n_threads)
        return [self._hits(row, row_scores, k, exclude) for row, row_scores in zip(indices, scores)]

    def _hits(self, indices: Any, scores: Any, k: int, exclude: Collection[str]) -> list[Hit]:
        # bm25s breaks ties arbitrarily; re-sort so equal scores keep corpus order.
        ranked = sorted(zip(scores.tolist(), indices.tolist()), key=lambda item: (-item[0], item[1]))
        hits = []
        for score, i in ranked:
            if score <= 0:  # no query token in this passage (and none in any after it)
                break
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

