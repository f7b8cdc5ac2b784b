"""Pointwise rerankers: each candidate is scored against the question on its own, best kept first.

"A Reproducibility Study of Metacognitive Retrieval-Augmented Generation" (§4.3.4) reranks after
every retrieval round and keeps the top five; its pointwise rerankers are MiniLM, BGE and
ModernBERT cross-encoders. Here: an LLM relevance judge (the offline default: no cross-encoder
weights ship with metarag), any sentence-transformers `CrossEncoder` folder (how those three are
run), and embedding cosine as a cheap baseline.
"""
from __future__ import annotations

import json
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency
from metarag.policy.actions import Action, Probe
from metarag.records import Hit, Message, Passage
from metarag.rerank.base import Reranked
from metarag.settings import check_ranges, setting

# The fixed instruction and the question come first and the passage last, so every candidate's
# prompt shares the same prefix and llama.cpp evaluates only the passage tokens after the first.
JUDGE_PROMPT = ("Does the passage below help answer the question? Answer Yes or No.\n\n"
                "Question: {question}\n\n"
                "Passage: {passage}")
JUDGE_LABELS = ("Yes", "No")


def passage_excerpt(passage: Passage, max_words: int | None = None) -> str:
    """A passage as shown to a reranking model: "title: text", cut to its first `max_words` words."""
    text = f"{passage.title}: {passage.text}" if passage.title else passage.text
    if max_words is None:
        return text
    return " ".join(text.split()[:max_words])


def order_by_scores(name: str, hits: Sequence[Hit], scores: Sequence[float], k: int) -> tuple[Hit, ...]:
    """The top `k` hits by descending score, each carrying its new score; ties keep retrieval order."""
    ranked = sorted(range(len(hits)), key=lambda i: -scores[i])  # sorted() is stable
    return tuple(Hit(hits[i].passage, float(scores[i]), name) for i in ranked[:max(k, 0)])


