"""SIM-RAG's critic (Yang et al., 2025; study §3.2, §4.3.5): should the reasoner's answer be accepted,
or should the system retrieve more? Two judges answer it:

- `LLMCritic`: the LLM itself, read from the probability of its accept/reject label tokens
  ("Yes"/"No", or the official critic's "1"/"0").
- `TrainedCritic`: a lightweight classifier trained by `metarag.train.critic` on self-practice data,
  over MiniLM embeddings of `critic_text`. The study used the 2B SIM-RAG-Llama3 critic (§4.3.5),
  which is not available offline; this is the toolkit's trainable stand-in.

Both take the inputs `question`, `passages` (already formatted), `answer` and `rationale`; the verdict
is "accept" or "reject" and the score is P(accept).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from metarag.errors import ConfigError, DataError
from metarag.judges.base import Verdict
from metarag.policy.actions import Action, Probe
from metarag.policy.evidence import evidence_prompt
from metarag.settings import Range, check_ranges, setting

if TYPE_CHECKING:
    from metarag.retrieve.dense import DenseSettings

ACCEPT, REJECT = "accept", "reject"

# The official critic's instruction ("Predict if the following answer to the question and context
# should be accepted, 1, or rejected, 0, based on the rationale"), asked of the LLM over the shared
# evidence prefix; {accept}/{reject} are the label strings the probabilities are read for.
CRITIC_TASK = ("Question: {question}\nProposed answer: {answer}\nRationale: {rationale}\n"
               "Based on the passages and the rationale, should this answer to the question be accepted? "
               "Reply {accept} to accept it or {reject} to reject it.")

# What the files of a trained critic folder are called, and the version of their layout. Format 2
# keeps the classifier's weights as plain arrays (.npz, read with allow_pickle=False) beside the JSON
# manifest: opening a shared critic folder can never run code. Format 1 was a pickle (critic.joblib).
MODEL_FILE = "critic.npz"
MANIFEST_FILE = "manifest.json"
CRITIC_FORMAT = 2
PICKLED_MODEL_FILE = "critic.joblib"
ACTIVATIONS = ("identity", "logistic", "tanh", "relu")
# Bump when `critic_text` changes: a critic trained on the old text is refused, not misread.
CRITIC_TEXT_VERSION = 1


def critic_text(question: str, passages: str, answer: str, rationale: str) -> str:
    """The one text a trained critic sees, at training and at inference alike.

    Question, answer and rationale come before the passages: MiniLM reads at most 256 word pieces,
    so truncation cuts evidence, never the answer being judged.
    """
    return f"Question: {question}\nAnswer: {answer}\nRationale: {rationale}\nPassages:\n{passages}"


# ------------------------------------------------------------------------------------ LLM critic
@dataclasses.dataclass(frozen=True)
class LLMCritic:
    """The LLM as SIM-RAG's critic: P(accept) is the probability of `labels[0]` renormalized over
    both labels. Verdict "accept" when it reaches `threshold`. When neither label is a likely
    continuation (no mass, `LabelScores.p`) the verdict is the recorded default "reject", as in
    the official code, where any critic output other than "1" rejects."""

    labels: tuple[str, ...] = ("Yes", "No")
    threshold: float = setting(0.5, ge=0, le=1)
    task: str = CRITIC_TASK
    name: str = "sim-rag-critic"

    def __post_init__(self) -> None:
        if len(self.labels) != 2 or self.labels[0] == self.labels[1] or not all(self.labels):
            raise ConfigError(f"the critic needs two different labels (accept, reject), got {self.labels!r}")
        check_ranges(self)

    def judge(self, inputs: Mapping[str, str]) -> Generator[Action, Any, Verdict]:
        accept, reject = self.labels
        task = self.task.format(question=inputs["question"], answer=inputs["answer"],
                                rationale=inputs["rationale"], accept=accept, reject=reject)
        scores = yield Probe(self.name, evidence_prompt(inputs["passages"], task), self.labels)
        p_accept, fallback = scores.p(accept)
        if fallback is not None:
            return Verdict(REJECT, None, fallback=f"{fallback}; default reject")
        return Verdict(ACCEPT if p_accept >= self.threshold else REJECT, p_accept,
                       detail=f"threshold {self.threshold}")


# ------------------------------------------------------------------------------- trained critic
class TextEncoder(Protocol):
    """What turns critic texts into features. `identity` holds the encoder's `path` and the
    `sha256` of its weights: a critic only runs with the encoder it was trained with."""

    identity: Mapping[str, str]

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class MiniLMFeatures:
    """Critic features: L2-normalized sentence embeddings from the dense retriever's encoder
    (the packaged all-MiniLM-L6-v2 unless `settings.encoder` names another folder)."""

    def __init__(self, settings: DenseSettings | None = None):
        from metarag.retrieve.dense import DenseSettings, encoder_path
        from metarag.retrieve.index import encoder_identity

        self.settings = settings if settings is not None else DenseSettings()
        self._path = encoder_path(self.settings)
        self.identity = encoder_identity(self._path)  # hashes the weights; the model loads on first use

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        from metarag.retrieve.dense import load_encoder

        vectors = load_encoder(self._path).encode(list(texts), batch_size=self.settings.batch_size,
                                                  normalize_embeddings=True, convert_to_numpy=True,
                                                  show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        """What a manifest records about this encoder: its identity and `encoder`, the setting that
        finds it again (None: the packaged MiniLM). Index settings are left out: they do not change
        the features, and a renamed one must not make a saved critic unreadable."""
        return {**self.identity, "encoder": self.settings.encoder}


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the trained critic in folder `path`, checked for format and text version."""
    folder = Path(path).expanduser()
    file = folder / MANIFEST_FILE
    if folder.is_dir() and (folder / PICKLED_MODEL_FILE).is_file() and not (folder / MODEL_FILE).is_file():
        raise ConfigError(f"{str(folder)!r} holds a pickled critic ({PICKLED_MODEL_FILE}, format 1), which could run "
                          f"code when opened, so metarag does not open it: retrain it with `metarag train-critic`, "
                          f"or convert one you made yourself with `python -m metarag.train.critic "
                          f"--convert-trusted-pickle {folder}`")
    if not folder.is_dir() or not file.is_file() or not (folder / MODEL_FILE).is_file():
        raise ConfigError(f"{str(folder)!r} is not a trained critic folder (it needs {MODEL_FILE} and "
                          f"{MANIFEST_FILE}; make one with `metarag train-critic`)")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"unreadable critic manifest: {exc}", path=str(file)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != CRITIC_FORMAT:
        raise DataError(f"not a format-{CRITIC_FORMAT} critic manifest", path=str(file))
    if manifest.get("critic_text_version") != CRITIC_TEXT_VERSION:
        raise ConfigError(f"the critic in {folder} was trained on critic text version "
                          f"{manifest.get('critic_text_version')}, this metarag writes version "
                          f"{CRITIC_TEXT_VERSION}: retrain it with `metarag train-critic`")
    for key in ("encoder", "positive_index", "model"):
        if key not in manifest:
            raise DataError("critic manifest lacks its field", path=str(file), field=key)
    return manifest


