"""The one reranking verb. Rerankers run after every retrieval round, inside the runner's Search.

A reranker that asks the LLM returns a sub-policy (a generator yielding Ask / Probe, returning its
`Reranked`): the runner records each request as a step, then the Rerank step. One with a model of
its own (a cross-encoder, embeddings) returns `Reranked` directly and the runner times it."""
from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from metarag.records import Hit


@dataclass(frozen=True)
class Reranked:
    """A reranker's output: the top hits in their new order (scores are the reranker's) and why it
    kept the input order when it could not do better (None when it reranked). No Usage: its model
    requests are steps of their own, its own compute is the Rerank step's latency."""

    hits: tuple[Hit, ...]
    fallback: str | None = None


@runtime_checkable
class Reranker(Protocol):
    """Anything with `rerank` is a reranker; `name` goes into the trace."""

    name: str

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Reranked | Generator[Any, Any, Reranked]: ...
