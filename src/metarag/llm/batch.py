"""Many model requests to one back-end at once: `run_many` sends each round's pending Ask and Probe
actions here. A back-end with `generate_batch` / `score_labels_batch` (transformers: one padded
batch) gets them in one call; otherwise, with `workers` > 1, they go concurrently from a thread
pool (an OpenAI-compatible server with parallel slots); otherwise in turn. A failed request fails
only its own place in the result, which then holds the exception: a back-end with `check_prompt(prompt)`
has each prompt checked alone first (too long for the context, a template error) and only those that
pass batched; a batched call that still fails is split in halves, down to single requests, so only the
request at fault fails.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from metarag.errors import BackendError
from metarag.llm.base import LLM, Decoding, Prompt, generate
from metarag.records import Completion, LabelScores

T = TypeVar("T")
log = logging.getLogger(__name__)


def generate_many(llm: LLM, prompts: Sequence[Prompt], decodings: Sequence[Decoding], *,
                  workers: int = 1) -> list[Completion | Exception]:
    """One completion (or the exception that stopped it) per prompt, in order."""
    if len(prompts) != len(decodings):
        raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
    if not prompts:
        return []
    own = getattr(llm, "generate_many", None)  # a wrapper that batches itself (the response cache answers
    if own is not None:                          # what it holds and sends the rest back here)
        return own(prompts, decodings, workers=workers)
    batch = getattr(llm, "generate_batch", None)
    if batch is not None:
        done = _batched(llm, lambda where: batch([prompts[i] for i in where], [decodings[i] for i in where]),
                        prompts, list(range(len(prompts))), "generate_batch")
        return [done[i] for i in range(len(prompts))]
    return _each([partial(generate, llm, p, d) for p, d in zip(prompts, decodings)], workers)


def score_many(llm: LLM, prompts: Sequence[Prompt], labels: Sequence[Sequence[str]], *,
               workers: int = 1) -> list[LabelScores | Exception]:
    """The label scores (or the exception) of each prompt against its own label set, in order. A
    batching back-end gets one `score_labels_batch` call per distinct label set."""
    if len(prompts) != len(labels):
        raise ValueError(f"{len(prompts)} prompts but {len(labels)} label sets")
    if not prompts:
        return []
    own = getattr(llm, "score_many", None)
    if own is not None:
        return own(prompts, labels, workers=workers)
    batch = getattr(llm, "score_labels_batch", None)
    if batch is None:
        return _each([partial(llm.score_labels, p, tuple(ls)) for p, ls in zip(prompts, labels)], workers)
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, label_set in enumerate(labels):
        groups.setdefault(tuple(label_set), []).append(i)
    out: list[LabelScores | Exception] = [BackendError("not scored")] * len(prompts)
    for label_set, where in groups.items():
        scored = _batched(llm, lambda subset, label_set=label_set: batch([prompts[i] for i in subset], label_set),
                          prompts, where, "score_labels_batch")
        for i, result in scored.items():
            out[i] = result
    return out


def _batched(llm: LLM, send: Callable[[list[int]], Sequence[T]], prompts: Sequence[Prompt], where: list[int],
             name: str) -> dict[int, T | Exception]:
    """The requests at `where`, sent as one batched call `send(subset)`. A back-end's `check_prompt`
    first refuses, alone, each prompt it cannot take, so that one bad prompt never fails the batch."""
    check = getattr(llm, "check_prompt", None)
    out: dict[int, T | Exception] = {}
    passed = []
    for i in where:
        refused = _attempt(partial(check, prompts[i])) if check is not None else None
        if isinstance(refused, Exception):
            out[i] = refused
        else:
            passed.append(i)
    out.update(zip(passed, _split(send, passed, name)))
    return out


def _split(send: Callable[[list[int]], Sequence[T]], where: list[int], name: str) -> list[T | Exception]:
    """One batched call over `where`; if it fails, each half again, so that a bad request fails only
    its own place (a single request that fails holds its exception)."""
    if not where:
        return []
    try:
        results = list(send(where))
        if len(results) != len(where):
            raise BackendError(f"{name} returned {len(results)} results for {len(where)} requests")
        return results
    except Exception as exc:  # recorded in each request's trace by the runner, like any failure
        if len(where) == 1:
            return [exc]
        # said, not swallowed: a batch that keeps failing would otherwise run as single requests unseen
        log.warning(f"{name} of {len(where)} requests failed ({type(exc).__name__}: {exc}); trying each half")
    half = len(where) // 2
    return _split(send, where[:half], name) + _split(send, where[half:], name)


def _each(calls: list[Callable[[], T]], workers: int) -> list[T | Exception]:
    if workers <= 1 or len(calls) == 1:
        return [_attempt(call) for call in calls]
    with ThreadPoolExecutor(min(workers, len(calls)), thread_name_prefix="metarag-request") as pool:
        return list(pool.map(_attempt, calls))


def _attempt(call: Callable[[], T]) -> T | Exception:
    try:
        return call()
    except Exception as exc:
        return exc
