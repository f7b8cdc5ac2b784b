"""Adaptive-RAG's query-complexity router (Jeong et al., 2024, §3.3): silver labels from the three
strategies' answers to training questions, a lightweight classifier trained on them, saved and checked
the way SIM-RAG's critic is (`metarag.train.critic`: plain arrays + a manifest naming the encoder).

1. Silver labels (`silver_label`): each training question is answered by the three strategies Adaptive-RAG
   routes to (`adaptive-rag` with its route forced to A, B, C: closed-book, standard-rag, ircot), through
   the evaluation harness (one run folder each, resumable). The label is the cheapest strategy that
   answers it correctly (A before B before C); a question none answers gets its dataset's inductive
   bias: C for a multi-hop dataset, B for a single-hop one (the paper's rule).
2. `train_router`: multinomial logistic regression (class-balanced, scikit-learn) on the MiniLM
   embeddings of the question text; accuracy per class and the share routed to each class on held-out
   questions; saved as `router.npz` (weights as plain arrays) + `manifest.json`, for
   `--set classifier=DIR`. A router only runs with the encoder it was trained with.

Training data must be training data: `check_training_split` (SIM-RAG's rule) refuses evaluation sets.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from metarag import __version__
from metarag.errors import ConfigError, DataError
from metarag.judges.critic import MiniLMFeatures, TextEncoder
from metarag.judges.router import (
    MANIFEST_FILE,
    MODEL_FILE,
    ROUTER_FORMAT,
    ROUTER_KIND,
    ROUTES,
    TrainedRouter,
    load_router,
)
from metarag.methods.adaptive_rag import STRATEGIES
from metarag.metrics import AnswerScores
from metarag.settings import check_ranges
from metarag.train.critic import import_sklearn, training_sets

if TYPE_CHECKING:
    from metarag.evaluate.harness import DatasetSpec
    from metarag.llm.base import LLM
    from metarag.llm.registry import LLMSpec

log = logging.getLogger(__name__)
__all__ = ["ROUTER_FORMAT", "RouterExample", "RouterReport", "RouterTrainSettings", "TrainedRouter", "load_router",
           "run_router_training", "silver_label", "train_router"]

EXAMPLES_FILE = "router_examples.jsonl"
# Formats of multi-hop benchmarks: a question no strategy answers is labelled C there, B elsewhere (§3.3).
MULTI_HOP_FORMATS = frozenset({"hotpotqa", "ircot", "2wiki", "2wiki-hipporag", "musique", "multihop-rag"})


def silver_label(correct: Mapping[str, bool], multi_hop: bool) -> tuple[str, bool]:
    """(label, from_answers): the cheapest route whose strategy answered correctly, else the dataset's
    inductive bias (C multi-hop, B single-hop) with from_answers False."""
    for route in ROUTES:
        if correct.get(route):
            return route, True
    return ("C" if multi_hop else "B"), False


@dataclass(frozen=True)
class RouterExample:
    """One training question, how each strategy did on it, and its silver label."""

    dataset: str
    question_id: str
    question: str
    correct_A: bool
    correct_B: bool
    correct_C: bool
    label: str
    from_answers: bool


@dataclass(frozen=True)
class RouterTrainSettings:
    """How the router is trained: logistic regression with balanced class weights (C = 1.0) on held-out
    20 % of the questions kept out to measure it (the saved router is the one those figures describe).
    label = "em": a strategy is correct when its answer exactly matches a gold alias; "f1": token F1 at or
    above f1_threshold."""

    heldout: float = 0.2
    seed: int = 0
    C: float = 1.0
    label: Literal["em", "f1"] = "em"
    f1_threshold: float = 0.5

    def __post_init__(self) -> None:
        check_ranges(self)
        if not 0.0 <= self.heldout < 1.0:
            raise ConfigError(f"heldout must be in [0, 1), got {self.heldout}")
        if not 0.0 < self.f1_threshold <= 1.0:
            raise ConfigError(f"f1_threshold must be in (0, 1], got {self.f1_threshold}")

    def correct(self, scores: AnswerScores) -> bool:
        return scores.em == 1.0 if self.label == "em" else scores.f1 >= self.f1_threshold


@dataclass(frozen=True)
class RouterReport:
    """What training produced: the labels it learnt from and how it did on held-out questions."""

    path: str
    examples: int
    labels: dict[str, int]
    from_answers: int
    heldout: int
    accuracy: float | None
    accuracy_by_class: dict[str, float | None] = field(default_factory=dict)
    routed_share: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{100 * x:.1f}%"

        lines = [f"router saved in {self.path}",
                 f"silver labels of {self.examples} questions: "
                 + ", ".join(f"{r} ({STRATEGIES[r]}) {self.labels.get(r, 0)}" for r in ROUTES)
                 + f"; {self.from_answers} from the strategies' answers, the rest by the dataset's inductive bias"]
        if self.heldout:
            lines.append(f"held out: {self.heldout} questions; accuracy {pct(self.accuracy)}; by class: "
                         + ", ".join(f"{r} {pct(self.accuracy_by_class.get(r))}" for r in ROUTES))
            lines.append("routed (held out): " + ", ".join(f"{r} {pct(self.routed_share.get(r))}" for r in ROUTES))
        return "\n".join(lines)


def train_router(examples: Sequence[RouterExample], out_dir: str | Path, *, encoder: TextEncoder | None = None,
                 settings: RouterTrainSettings = RouterTrainSettings(),
                 provenance: Mapping[str, Any] | None = None) -> RouterReport:
    """Train the router on `examples` (question -> silver label), measure it on held-out questions, save it."""
    sklearn = import_sklearn()
    from sklearn.linear_model import LogisticRegression

    if not examples:
        raise DataError("no labelled questions to train a router on")
    keys = sorted({(e.dataset, e.question_id) for e in examples})
    random.Random(settings.seed).shuffle(keys)
    n_held = int(np.ceil(settings.heldout * len(keys))) if settings.heldout > 0 and len(keys) > 1 else 0
    held = set(keys[:n_held])
    side = np.array([(e.dataset, e.question_id) in held for e in examples])
    train_idx, held_idx = np.flatnonzero(~side), np.flatnonzero(side)
    labels = np.array([e.label for e in examples])
    present = sorted(set(labels[train_idx].tolist()))
    if len(present) < 2:
        raise DataError(f"every training question has the silver label {present[0] if present else '-'}: a router "
                        "needs at least two classes (train on more questions, or label with f1)")
    encoder = encoder if encoder is not None else MiniLMFeatures()
    features = encoder.encode([e.question for e in examples])
    model = LogisticRegression(C=settings.C, class_weight="balanced", max_iter=2000, random_state=settings.seed)
    model.fit(features[train_idx], labels[train_idx])
    classes = [str(c) for c in model.classes_]
    weights, bias = _softmax_layer(model.coef_, model.intercept_)
    metrics = _heldout(TrainedRouter.from_arrays(weights, bias, classes, encoder), features[held_idx],
                       labels[held_idx])

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # the manifest goes last: no half router is ever readable
    tmp = out / f".{MODEL_FILE}.tmp.npz"
    np.savez(tmp, W0=weights, b0=bias)
    os.replace(tmp, out / MODEL_FILE)
    describe = getattr(encoder, "describe", None)
    counts = Counter(labels.tolist())
    manifest = {
        "format": ROUTER_FORMAT, "kind": ROUTER_KIND,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "metarag_version": __version__, "sklearn_version": sklearn.__version__,
        "classes": classes, "features": int(weights.shape[0]),
        "encoder": describe() if callable(describe) else dict(encoder.identity),
        "training": dataclasses.asdict(settings),
        "examples": len(examples), "labels": {r: counts.get(r, 0) for r in ROUTES},
        "from_answers": sum(e.from_answers for e in examples),
        "split": {"train": len(train_idx), "heldout": len(held_idx)},
        "metrics": metrics,
        **dict(provenance or {}),
    }
    tmp_manifest = out / f".{MANIFEST_FILE}.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, out / MANIFEST_FILE)
    return RouterReport(str(out), len(examples), manifest["labels"], manifest["from_answers"], len(held_idx),
                        metrics["accuracy"], metrics["accuracy_by_class"], metrics["routed_share"])


def _softmax_layer(coef: np.ndarray, intercept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W (features, classes), b (classes,)) whose softmax is the model's predict_proba. A two-class model
    has one row z of logits for class 1: softmax([-z/2, z/2]) = (1 - sigmoid(z), sigmoid(z))."""
    coef, intercept = np.asarray(coef, dtype=np.float64), np.asarray(intercept, dtype=np.float64)
    if coef.shape[0] == 1:
        coef, intercept = np.vstack([-coef / 2, coef / 2]), np.concatenate([-intercept / 2, intercept / 2])
    return coef.T.copy(), intercept.copy()


