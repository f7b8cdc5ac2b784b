"""SIM-RAG's self-practice and critic training (Yang et al., 2025; study §3.2): make the data a critic
learns from by letting the reasoner answer training questions, then train a lightweight critic on it.

1. Self-practice: the SIM-RAG reasoner (its own prompt and answer parser, `methods.sim_rag`)
   answers each training question over growing prefixes of the question's retrieval (0, 1, 3, 5
   passages by default), so the same question yields answers made with too little and with enough
   evidence. It is a method (`sim-rag-practice`, `methods.sim_rag.SimRAGPractice`) run through the
   runner, and by `run_training` through the evaluation harness: its traces land in a run folder
   like any eval's, and a re-run resumes. `practice_examples` reads the answers back from the traces
   and labels each (question, passages, answer, rationale) correct or not against gold (exact
   match, or token F1 at or above a threshold).
2. `train_critic`: logistic regression (class-balanced) or a small MLP, both scikit-learn, on the
   MiniLM embeddings of `critic_text`; accuracy and ROC AUC on held-out questions; saved as
   `critic.npz` (the weights as plain arrays, never a pickle) + `manifest.json` for `--set critic=DIR`.

Training data must be training data: `check_training_split` refuses evaluation sets (see its rule).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from metarag import __version__
from metarag.data.datasets import TRAINING_PRESETS, Dataset, check_training_split
from metarag.errors import BackendError, ConfigError, DataError, MissingDependency
from metarag.judges.critic import (
    CRITIC_FORMAT,
    CRITIC_TEXT_VERSION,
    MANIFEST_FILE,
    MODEL_FILE,
    PICKLED_MODEL_FILE,
    MiniLMFeatures,
    TextEncoder,
    critic_text,
    load_critic,
    read_manifest,
)
from metarag.llm.base import LLM
from metarag.methods.sim_rag import PRACTICE_EVIDENCE, SelfPracticeSettings, SimRAGPractice, SimRAGSettings
from metarag.metrics import score_answer
from metarag.parsing import parse_answer_rationale
from metarag.policy.evidence import format_passages
from metarag.records import Decide, Generate, Question, Retrieve, Trace
from metarag.retrieve.base import Retriever
from metarag.settings import check_ranges

if TYPE_CHECKING:
    from metarag.evaluate.harness import DatasetSpec
    from metarag.llm.registry import LLMSpec

log = logging.getLogger(__name__)
# `load_critic` lives with the critic it loads (judges/critic.py); it is re-exported here beside the trainer.
__all__ = ["TRAINING_PRESETS", "CriticReport", "CriticTrainSettings", "PracticeExample", "PracticeSettings",
           "check_training_split", "load_critic", "load_examples", "run_training", "self_practice",
           "train_critic"]

# The shared presets that are training splits; `demo` is the HotpotQA train100 set shipped in the package.
PRACTICE_FILE = "practice.jsonl"


# ----------------------------------------------------------------------------------- self-practice
@dataclass(frozen=True)
class PracticeSettings:
    """How self-practice makes critic training data.

    evidence_sizes = (0, 1, 3, 5) and max_tokens are the practice run's (`SelfPracticeSettings`,
    where their defaults are explained). label = "em": correct when the answer exactly matches a
    gold alias (official labels use EM); "f1" labels correct at token F1 >= f1_threshold.
    """

    evidence_sizes: tuple[int, ...] = (0, 1, 3, 5)
    label: Literal["em", "f1"] = "em"
    f1_threshold: float = 0.5
    max_tokens: int = SimRAGSettings().max_tokens

    def __post_init__(self) -> None:
        if not self.evidence_sizes or any(n < 0 for n in self.evidence_sizes):
            raise ConfigError(f"evidence_sizes must be counts >= 0, got {self.evidence_sizes}")
        check_ranges(self)
        if not 0.0 < self.f1_threshold <= 1.0:
            raise ConfigError(f"f1_threshold must be in (0, 1], got {self.f1_threshold}")
        self.run_settings()  # the practice run's own checks

    def run_settings(self) -> SelfPracticeSettings:
        """The settings of the practice run (the method `sim-rag-practice`)."""
        return SelfPracticeSettings(tuple(self.evidence_sizes), self.max_tokens)


@dataclass(frozen=True)
class PracticeExample:
    """One self-practice answer and its label: the critic's input fields, plus how it scored."""

    dataset: str
    question_id: str
    question: str
    passages: str
    answer: str
    rationale: str
    n_passages: int
    em: float
    f1: float
    correct: bool

    def text(self) -> str:
        """What the critic sees of this example (the same text as at inference)."""
        return critic_text(self.question, self.passages, self.answer, self.rationale)


