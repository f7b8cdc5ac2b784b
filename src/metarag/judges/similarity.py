"""Answer similarity for MetaRAG's monitor: how close the reasoner's answer is to the expert's.

The original MetaRAG code embeds both answers with all-MiniLM-L6-v2 (mean pooling) and takes their
cosine similarity; `method="minilm"` does the same with the embedded MiniLM. `method="token-f1"`
(SQuAD token F1) needs no model: for tests and for machines without the embedded extra.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from metarag.errors import ConfigError
from metarag.judges.base import Verdict
from metarag.metrics import token_f1
from metarag.settings import check_ranges, setting

METHODS = ("minilm", "token-f1")


@dataclass(frozen=True)
class AnswerSimilarity:
    """Cosine of MiniLM embeddings (or token F1) of inputs `answer` and `reference`; the verdict is
    "accept" when the score is at or above `threshold` (MetaRAG's monitor)."""

    threshold: float = setting(0.4, ge=0, le=1)
    method: str = "minilm"
    name: str = "monitor-similarity"

    def __post_init__(self):
        check_ranges(self)
        if self.method not in METHODS:
            raise ConfigError(f"unknown similarity {self.method!r}; valid: {', '.join(METHODS)}")

    def judge(self, inputs: Mapping[str, str]) -> Verdict:
        answer, reference = inputs["answer"].strip(), inputs["reference"].strip()
        if not answer or not reference:
            score = 0.0
        elif self.method == "token-f1":
            score = token_f1(answer, [reference])
        else:
            a, b = _encoder().encode([answer, reference], normalize_embeddings=True, show_progress_bar=False)
            score = float(np.dot(a, b))
        return Verdict("accept" if score >= self.threshold else "evaluate", score,
                       detail=f"threshold {self.threshold}")


@lru_cache(maxsize=1)
def _encoder():
    from metarag.retrieve.dense import DenseSettings, encoder_path, load_encoder

    return load_encoder(encoder_path(DenseSettings()))