def check_encoder(manifest: Mapping[str, Any], encoder: TextEncoder, where: str) -> None:
    """Refuse to run a critic with another encoder than the one it was trained with."""
    trained = manifest["encoder"]
    current = encoder.identity
    if trained.get("sha256") != current.get("sha256"):
        raise ConfigError(
            f"the critic in {where} was trained with the encoder {trained.get('path')} (weights sha256 "
            f"{str(trained.get('sha256'))[:16]}...), but the encoder here is {current.get('path')} (sha256 "
            f"{str(current.get('sha256'))[:16]}...): its features would mean nothing to the classifier; "
            "use the encoder it was trained with, or retrain it with `metarag train-critic`")


class ArrayClassifier:
    """A trained binary classifier as plain arrays: logistic regression (one layer) or an MLP (hidden
    layers with `activation`, then a logistic output), evaluated with numpy alone. `layers` holds
    (weights, bias) pairs, weights of shape (inputs, outputs); column 1 of `predict_proba` is the
    class `classes[1]`, as scikit-learn orders them."""

    def __init__(self, layers: Sequence[tuple[np.ndarray, np.ndarray]], activation: str, classes: np.ndarray):
        self.layers = [(np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)) for w, b in layers]
        self.activation = activation
        self.classes_ = np.asarray(classes)

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.layers[0][0].shape[0]:
            raise DataError(f"the critic expects {self.layers[0][0].shape[0]} features per text, the encoder "
                            f"gives {x.shape[1] if x.ndim == 2 else x.shape}")
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = _ACTIVATE[self.activation](x)
        p = 1.0 / (1.0 + np.exp(-np.clip(x[:, 0], -500, 500)))
        return np.stack([1.0 - p, p], axis=1)

    @classmethod
    def load(cls, file: Path, model: Mapping[str, Any]) -> ArrayClassifier:
        """Read the arrays of `file` (never a pickle: np.load with allow_pickle=False) as the manifest's
        `model` entry describes them; DataError naming the file when they do not fit."""
        activation = model.get("activation", "identity") if isinstance(model, Mapping) else None
        if activation not in ACTIVATIONS:
            raise DataError(f"unknown activation {activation!r} in the critic manifest", path=str(file))
        try:
            with np.load(file, allow_pickle=False) as arrays:
                n_layers = sum(1 for name in arrays.files if name.startswith("W"))
                layers = [(arrays[f"W{i}"], arrays[f"b{i}"]) for i in range(n_layers)]
                classes = arrays["classes"]
        except (ValueError, KeyError, OSError, EOFError) as exc:
            raise DataError(f"not a critic weight file (.npz of plain arrays): {str(exc).splitlines()[0]}",
                            path=str(file)) from None
        shapes_fit = n_layers > 0 and all(w.ndim == 2 and b.ndim == 1 and w.shape[1] == b.shape[0]
                                          and w.dtype.kind == "f" and b.dtype.kind == "f" for w, b in layers)
        shapes_fit = shapes_fit and all(layers[i][0].shape[1] == layers[i + 1][0].shape[0] for i in range(n_layers - 1))
        if not shapes_fit or layers[-1][0].shape[1] != 1 or classes.shape != (2,):
            raise DataError("critic weights do not form a binary classifier (W0, b0, ... W_last of one output, "
                            "two classes)", path=str(file))
        return cls(layers, activation, classes)