def self_practice(dataset: Dataset, llm: LLM, retriever: Retriever | None,
                  settings: PracticeSettings = PracticeSettings(), *, allow_any: bool = False, progress: bool = True,
                  on_example: Callable[[PracticeExample], None] | None = None) -> list[PracticeExample]:
    """The SIM-RAG reasoner's answers to each question of a training `dataset`, labelled against gold,
    in memory: the practice method through the runner (`run_training` goes through the harness, with
    a run folder). Questions without gold answers are skipped; a question whose practice fails stops
    it with a BackendError naming the question (retryable as its failure was). `on_example` sees
    each example as it is made."""
    from tqdm import tqdm

    from metarag.methods.runner import Runtime, run

    check_training_split(dataset, allow_any)
    method = SimRAGPractice(settings.run_settings())
    runtime = Runtime(llm, retriever)
    examples: list[PracticeExample] = []
    for question in tqdm(dataset.questions, desc=f"self-practice {dataset.name}", unit="q", disable=not progress):
        if not question.answers:
            continue
        trace = run(method, question, runtime)
        if trace.error is not None:  # the trace says what failed; a retryable failure stays retryable
            raise BackendError(f"self-practice failed on question {question.id}: {trace.error}",
                               retryable=trace.retryable)
        for example in practice_examples(dataset.name, question, trace, settings):
            examples.append(example)
            if on_example is not None:
                on_example(example)
    return examples


def practice_examples(dataset: str, question: Question, trace: Trace,
                      settings: PracticeSettings = PracticeSettings()) -> list[PracticeExample]:
    """The labelled examples of one self-practice trace (`SimRAGPractice`): each answer's Generate step,
    read with the reasoner's parser, over the passages its `practice-evidence` step names (the top
    ones of the trace's retrieval). A failed trace, or a question without gold answers, gives none."""
    if trace.error is not None or not question.answers:
        return []
    hits: tuple = ()
    shown = 0
    examples = []
    for step in trace.steps:
        if isinstance(step, Retrieve):
            hits = step.hits
        elif isinstance(step, Decide) and step.name == PRACTICE_EVIDENCE:
            shown = int(step.signals["passages"])
        elif isinstance(step, Generate) and step.purpose == "answer":
            answer, rationale = parse_answer_rationale(step.text)
            examples.append(_labelled(dataset, question, format_passages(hits[:shown]), shown, answer, rationale,
                                      settings))
    return examples


def _labelled(dataset: str, question: Question, passages: str, n: int, answer: str, rationale: str,
              settings: PracticeSettings) -> PracticeExample:
    scores = score_answer(answer, question.answers)
    correct = scores.em == 1.0 if settings.label == "em" else scores.f1 >= settings.f1_threshold
    return PracticeExample(dataset, question.id, question.text, passages, answer, rationale, n, scores.em,
                           scores.f1, bool(correct))


