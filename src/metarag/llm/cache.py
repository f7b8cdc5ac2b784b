"""A persistent response cache in front of any LLM, so re-running an experiment costs no LLM time.

Keyed by the back-end's model identity (file sha256, server model name, a trained checkpoint's
hash), the request kind, the prompt and every decoding setting, the seed included: a sampled request
is served only to the same seed on the same weights. A hit returns the stored text with its original
token counts, `cache_hits=1` and the lookup's own latency. `LLMSpec(response_cache=False)`
(`--no-response-cache`) runs without it.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from metarag.errors import DataError
from metarag.llm.base import LLM, Decoding, Prompt, TokenIds, as_messages, is_raw
from metarag.llm.batch import generate_many, score_many
from metarag.paths import metarag_home
from metarag.records import Completion, LabelScores, Message, from_plain, to_plain


class ResponseCache:
    """A sqlite key-value store of LLM responses, safe to share between worker threads."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else metarag_home() / "responses.sqlite"
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.commit()
        except (sqlite3.Error, OSError) as exc:  # a damaged or foreign file, a folder, no permission
            raise DataError(f"the response cache cannot be opened ({exc}); it only holds cached answers: "
                            "move it away, or run with --no-cache", path=str(self.path)) from None

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
    payload = {"model": identity, "op": op, "prompt": _plain_prompt(prompt), "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# The Decoding fields of the cache's first version: always in a key. A field added since keys only
# when it is off its default, so the answers stored before it existed are still found.
_FIRST_FIELDS = ("max_tokens", "stop", "temperature", "seed", "logprobs")


# What a stored answer holds changed twice with the token-level protocol; answers stored before
# cannot stand for the new ones: label probabilities were of each label's first token (now whole
# labels, summed over variants), and per-token data had no ids, offsets or entropy.
_LABEL_RULE = "whole-label"
_TOKEN_FORMAT = 2


def decoding_settings(decoding: Decoding) -> dict[str, Any]:
    """Every decoding field that can change an answer, as the key sees it."""
    defaults = {f.name: f.default for f in fields(decoding)}
    settings = {name: value for name, value in asdict(decoding).items()
                if name in _FIRST_FIELDS or value != defaults[name]}
    if decoding.wants_tokens:
        settings["token_format"] = _TOKEN_FORMAT
    return settings


def label_settings(labels: Sequence[str]) -> dict[str, Any]:
    """The key settings of a label-scoring request: its labels and the scoring rule."""
    return {"labels": list(labels), "rule": _LABEL_RULE}


def _cacheable(decoding: Decoding) -> bool:
    """Attention weights and hidden states are live tensors, never stored: such a request goes to the model."""
    return not (decoding.attentions or decoding.hidden_states)


def _op(prompt: Prompt) -> str:
    """The request kind, as `complete` and `chat` key it: token ids and raw text are completions."""
    return "complete" if isinstance(prompt, TokenIds) or is_raw(as_messages(prompt)) else "chat"


def _plain_prompt(prompt: Any) -> Any:
    if isinstance(prompt, str):
        return to_plain(as_messages(prompt))
    return to_plain(prompt if isinstance(prompt, tuple | list) else [prompt])


class CachedLLM:
    """Wraps an LLM with a ResponseCache; same protocol, same identity."""

    def __init__(self, inner: LLM, cache: ResponseCache):
        self.inner, self.cache = inner, cache

    @property
    def identity(self) -> str:
        """The inner back-end's, read at every request: a live model being trained changes its
        identity with its weights, and a stale one would serve the old checkpoint's answers."""
        return self.inner.identity

    def complete(self, prompt: str, decoding: Decoding = Decoding()) -> Completion:
        return self._generation("complete", prompt, decoding, lambda: self.inner.complete(prompt, decoding))

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        return self._generation("chat", messages, decoding, lambda: self.inner.chat(messages, decoding))

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        start = time.perf_counter()
        key = request_key(self.identity, "score_labels", prompt, label_settings(labels))
        stored = self.cache.get(key)
        if stored is not None:
            scores = from_plain(LabelScores, stored)
            return replace(scores, usage=_as_hit(scores.usage, time.perf_counter() - start))
        scores = self.inner.score_labels(prompt, labels)
        self.cache.put(key, to_plain(scores))
        return scores

    def generate_many(self, prompts: Sequence[Prompt], decodings: Sequence[Decoding], *,
                      workers: int = 1) -> list[Completion | Exception]:
        """`batch.generate_many` through the cache: hits answered here, the misses sent to the
        back-end as one batch and stored."""
        keys = [request_key(self.identity, _op(p), p, decoding_settings(d)) if _cacheable(d) else None
                for p, d in zip(prompts, decodings)]
        out, misses = self._lookup(Completion, keys)
        fresh = generate_many(self.inner, [prompts[i] for i in misses], [decodings[i] for i in misses],
                              workers=workers)
        return self._store(keys, out, misses, fresh)

    def score_many(self, prompts: Sequence[Prompt], labels: Sequence[Sequence[str]], *,
                   workers: int = 1) -> list[LabelScores | Exception]:
        """`batch.score_many` through the cache."""
        keys = [request_key(self.identity, "score_labels", p, label_settings(ls)) for p, ls in zip(prompts, labels)]
        out, misses = self._lookup(LabelScores, keys)
        fresh = score_many(self.inner, [prompts[i] for i in misses], [labels[i] for i in misses], workers=workers)
        return self._store(keys, out, misses, fresh)

    def _lookup(self, record: type, keys: list[str | None]) -> tuple[list, list[int]]:
        out: list = [None] * len(keys)
        misses = []
        for i, key in enumerate(keys):
            start = time.perf_counter()
            stored = None if key is None else self.cache.get(key)
            if stored is None:
                misses.append(i)
            else:
                value = from_plain(record, stored)
                out[i] = replace(value, usage=_as_hit(value.usage, time.perf_counter() - start))
        return out, misses

    def _store(self, keys: list[str | None], out: list, misses: list[int], fresh: list) -> list:
        for i, result in zip(misses, fresh):
            if keys[i] is not None and not isinstance(result, Exception):
                self.cache.put(keys[i], to_plain(result))
            out[i] = result
        return out

    def _generation(self, op: str, prompt: Prompt, decoding: Decoding, call) -> Completion:
        if not _cacheable(decoding):
            return call()
        start = time.perf_counter()
        key = request_key(self.identity, op, prompt, decoding_settings(decoding))
        stored = self.cache.get(key)
        if stored is not None:
            completion = from_plain(Completion, stored)
            return replace(completion, usage=_as_hit(completion.usage, time.perf_counter() - start))
        completion = call()
        self.cache.put(key, to_plain(completion))
        return completion

    def __getattr__(self, name):  # expose back-end extras (e.g. tokenizer counts) unchanged
        if name in _UNCACHED_BATCH:  # reached through metarag.llm.batch only, so they pass the cache
            raise AttributeError(f"{name}: send batches through metarag.llm.batch, which consults the cache")
        return getattr(self.inner, name)


_UNCACHED_BATCH = ("generate_batch", "score_labels_batch")


def _as_hit(usage, latency):
    return replace(usage, latency_s=latency, cache_hits=1, llm_requests=1)
