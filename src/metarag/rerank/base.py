"""The one reranking verb. Rerankers run after every retrieval round, inside the runner's Search."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from metarag.records import Hit, Usage


@dataclass(frozen=True)
class Reranked:
    """A reranker's output: the top hits in their new order (scores are the reranker's), what it
    cost, and why it kept the input order when it could not do better (None when it reranked)."""

    hits: tuple[Hit, ...]
    usage: Usage = Usage()
    fallback: str | None = None


@runtime_checkable
class Reranker(Protocol):
    """Anything with `rerank` is a reranker; `name` goes into the trace."""

    name: str

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Reranked: ...
