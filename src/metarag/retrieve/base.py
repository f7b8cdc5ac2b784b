"""The one retrieval verb every back-end implements; methods see nothing else of a retriever."""
from __future__ import annotations

from collections.abc import Collection
from typing import Protocol, runtime_checkable

from metarag.records import Hit


@runtime_checkable
class Retriever(Protocol):
    """Anything with `search` is a retriever. `exclude` holds passage ids the caller has already
    seen; they are skipped and the next best fill the k places."""

    name: str

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]: ...