# --------------------------------------------------------------------------------- LLM judge
@dataclass(frozen=True)
class LLMJudgeSettings:
    """The LLM relevance judge: P("Yes") to "does this passage help answer the question?".

    Pointwise reranking after each retrieval round as in the MetaRAG reproducibility study
    (§4.3.4), with the LLM standing in for its cross-encoders, which need weights metarag cannot
    fetch offline. `max_words` (200) bounds each passage near the 512-token input of those
    cross-encoders; HotpotQA paragraphs are 81 words at the median, so few are cut.
    """

    max_words: int = setting(200, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


class LLMJudgeReranker:
    """Scores each candidate by the LLM's probability of "Yes", renormalized over {Yes, No}.

    A sub-policy: one `Probe` per candidate (purpose "llm-judge"), carried out and recorded by the
    runner like any request of the run. Renormalizing makes scores comparable across passages: the
    raw P(Yes) also moves with the mass the model puts on tokens other than the two labels, which
    says nothing about relevance. A candidate without mass on either label gets `LabelScores.p`'s
    uniform score; if no candidate has any, the retrieval order is kept and `Reranked.fallback`
    says so.
    """

    name = "llm-judge"

    def __init__(self, settings: LLMJudgeSettings = LLMJudgeSettings()):
        self.settings = settings

    def prompt(self, query: str, passage: Passage) -> tuple[Message, ...]:
        """The judge's prompt for one candidate."""
        text = JUDGE_PROMPT.format(question=query, passage=passage_excerpt(passage, self.settings.max_words))
        return (Message("user", text),)

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Generator[Action, Any, Reranked]:
        scores: list[float] = []
        without_mass = 0
        for hit in hits:
            labels = yield Probe(self.name, self.prompt(query, hit.passage), JUDGE_LABELS)
            p_yes, fallback = labels.p("Yes")
            without_mass += fallback is not None
            scores.append(p_yes)
        if hits and without_mass == len(hits):
            return Reranked(tuple(hits[:max(k, 0)]), fallback="the LLM put no probability on Yes or No for any passage")
        return Reranked(order_by_scores(self.name, hits, scores, k))


# ----------------------------------------------------------------------------- cross-encoder
@dataclass(frozen=True)
class CrossEncoderSettings:
    """A sentence-transformers CrossEncoder in a local folder (MiniLM, BGE or ModernBERT rerankers).

    The MetaRAG reproducibility study's pointwise rerankers (§4.3.4) are cross-encoders: MiniLM
    (ms-marco-MiniLM), BGE (bge-reranker) and ModernBERT. `path` is the model folder (model hubs are
    never contacted); `max_length` None keeps the model's own limit (512 tokens for those three).
    """

    path: str
    batch_size: int = setting(32, ge=1)
    max_length: int | None = setting(None, ge=1)

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("the cross-encoder reranker needs a model folder: cross-encoder:PATH")
        check_ranges(self)


def check_cross_encoder_folder(path: str) -> Path:
    """The folder `path` if it holds a cross-encoder (a *ForSequenceClassification model), else an error.

    Checked before loading because sentence-transformers would load a bi-encoder folder (such as
    MiniLM's all-MiniLM-L6-v2) as a cross-encoder with a randomly initialised head, and rank by noise.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"cross-encoder folder {path!r} does not exist or is not a folder "
                          "(model hubs are not used: give the path of a downloaded model)")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise DataError("not a cross-encoder folder: it has no config.json", path=str(folder))
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"unreadable model config: {exc}", path=str(config_file)) from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(architectures, list) or not any(
            isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        raise DataError(f"not a cross-encoder: its architectures are {architectures!r}, a cross-encoder "
                        "has a ...ForSequenceClassification head (is this a bi-encoder?)", path=str(folder))
    return folder.resolve()


class CrossEncoderReranker:
    """Scores each (question, passage) pair with a sentence-transformers CrossEncoder, on CPU."""

    name = "cross-encoder"

    def __init__(self, settings: CrossEncoderSettings):
        self.settings = settings
        self.path = check_cross_encoder_folder(settings.path)
        self._model = _load_cross_encoder(self.path, settings.max_length)

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Reranked:
        if not hits:
            return Reranked(())
        # The cross-encoder truncates to its own token limit, so passages go in whole.
        pairs = [(query, passage_excerpt(hit.passage)) for hit in hits]
        scores = self._model.predict(pairs, batch_size=self.settings.batch_size, show_progress_bar=False,
                                     convert_to_numpy=True)
        if getattr(scores, "ndim", 1) != 1:
            raise DataError(f"the cross-encoder gives {scores.shape[-1]} scores per pair; a reranker "
                            "gives one (num_labels=1)", path=str(self.path))
        return Reranked(order_by_scores(self.name, hits, scores.tolist(), k))


def _load_cross_encoder(path: Path, max_length: int | None) -> Any:
    try:
        from sentence_transformers import CrossEncoder
    except ModuleNotFoundError as exc:
        if exc.name != "sentence_transformers":
            raise
        raise MissingDependency("sentence-transformers", "embedded") from None
    # The model is a local folder; never let the hub client try the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return CrossEncoder(str(path), device="cpu", local_files_only=True, max_length=max_length)
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load the cross-encoder at {path}: {exc}") from None


# ------------------------------------------------------------------------------------ cosine
@dataclass(frozen=True)
class CosineSettings:
    """Embedding cosine between question and passage: the cheap pointwise baseline.

    Defaults to metarag's packaged all-MiniLM-L6-v2 (`encoder` None; else a sentence-transformers
    folder), the MiniLM family the MetaRAG reproducibility study reranks with (§4.3.4), here as a
    bi-encoder since its cross-encoder weights are not available offline.
    """

    encoder: str | None = None
    batch_size: int = setting(64, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


class CosineReranker:
    """Scores each candidate by the cosine of its embedding (title and text) with the question's."""

    name = "cosine"

    def __init__(self, settings: CosineSettings = CosineSettings()):
        from metarag.retrieve.dense import DenseSettings, encoder_path, load_encoder

        self.settings = settings
        self._encoder = load_encoder(encoder_path(DenseSettings(encoder=settings.encoder)))

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Reranked:
        if not hits:
            return Reranked(())
        vectors = self._encoder.encode([query, *(hit.passage.contents() for hit in hits)],
                                       batch_size=self.settings.batch_size, normalize_embeddings=True,
                                       convert_to_numpy=True, show_progress_bar=False)
        scores = vectors[1:] @ vectors[0]
        return Reranked(order_by_scores(self.name, hits, scores.tolist(), k))
