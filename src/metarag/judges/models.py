"""Judges backed by a user's own model directory, for the slots where the papers used a dedicated
model (an NLI cross-encoder, an extractive QA expert). No such weights exist offline, so these are
opt-in by path; the LLM-based judges are the defaults."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from metarag.errors import ConfigError, MissingDependency
from metarag.judges.base import Verdict
from metarag.judges.llm_judges import ExpertQA, YesNoJudge, llm_entailment
from metarag.settings import check_ranges, setting


@dataclass(frozen=True)
class CrossEncoderEntailment:
    """P(entailment) from a sentence-transformers NLI CrossEncoder directory (labels read from its
    config's id2label); premise = passages + rationale, hypothesis = "The answer to Q is A"."""

    path: str
    threshold: float = setting(0.5, ge=0, le=1)
    name: str = "entailment"

    def __post_init__(self) -> None:
        check_ranges(self)

    def judge(self, inputs: Mapping[str, str]) -> Verdict:
        model, index = _cross_encoder(self.path)
        premise = f"{inputs.get('passages', '')}\n{inputs.get('rationale', '')}".strip()
        hypothesis = f"The answer to \"{inputs['question']}\" is {inputs['answer']}."
        probs = model.predict([(premise, hypothesis)], apply_softmax=True)[0]
        p = float(probs[index])
        return Verdict("entailed" if p >= self.threshold else "not-entailed", p)


@dataclass(frozen=True)
class ExtractiveExpert:
    """A Hugging Face extractive-QA model directory as MetaRAG's expert."""

    path: str
    name: str = "expert"

    def judge(self, inputs: Mapping[str, str]) -> Verdict:
        result = _qa_pipeline(self.path)(question=inputs["question"], context=inputs["passages"])
        return Verdict(str(result.get("answer", "")).strip(), float(result.get("score", 0.0)))


def make_entailment(spec: str, threshold: float = 0.5):
    """'llm' or 'cross-encoder:PATH'."""
    if spec == "llm":
        return llm_entailment(threshold)
    if spec.startswith("cross-encoder:"):
        from metarag.rerank.pointwise import check_cross_encoder_folder

        # the reranker's check: a bi-encoder folder would load with a random head and judge by noise
        return CrossEncoderEntailment(str(check_cross_encoder_folder(spec.split(":", 1)[1])), threshold)
    raise ConfigError(f"unknown entailment judge {spec!r}; valid: llm, cross-encoder:PATH")


def make_expert(spec: str):
    """'llm' or 'qa:PATH'."""
    if spec == "llm":
        return ExpertQA()
    if spec.startswith("qa:"):
        return ExtractiveExpert(str(_existing(spec.split(":", 1)[1], "extractive QA model")))
    raise ConfigError(f"unknown expert {spec!r}; valid: llm, qa:PATH")


def _existing(path: str, what: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir() or not (folder / "config.json").exists():
        raise ConfigError(f"{what} {path!r} is not a model directory (no config.json there)")
    return folder


@lru_cache(maxsize=4)
def _cross_encoder(path: str):
    from metarag.rerank.pointwise import _load_cross_encoder

    model = _load_cross_encoder(Path(path), None)
    labels = {int(k): str(v).lower() for k, v in model.model.config.id2label.items()}
    index = next((i for i, label in labels.items() if label.startswith("entail")), None)
    if index is None:
        raise ConfigError(f"{path} is not an NLI cross-encoder: its labels are {sorted(labels.values())}")
    return model, index


@lru_cache(maxsize=2)
def _qa_pipeline(path: str):
    try:
        from transformers import pipeline
    except ModuleNotFoundError:
        raise MissingDependency("transformers", "embedded") from None
    return pipeline("question-answering", model=path, tokenizer=path, device=-1)


__all__ = ["CrossEncoderEntailment", "ExtractiveExpert", "YesNoJudge", "make_entailment", "make_expert"]