def save_examples(examples: Sequence[PracticeExample], path: str | Path) -> None:
    """Write examples as JSON lines (what `run_training` keeps beside the critic)."""
    with open(path, "w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(dataclasses.asdict(example), ensure_ascii=False) + "\n")


def load_examples(path: str | Path) -> list[PracticeExample]:
    """Examples written by `save_examples` or `run_training` (practice.jsonl), to train again."""
    names = {f.name for f in dataclasses.fields(PracticeExample)}
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                examples.append(PracticeExample(**{k: v for k, v in record.items() if k in names}))
            except (ValueError, TypeError) as exc:
                raise DataError(f"not a practice example: {exc}", path=str(path), line=number) from None
    return examples


# ----------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class CriticTrainSettings:
    """How the critic is trained.

    classifier "logreg": logistic regression with balanced class weights (answers are mostly wrong
    or mostly right depending on the model; balancing keeps the critic from always saying one
    thing); "mlp": one hidden layer of `hidden` units. heldout = 0.2 of the questions (all their
    examples together, so no question is on both sides) are kept out of training to measure
    accuracy and AUC; the saved critic is the one those figures describe.
    """

    classifier: Literal["logreg", "mlp"] = "logreg"
    heldout: float = 0.2
    seed: int = 0
    C: float = 1.0
    hidden: int = 64

    def __post_init__(self) -> None:
        check_ranges(self)
        if not 0.0 <= self.heldout < 1.0:
            raise ConfigError(f"heldout must be in [0, 1), got {self.heldout}")


@dataclass(frozen=True)
class CriticReport:
    """What training produced: where the critic is, on what it was trained and how it did."""

    path: str
    questions: int
    examples: int
    correct: int
    train_examples: int
    heldout_examples: int
    accuracy: float | None
    auc: float | None
    majority_accuracy: float | None
    by_evidence: dict[int, float] = field(default_factory=dict)

    def summary(self) -> str:
        """A few lines for the terminal."""
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{100 * x:.1f}%"

        lines = [f"critic saved in {self.path}",
                 f"self-practice: {self.examples} examples from {self.questions} questions, "
                 f"{self.correct} correct ({pct(self.correct / self.examples if self.examples else None)})",
                 "answers correct by passages given: "
                 + ", ".join(f"{n}: {pct(rate)}" for n, rate in sorted(self.by_evidence.items())),
                 f"held out: {self.heldout_examples} examples; trained on {self.train_examples}"]
        if self.heldout_examples:
            auc = "n/a (one class held out)" if self.auc is None else f"{self.auc:.3f}"
            lines.append(f"held-out accuracy {pct(self.accuracy)} (majority class {pct(self.majority_accuracy)}), "
                         f"ROC AUC {auc}")
        return "\n".join(lines)


def train_critic(examples: Sequence[PracticeExample], out_dir: str | Path, *, encoder: TextEncoder | None = None,
                 settings: CriticTrainSettings = CriticTrainSettings(),
                 provenance: Mapping[str, Any] | None = None) -> CriticReport:
    """Train a critic on `examples`, measure it on held-out questions, save it in `out_dir`.

    `encoder` defaults to the packaged MiniLM (`MiniLMFeatures`); `provenance` (datasets and their
    sha256s, the LLM, the practice settings) is written into the manifest as given.
    """
    sklearn = import_sklearn()

    if not examples:
        raise DataError("no self-practice examples to train a critic on")
    labels = np.array([int(e.correct) for e in examples])
    encoder = encoder if encoder is not None else MiniLMFeatures()
    train_idx, heldout_idx = _split_by_question(examples, settings.heldout, settings.seed)
    if len(set(labels[train_idx].tolist())) < 2:
        raise DataError(f"the training part of the self-practice data holds only "
                        f"{'correct' if labels[train_idx][0] else 'incorrect'} answers: a critic needs both "
                        "(practice on more questions, or label with f1)")
    features = encoder.encode([e.text() for e in examples])
    classifier = _classifier(settings)
    classifier.fit(features[train_idx], labels[train_idx])
    positive = list(classifier.classes_).index(1)
    metrics = _heldout_metrics(classifier, positive, features[heldout_idx], labels[heldout_idx],
                               majority=int(labels[train_idx].mean() >= 0.5))

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    # The manifest goes last: a folder without one is not a critic, so a crash leaves no half critic.
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    model = save_classifier(classifier, out / MODEL_FILE)
    (out / PICKLED_MODEL_FILE).unlink(missing_ok=True)
    questions = len({(e.dataset, e.question_id) for e in examples})
    by_evidence = {n: float(np.mean([e.correct for e in examples if e.n_passages == n]))
                   for n in sorted({e.n_passages for e in examples})}
    describe = getattr(encoder, "describe", None)
    manifest = {
        "format": CRITIC_FORMAT,
        "kind": "sim-rag-critic",
        "critic_text_version": CRITIC_TEXT_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "metarag_version": __version__,
        "sklearn_version": sklearn.__version__,
        "classifier": dataclasses.asdict(settings),
        "positive_index": positive,
        "model": model,
        "encoder": describe() if callable(describe) else dict(encoder.identity),
        "seed": settings.seed,
        "questions": questions,
        "examples": len(examples),
        "labels": {"correct": int(labels.sum()), "incorrect": int(len(labels) - labels.sum())},
        "examples_by_dataset": dict(Counter(e.dataset for e in examples)),
        "correct_rate_by_passages": {str(n): rate for n, rate in by_evidence.items()},
        "split": {"train_examples": len(train_idx), "heldout_examples": len(heldout_idx),
                  "heldout_questions": len({examples[i].question_id for i in heldout_idx})},
        "metrics": metrics,
        **dict(provenance or {}),
    }
    tmp = out / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST_FILE)
    return CriticReport(str(out), questions, len(examples), int(labels.sum()), len(train_idx), len(heldout_idx),
                        metrics["accuracy"], metrics["auc"], metrics["majority_accuracy"], by_evidence)


def import_sklearn() -> Any:
    """scikit-learn, which trains the classifier; named for the `train` extra when missing. Only
    training needs it: a saved critic is plain arrays that numpy evaluates."""
    try:
        import sklearn
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "sklearn":
            raise
        raise MissingDependency("scikit-learn", "train") from None
    return sklearn


