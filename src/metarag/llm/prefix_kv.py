"""The key/value states of sequences the transformers back-end already ran, kept one row at a time,
so that a request extending one runs only its new tokens: an agent's next turn (its prompt, its own
output, then the retrieved passages), the belief probe of a longer history, the G rollouts of one
question (their shared instructions and question). llama.cpp's server does the same with its slot
prefix cache; `HFLLM` had none, so every turn of a rollout ran its whole history through the model
again.

`PrefixKV.match` finds the stored sequence sharing the longest prefix with a request (at most all but
its last token: the request's next-token logits need one token run); `put` stores a sequence's
states, dropping the stored sequences it extends and then the least recently used ones beyond
`max_tokens`. The states are the model's own (whatever dtype its attention produced), copied out of
the batch they were computed in, so a stored row holds no batch alive.

A row whose prefix comes from the store gets the same positions and attends to the same keys as a
fresh pass, so its logits equal a fresh pass's up to float rounding (a matmul over a different batch
shape sums in another order; tests compare them). The store belongs to one set of weights: `HFLLM`
clears it when its identity is assigned again (a trainer's new checkpoint) and a trainer builds a
new `HFLLM` every step.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Stored:
    """One sequence's token ids and, per layer, its (keys, values), each [kv heads, tokens, head dim]."""

    ids: np.ndarray
    kv: list[tuple[Any, Any]]


class PrefixKV:
    """A least-recently-used store of per-row key/value states, at most `max_tokens` tokens in all.
    `reused` and `computed` count prompt tokens served from the store and run through the model."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._rows: OrderedDict[bytes, Stored] = OrderedDict()
        self._tokens = 0
        self.reused = 0
        self.computed = 0

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def tokens(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._rows.clear()
        self._tokens = 0

    def match(self, row: Sequence[int]) -> tuple[int, Stored | None]:
        """The longest stored prefix of `row` (never all of it) and the stored row it comes from."""
        ids = np.asarray(row, dtype=np.int64)
        best, found, key = 0, None, None
        for k, stored in self._rows.items():
            n = common_prefix(stored.ids, ids)
            if n > best:
                best, found, key = n, stored, k
        best = min(best, len(ids) - 1)
        if found is None or best <= 0:
            return 0, None
        self._rows.move_to_end(key)
        return best, found

    def put(self, ids: Sequence[int], kv: list[tuple[Any, Any]]) -> None:
        """Store a sequence's states (a sequence longer than the whole store is not kept)."""
        arr = np.asarray(ids, dtype=np.int64)
        if not len(arr) or len(arr) > self.max_tokens:
            return
        for k, stored in list(self._rows.items()):  # a stored prefix of this sequence adds nothing now
            if len(stored.ids) <= len(arr) and common_prefix(stored.ids, arr) == len(stored.ids):
                self._drop(k)
            elif len(stored.ids) > len(arr) and common_prefix(stored.ids, arr) == len(arr):
                self._rows.move_to_end(k)  # this sequence is a prefix of a stored one: nothing to add
                return
        key = arr.tobytes()
        self._rows[key] = Stored(arr, kv)
        self._tokens += len(arr)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._rows)))

    def _drop(self, key: bytes) -> None:
        self._tokens -= len(self._rows.pop(key).ids)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids two id arrays share."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m