_ACTIVATE = {"identity": lambda x: x, "logistic": lambda x: 1.0 / (1.0 + np.exp(-np.clip(x, -500, 500))),
             "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


class TrainedCritic:
    """A critic trained by `metarag.train.critic.train_critic`: P(accept) is the classifier's
    probability that the answer is correct, from the encoder features of `critic_text`.

    The folder holds `critic.npz` (the classifier's weights as plain arrays, read without pickle,
    so a shared folder cannot run code; a format-1 `critic.joblib` pickle is refused) and
    `manifest.json`. Opening it checks the manifest and the encoder's weight sha256
    against the one it was trained with (ConfigError naming both if they differ), before any model
    is loaded. `encoder` replaces the encoder the manifest names (tests inject a fake one).
    """

    name = "sim-rag-critic"

    def __init__(self, path: str | Path, threshold: float = 0.5, encoder: TextEncoder | None = None):
        _check_threshold(threshold)
        self.path = Path(path).expanduser()
        self.threshold = threshold
        self.manifest = read_manifest(self.path)
        if encoder is None:
            from metarag.retrieve.dense import DenseSettings

            encoder = MiniLMFeatures(DenseSettings(encoder=self.manifest["encoder"].get("encoder")))
        check_encoder(self.manifest, encoder, str(self.path))
        self.encoder = encoder
        model_file = self.path / MODEL_FILE
        self.classifier = ArrayClassifier.load(model_file, self.manifest["model"])
        self._positive = int(self.manifest["positive_index"])
        # Names this exact critic (a retrained one in the same folder differs), for run manifests.
        self.sha256 = hashlib.sha256(model_file.read_bytes()).hexdigest()

    def probability(self, texts: Sequence[str]) -> np.ndarray:
        """P(correct) for each critic text."""
        return self.classifier.predict_proba(self.encoder.encode(texts))[:, self._positive]

    def judge(self, inputs: Mapping[str, str]) -> Verdict:
        text = critic_text(inputs["question"], inputs["passages"], inputs["answer"], inputs["rationale"])
        p_accept = float(self.probability([text])[0])
        # No LLM request: the runner records this step's wall-clock latency as its usage.
        return Verdict(ACCEPT if p_accept >= self.threshold else REJECT, p_accept,
                       detail=f"threshold {self.threshold}; critic {self.path.name}")


def load_critic(path: str | Path, threshold: float = 0.5, encoder: TextEncoder | None = None) -> TrainedCritic:
    """The trained critic saved in folder `path`, ready to judge (see `TrainedCritic`)."""
    return TrainedCritic(path, threshold, encoder)


def _check_threshold(threshold: float) -> None:
    Range(ge=0, le=1).check(threshold, "the critic's accept threshold")