def _heldout(router: TrainedRouter, features: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Held-out accuracy, accuracy per true class (None for a class not held out) and share routed per class."""
    if len(labels) == 0:
        return {"accuracy": None, "accuracy_by_class": {r: None for r in ROUTES}, "routed_share": {},
                "heldout_labels": {}}
    predicted = np.array(router.predict(features))
    by_class = {r: (float(np.mean(predicted[labels == r] == r)) if np.any(labels == r) else None) for r in ROUTES}
    share = {r: float(np.mean(predicted == r)) for r in ROUTES}
    return {"accuracy": float(np.mean(predicted == labels)), "accuracy_by_class": by_class, "routed_share": share,
            "heldout_labels": {r: int(np.sum(labels == r)) for r in ROUTES}}


# ----------------------------------------------------------------------------------- the command
def run_router_training(datasets: Sequence[DatasetSpec], out_dir: str | Path, *, llm_spec: LLMSpec | None = None,
                        retriever: str = "bm25", train: RouterTrainSettings = RouterTrainSettings(),
                        allow_any: bool = False, progress: bool = True, llm: LLM | None = None,
                        encoder: TextEncoder | None = None, runs_dir: str | Path | None = None) -> RouterReport:
    """`metarag train-router`: the three strategies on each training dataset, silver labels, the router.

    Every dataset is resolved and checked (training splits only) before any model loads. Each strategy
    is `adaptive-rag` with its route forced, run by the evaluation harness (run folders under `runs_dir`,
    default `out_dir/strategy-runs`; a re-run resumes). A question any strategy failed on is left out
    (counted on stderr). The labelled questions go to `out_dir/router_examples.jsonl`.
    """
    from metarag.evaluate.harness import EvalConfig, evaluate

    llm_spec, loaded = training_sets(datasets, retriever, llm_spec, allow_any, trained="a router is trained")
    import_sklearn()  # fail on a missing `train` extra now, not after the strategies ran
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(runs_dir).expanduser() if runs_dir is not None else out / "strategy-runs"
    examples: list[RouterExample] = []
    strategy_runs: list[dict[str, Any]] = []
    for spec, dataset in zip(datasets, loaded):
        correct: dict[str, dict[str, bool]] = {}
        failed: set[str] = set()
        for route in ROUTES:
            config = EvalConfig(method="adaptive-rag", dataset=spec, llm=llm_spec, retriever=retriever,
                                overrides={"route": route}, runs_dir=str(runs))
            store, results = evaluate(config, progress=progress, llm=llm)
            for result in results:
                if result.failed:
                    failed.add(result.question_id)
                correct.setdefault(result.question_id, {})[route] = train.correct(result.scores)
            manifest = store.read_json("manifest.json")
            strategy_runs.append({"dataset": dataset.name, "route": route, "path": str(store.path),
                                  "model_identity": manifest.get("model_identity")})
        if failed:
            log.warning(f"{dataset.name}: {len(failed)} questions left out (a strategy failed on them)")
        multi_hop = dataset.format in MULTI_HOP_FORMATS
        for question in dataset.questions:
            if question.id in failed or question.id not in correct:
                continue
            done = correct[question.id]
            label, from_answers = silver_label(done, multi_hop)
            examples.append(RouterExample(dataset.name, question.id, question.text, done.get("A", False),
                                          done.get("B", False), done.get("C", False), label, from_answers))
    with open(out / EXAMPLES_FILE, "w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(dataclasses.asdict(example), ensure_ascii=False) + "\n")
    provenance = {
        "datasets": [{"name": d.name, "path": d.path, "sha256": d.sha256, "format": d.format,
                      "questions": len(d.questions), "limit": spec.limit, "sample_seed": spec.seed}
                     for d, spec in zip(loaded, datasets)],
        "retriever": retriever, "strategy_runs": strategy_runs,
    }
    return train_router(examples, out, encoder=encoder, settings=train, provenance=provenance)
