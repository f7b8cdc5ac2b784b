"""A persistent response cache in front of any LLM, so re-running an experiment costs no LLM time.

Keyed by the back-end's model identity (file sha256 or server model name), the request kind, the
prompt and every decoding setting. A hit returns the stored text with its original token counts,
`cache_hits=1` and the lookup's own latency.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from metarag.llm.base import LLM, Decoding, Prompt, as_messages
from metarag.paths import metarag_home
from metarag.records import Completion, LabelScores, Message, from_plain, to_plain


class ResponseCache:
    """A sqlite key-value store of LLM responses, safe to share between worker threads."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else metarag_home() / "responses.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?)", (key, json.dumps(value)))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def request_key(identity: str, op: str, prompt: Prompt, settings: dict) -> str:
    """The cache key of one request: everything that can change the model's answer."""
    payload = {"model": identity, "op": op, "prompt": to_plain(as_messages(prompt)), "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class CachedLLM:
    """Wraps an LLM with a ResponseCache; same protocol, same identity."""

    def __init__(self, inner: LLM, cache: ResponseCache):
        self.inner, self.cache = inner, cache
        self.identity = inner.identity

    def complete(self, prompt: str, decoding: Decoding = Decoding()) -> Completion:
        return self._generation("complete", prompt, decoding, lambda: self.inner.complete(prompt, decoding))

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        return self._generation("chat", messages, decoding, lambda: self.inner.chat(messages, decoding))

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        start = time.perf_counter()
        key = request_key(self.identity, "score_labels", prompt, {"labels": list(labels)})
        stored = self.cache.get(key)
        if stored is not None:
            scores = from_plain(LabelScores, stored)
            return replace(scores, usage=_as_hit(scores.usage, time.perf_counter() - start))
        scores = self.inner.score_labels(prompt, labels)
        self.cache.put(key, to_plain(scores))
        return scores

    def _generation(self, op: str, prompt: Prompt, decoding: Decoding, call) -> Completion:
        start = time.perf_counter()
        key = request_key(self.identity, op, prompt, asdict(decoding))
        stored = self.cache.get(key)
        if stored is not None:
            completion = from_plain(Completion, stored)
            return replace(completion, usage=_as_hit(completion.usage, time.perf_counter() - start))
        completion = call()
        self.cache.put(key, to_plain(completion))
        return completion

    def __getattr__(self, name):  # expose back-end extras (e.g. tokenizer counts) unchanged
        return getattr(self.inner, name)


def _as_hit(usage, latency):
    return replace(usage, latency_s=latency, cache_hits=1, llm_requests=1)