def save_classifier(classifier: Any, file: Path) -> dict[str, Any]:
    """Write a fitted binary LogisticRegression or MLPClassifier as plain arrays (W0, b0, ..., classes)
    in `file` (.npz, written through a temporary file), and return the manifest's `model` entry that
    `judges.critic.ArrayClassifier.load` reads them with."""
    if hasattr(classifier, "coefs_"):  # MLPClassifier: weights (inputs, outputs) per layer
        layers = list(zip(classifier.coefs_, classifier.intercepts_))
        activation, kind = classifier.activation, "mlp"
        if classifier.out_activation_ != "logistic":
            raise ConfigError(f"a critic must be a binary classifier; this MLP ends in {classifier.out_activation_}")
    else:  # LogisticRegression: coef_ (1, inputs)
        if classifier.coef_.shape[0] != 1:
            raise ConfigError("a critic must be a binary classifier (one row of coefficients)")
        layers = [(classifier.coef_.T, classifier.intercept_)]
        activation, kind = "identity", "logreg"
    arrays = {f"W{i}": np.asarray(w, dtype=np.float64) for i, (w, _) in enumerate(layers)}
    arrays.update({f"b{i}": np.asarray(b, dtype=np.float64) for i, (_, b) in enumerate(layers)})
    arrays["classes"] = np.asarray(classifier.classes_, dtype=np.int64)
    tmp = file.with_name(f".{file.name}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, file)
    return {"kind": kind, "activation": activation, "layers": len(layers),
            "features": int(arrays["W0"].shape[0])}


def convert_trusted_pickle(folder: str | Path) -> Path:
    """Convert a format-1 critic folder (a `critic.joblib` pickle) to the array format, in place.

    Unpickling runs whatever code the file holds: call this only on a folder you made yourself. The
    pickle is removed once the arrays and the updated manifest are written."""
    folder = Path(folder).expanduser()
    pickled = folder / PICKLED_MODEL_FILE
    manifest_file = folder / MANIFEST_FILE
    if not pickled.is_file() or not manifest_file.is_file():
        raise ConfigError(f"{str(folder)!r} holds no format-1 critic ({PICKLED_MODEL_FILE} and {MANIFEST_FILE})")
    import_sklearn()
    import joblib

    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    manifest["model"] = save_classifier(joblib.load(pickled), folder / MODEL_FILE)
    manifest["format"] = CRITIC_FORMAT
    tmp = folder / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, manifest_file)
    pickled.unlink()
    read_manifest(folder)
    return folder


