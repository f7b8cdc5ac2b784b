"""A retriever that asks a retrieval service over HTTP (`metarag serve-retriever`, `retrieve/service.py`).

Many evaluation workers then share one loaded index. Standard library only (urllib): no extra to
install on the workers' side.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Collection, Sequence
from typing import Any

from metarag.errors import BackendError, ConfigError, retrying
from metarag.records import Hit, Passage
from metarag.retrieve.store import LRUCache, cached_search

# Worth another try: the server restarting, overloaded or behind a proxy that timed out.
RETRYABLE_STATUS = (429, 500, 502, 503, 504)


class RemoteRetriever:
    """Hits from the retrieval service at `url` (`POST {url}/retrieve`), as if the index were local.

    A request that cannot reach the service, times out or gets a 5xx/429 answer is tried again up to
    `max_retries` times, waiting `backoff_s`, then twice that, and so on; after that (or at once for
    a 4xx answer, which a retry would not change) BackendError names the URL and the reason.
    Hits carry the name of the retriever the service runs. The last `cache_size` answers are kept.
    A batch the service refuses for its size (`serve-retriever --set max_queries=...`, `max_hits`,
    `max_body_bytes`) is sent again as several requests that each fit, in order, so no caller has to
    know the limits: they are read from the service's `/health` at the first such refusal (the
    service's defaults when it does not report them), and later batches are cut before sending.
    """

    name = "remote"

    def __init__(self, url: str, timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5, *,
                 cache_size: int = 1024):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"remote retriever URL must start with http:// or https://, got {url!r}")
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ConfigError("remote retriever needs timeout_s > 0, max_retries >= 0 and backoff_s >= 0")
        base = url.rstrip("/")
        # Accept the endpoint's own URL too, as Search-R1-style agents are configured with it.
        self.url = base.removesuffix("/retrieve")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.cache: LRUCache[tuple[str, int, frozenset[str]], tuple[Hit, ...]] = LRUCache(cache_size)
        self._limits: dict[str, int] | None = None  # the service's, from its first /health answer

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k best passages for `query` by the service's retriever, skipping ids in `exclude`."""
        return self.search_many([query], k, exclude)[0]

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        """`search` for each of `queries`, in one request."""
        if k <= 0 or not queries:
            return [[] for _ in queries]
        excluded = frozenset(exclude)
        return cached_search(self.cache, queries, k, excluded, lambda missing: self._retrieve(missing, k, excluded))

    def health(self) -> dict[str, Any]:
        """The service's `GET /health` answer (retriever name, passage count, corpus fingerprint)."""
        answer = self._call("GET", "/health", None)
        if not isinstance(answer, dict):
            raise BackendError(f"retrieval service at {self.url}: /health answered {answer!r}")
        return answer

    def check(self, timeout_s: float = 5.0) -> None:
        """Fail in seconds when the service is down or hung, before a run spends minutes of retries
        per question: one `GET /health`, no retry, at most `timeout_s`."""
        self._call("GET", "/health", None, attempts=1, timeout_s=min(timeout_s, self.timeout_s))

    def corpus_fingerprint(self) -> str | None:
        """The fingerprint of the corpus the service searches (`data.corpus.corpus_fingerprint`), as its
        /health reports it; None from a service that does not (an older metarag's, another server)."""
        reported = self.health().get("corpus_fingerprint")
        return reported if isinstance(reported, str) and reported else None

    def limits(self) -> dict[str, int]:
        """The service's request limits (its `/health` answer's, asked once; the service's defaults
        for one that does not report them)."""
        if self._limits is None:
            from metarag.retrieve.service import LIMITS

            reported = self.health().get("limits")
            defaults = {"max_queries": LIMITS.max_queries, "max_hits": LIMITS.max_hits,
                        "max_body_bytes": LIMITS.max_body_bytes}
            self._limits = {key: int(reported[key]) if isinstance(reported, dict) and isinstance(
                reported.get(key), int) and reported[key] > 0 else value for key, value in defaults.items()}
        return self._limits

    def _retrieve(self, queries: list[str], k: int, exclude: frozenset[str]) -> list[list[Hit]]:
        """One request; when the service refuses it for its size (413, or 422 over a count) and the
        limits it reports would split it, the pieces, one request each, in order."""
        chunks = self._chunks(queries, k, exclude) if self._limits is not None else [queries]
        if len(chunks) == 1:
            try:
                return self._request(queries, k, exclude)
            except BackendError as exc:
                if self._limits is not None or not _over_a_limit(exc):
                    raise
                chunks = self._chunks(queries, k, exclude)  # reads the limits
                if len(chunks) == 1:
                    raise
        out: list[list[Hit]] = []
        for chunk in chunks:
            out += self._request(chunk, k, exclude)
        return out

    def _chunks(self, queries: list[str], k: int, exclude: frozenset[str]) -> list[list[str]]:
        """`queries` cut, in order, into runs that each fit the service's limits: at most
        `max_queries` queries and `max_hits` hits (queries x k), and a body under `max_body_bytes`.
        One query that alone breaks a limit goes alone, and the service names what it breaks."""
        limits = self.limits()
        per_request = max(1, min(limits["max_queries"], limits["max_hits"] // max(k, 1)))
        excluded = len(json.dumps(sorted(exclude))) + 2 if exclude else 0  # the query's own copy, a comma
        room = limits["max_body_bytes"] - 64  # the braces, the keys and topk
        chunks: list[list[str]] = [[]]
        size = 0
        for query in queries:
            cost = len(json.dumps(query)) + 2 + excluded
            if chunks[-1] and (len(chunks[-1]) >= per_request or size + cost > room):
                chunks.append([])
                size = 0
            chunks[-1].append(query)
            size += cost
        return chunks

    def _request(self, queries: list[str], k: int, exclude: frozenset[str]) -> list[list[Hit]]:
        body: dict[str, Any] = {"queries": queries, "topk": k}
        if exclude:
            body["exclude"] = [sorted(exclude)] * len(queries)
        answer = self._call("POST", "/retrieve", body)
        try:
            rows = answer["result"]
            if not isinstance(rows, list) or len(rows) != len(queries):
                raise ValueError(f"expected {len(queries)} result lists")
            name = str(answer.get("retriever", self.name))
            return [[Hit(Passage(str(h["id"]), str(h["title"]), str(h["text"])), float(h["score"]), name)
                     for h in row] for row in rows]
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"retrieval service at {self.url} answered in an unexpected shape: {exc!r}") from None

    def _call(self, method: str, path: str, body: dict[str, Any] | None, *, attempts: int | None = None,
              timeout_s: float | None = None) -> Any:
        """The JSON answer of one request, tried again with backoff when the failure may pass."""
        url = self.url + path
        data = None if body is None else json.dumps(body).encode()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s

        def attempt() -> Any:
            request = urllib.request.Request(url, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as exc:  # the service answered, with an error status
                message = _error_message(exc)
                if exc.code not in RETRYABLE_STATUS:
                    raise BackendError(f"retrieval service at {url} refused the request: HTTP {exc.code}: "
                                       f"{message}") from None
                raise BackendError(f"HTTP {exc.code}: {message}", retryable=True) from None
            except urllib.error.URLError as exc:  # refused, unknown host, ...
                raise BackendError(str(exc.reason), retryable=True) from None
            except (TimeoutError, ConnectionError) as exc:  # timed out or dropped mid-answer
                raise BackendError(f"{type(exc).__name__}: {exc}", retryable=True) from None
            try:
                return json.loads(payload)
            except ValueError:
                raise BackendError(f"retrieval service at {url} answered with something other than JSON: "
                                   f"{payload[:200]!r}") from None

        return retrying(attempt, tries=self.max_retries + 1 if attempts is None else attempts,
                        backoff_s=self.backoff_s, failed=f"retrieval service at {url} failed")


def _over_a_limit(exc: BackendError) -> bool:
    """Whether the service refused a request for its size: a body over its limit (413), or more
    queries or hits than it takes (422); not a bad topk or a too-long query, which no split mends."""
    text = str(exc)
    return "HTTP 413" in text or ("HTTP 422" in text and ("queries per request" in text or "hits per request" in text))


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The service's own message from an error answer ({"error": ...}), else its raw start."""
    try:
        raw = exc.read()
    except OSError:
        return exc.reason if isinstance(exc.reason, str) else ""
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw[:200].decode(errors="replace")
    if isinstance(payload, dict) and "error" in payload:
        return str(payload["error"])
    return raw[:200].decode(errors="replace")
