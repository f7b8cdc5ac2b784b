"""What the saved retrievers (`bm25.py`, `dense.py`) keep beside their rows and reuse within a run:
the index metadata file (`metarag.json`: which passages the rows are, the settings built with) and a
thread-safe LRU cache of hits by (query, k, exclude). Below `index.py`, which opens, builds and
fingerprints whole index folders through the retrievers."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from metarag.data.corpus import ids_fingerprint
from metarag.errors import ConfigError, DataError
from metarag.records import Hit, Passage

META_FILE = "metarag.json"
S = TypeVar("S")


# ------------------------------------------------------------------------ saved index metadata
def write_meta(directory: Path, passages: Sequence[Passage], **fields: Any) -> None:
    """Write `metarag.json`: which passages the index rows are (count, ids digest) and `fields`."""
    meta = {"passages": len(passages), "ids_sha256": ids_fingerprint(passages), **fields}
    (directory / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def saved_settings(directory: Path, meta: Mapping[str, Any], cls: type[S], given: S | None,
                   index_fields: Callable[[S], Any], what: str) -> S:
    """The settings an index is opened with: those saved in its `meta` when `given` is None, else
    `given`, after checking that what the index was built with (`index_fields`) is the same."""
    try:
        saved = cls(**meta["settings"])
    except (KeyError, TypeError) as exc:
        raise DataError(f"unreadable {what} settings: {exc}", path=str(directory)) from None
    if given is None:
        return saved
    if index_fields(given) != index_fields(saved):
        raise DataError(f"the {what} index was built with {index_fields(saved)}, not {index_fields(given)}",
                        path=str(directory))
    return given


def read_meta(directory: Path, passages: Sequence[Passage]) -> dict[str, Any]:
    """`metarag.json` of a saved index, after checking its rows are `passages`, in order."""
    path = directory / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("not a saved metarag index (no metarag.json)", path=str(directory)) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable index metadata: {exc}", path=str(path)) from None
    if not isinstance(meta, dict):
        raise DataError("unreadable index metadata: expected a JSON object", path=str(path))
    if meta.get("passages") != len(passages) or meta.get("ids_sha256") != ids_fingerprint(passages):
        raise DataError(f"the index was built over other passages ({meta.get('passages')} indexed, "
                        f"{len(passages)} given, or other ids)", path=str(directory))
    return meta


# ------------------------------------------------------------------------------ within-run caches
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """The `size` most recently used values by key, for repeats within a run; size 0 keeps none.

    Thread-safe: a served retriever answers several requests at once.
    """

    def __init__(self, size: int):
        if size < 0:
            raise ConfigError(f"cache size must be >= 0, got {size}")
        self.size = size
        self.hits = 0
        self.misses = 0
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value stored under `key` (now the most recent), or None."""
        with self._lock:
            value = self._values.get(key)
            if value is None:
                self.misses += 1
                return None
            self._values.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: K, value: V) -> None:
        """Store `value`, dropping the least recently used value beyond `size`."""
        if self.size == 0:
            return
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._values)


def cached_search(cache: LRUCache[tuple[str, int, frozenset[str]], tuple[Hit, ...]], queries: Sequence[str],
                  k: int, exclude: Collection[str],
                  search: Callable[[list[str]], list[list[Hit]]]) -> list[list[Hit]]:
    """Hits for each query from `cache` where it has them (same query, k and exclude), the rest from
    one call of `search` on the distinct missing queries, which are then cached."""
    excluded = frozenset(exclude)
    found: dict[str, list[Hit]] = {}
    missing: dict[str, None] = {}  # insertion-ordered set: each distinct query searched once
    for query in queries:
        if query in found or query in missing:
            continue
        cached = cache.get((query, k, excluded))
        if cached is None:
            missing[query] = None
        else:
            found[query] = list(cached)
    if missing:
        for query, hits in zip(missing, search(list(missing))):
            cache.put((query, k, excluded), tuple(hits))
            found[query] = hits
    # Each query gets its own list: a caller editing one must not change another's or the cache's.
    return [list(found[query]) for query in queries]