def _split_by_question(examples: Sequence[PracticeExample], heldout: float, seed: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Example indices (train, held out), with every example of a question on the same side."""
    keys = sorted({(e.dataset, e.question_id) for e in examples})
    random.Random(seed).shuffle(keys)
    n_heldout = math.ceil(heldout * len(keys)) if heldout > 0 and len(keys) > 1 else 0
    held = set(keys[:n_heldout])
    side = np.array([(e.dataset, e.question_id) in held for e in examples])
    return np.flatnonzero(~side), np.flatnonzero(side)


def _classifier(settings: CriticTrainSettings) -> Any:
    if settings.classifier == "mlp":
        from sklearn.neural_network import MLPClassifier

        return MLPClassifier(hidden_layer_sizes=(settings.hidden,), alpha=1e-3, max_iter=500,
                             random_state=settings.seed)
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=settings.C, class_weight="balanced", max_iter=2000, random_state=settings.seed)


def _heldout_metrics(classifier: Any, positive: int, features: np.ndarray, labels: np.ndarray,
                     majority: int) -> dict[str, float | int | None]:
    """Accuracy (P >= 0.5 accepts), ROC AUC (None when only one class is held out) and the accuracy
    of always predicting the training majority, on the held-out examples."""
    if len(labels) == 0:
        return {"accuracy": None, "auc": None, "majority_accuracy": None, "heldout_positives": 0}
    from sklearn.metrics import roc_auc_score

    p = classifier.predict_proba(features)[:, positive]
    accuracy = float(np.mean((p >= 0.5).astype(int) == labels))
    auc = float(roc_auc_score(labels, p)) if len(set(labels.tolist())) == 2 else None
    return {"accuracy": accuracy, "auc": auc, "majority_accuracy": float(np.mean(labels == majority)),
            "heldout_positives": int(labels.sum())}


# ----------------------------------------------------------------------------------- the command
def training_sets(datasets: Sequence[DatasetSpec], retriever: str, llm_spec: LLMSpec | None, allow_any: bool,
                  trained: str = "a critic is trained") -> tuple[LLMSpec, list[Dataset]]:
    """The checks every trainer makes before any model loads (train-critic, train-router): at least one
    dataset, a known retriever and LLM spec, every dataset a training split with passages to retrieve
    from. Returns the LLM spec (the default when None) and the loaded datasets."""
    from metarag.evaluate.harness import load_questions
    from metarag.llm.registry import LLMSpec, check_spec
    from metarag.retrieve.index import check_retriever

    if not datasets:
        raise ConfigError("give at least one training dataset (--dataset PRESET or --dataset-file PATH)")
    check_retriever(retriever, remote=False)
    llm_spec = llm_spec if llm_spec is not None else LLMSpec()
    check_spec(llm_spec)
    loaded = [load_questions(spec) for spec in datasets]
    for dataset in loaded:
        check_training_split(dataset, allow_any, trained=trained)
        if not dataset.passages:
            raise ConfigError(f"{dataset.name} has no passages to retrieve from: give it a corpus")
    return llm_spec, loaded


def run_training(datasets: Sequence[DatasetSpec], out_dir: str | Path, *, llm_spec: LLMSpec | None = None,
                 retriever: str = "bm25", practice: PracticeSettings = PracticeSettings(),
                 train: CriticTrainSettings = CriticTrainSettings(), allow_any: bool = False,
                 progress: bool = True, llm: LLM | None = None,
                 encoder: TextEncoder | None = None, runs_dir: str | Path | None = None) -> CriticReport:
    """`metarag train-critic`: self-practice on each training dataset, then train and save the critic.

    Every name and dataset is resolved and checked (training splits only) before any model loads.
    Self-practice is the method `sim-rag-practice` run by the evaluation harness: one run folder per
    dataset under `runs_dir` (default `out_dir/practice-runs`), every prompt and answer in its traces,
    and a re-run resumes where the last one stopped. The labelled examples are read from those
    traces and written to `out_dir/practice.jsonl` (train again from it with `load_examples` +
    `train_critic`); questions whose practice failed are left out and counted on stderr.
    `llm` / `encoder` replace the built ones (tests).
    """
    from metarag.evaluate.harness import EvalConfig, evaluate, failure_summary

    llm_spec, loaded = training_sets(datasets, retriever, llm_spec, allow_any)
    import_sklearn()  # fail on a missing `train` extra now, not after the self-practice
    encoder = encoder if encoder is not None else MiniLMFeatures()

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(runs_dir).expanduser() if runs_dir is not None else out / "practice-runs"
    run_settings = practice.run_settings()
    overrides = {"evidence_sizes": run_settings.evidence_sizes, "max_tokens": run_settings.max_tokens}
    examples: list[PracticeExample] = []
    practice_runs: list[dict[str, Any]] = []
    for spec, dataset in zip(datasets, loaded):
        config = EvalConfig(method="sim-rag-practice", dataset=spec, llm=llm_spec, retriever=retriever,
                            overrides=overrides, runs_dir=str(runs))
        store, results = evaluate(config, progress=progress, llm=llm)
        failed = failure_summary(results)
        if failed:
            log.warning(f"self-practice on {dataset.name}: {failed}")
        questions = {q.id: q for q in dataset.questions}
        for result in results:
            examples += practice_examples(dataset.name, questions[result.question_id], result.trace, practice)
        manifest = store.read_json("manifest.json")
        practice_runs.append({"path": str(store.path), "model_identity": manifest.get("model_identity"),
                              "model_sha256": manifest.get("model_sha256")})
    save_examples(examples, out / PRACTICE_FILE)
    provenance = {
        "datasets": [{"name": d.name, "path": d.path, "sha256": d.sha256, "format": d.format,
                      "questions": len(d.questions), "limit": spec.limit, "sample_seed": spec.seed}
                     for d, spec in zip(loaded, datasets)],
        "llm": {"identity": practice_runs[0]["model_identity"], "sha256": practice_runs[0]["model_sha256"]},
        "retriever": retriever,
        "practice": dataclasses.asdict(practice),
        "practice_runs": practice_runs,
    }
    return train_critic(examples, out, encoder=encoder, settings=train, provenance=provenance)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "--convert-trusted-pickle":
        sys.exit("usage: python -m metarag.train.critic --convert-trusted-pickle DIR  (a critic folder you made)")
    try:
        print(f"converted {convert_trusted_pickle(sys.argv[2])} to {MODEL_FILE}")
    except (ConfigError, DataError, MissingDependency) as exc:
        sys.exit(f"metarag: error: {exc}")
