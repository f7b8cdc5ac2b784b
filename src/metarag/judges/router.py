"""Adaptive-RAG's trained query-complexity router as a judge (Jeong et al., 2024, §3.3): the folder
`metarag train-router` writes (`train/router.py`: silver labels, the classifier, `router.npz` +
`manifest.json`), opened and checked here, below `methods/`, so that `adaptive-rag --set
classifier=DIR` loads it without reaching up into training."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from metarag.errors import ConfigError, DataError
from metarag.judges.base import Verdict
from metarag.judges.critic import MiniLMFeatures, TextEncoder, check_encoder

Route = Literal["A", "B", "C"]  # Adaptive-RAG's complexity classes: no retrieval, one retrieval, multi-step
ROUTES = get_args(Route)
ROUTER_FORMAT = 1
ROUTER_KIND = "adaptive-rag-router"
MODEL_FILE = "router.npz"
MANIFEST_FILE = "manifest.json"


class TrainedRouter:
    """A router trained by `train_router`, as a judge: its verdict is the route (A, B or C) of the
    question, its score the route's probability, its signals p_A, p_B, p_C. Opening the folder checks
    the manifest and the encoder's weight sha256 against the one it was trained with (ConfigError naming
    both when they differ), before any model loads. `encoder` replaces the manifest's (tests)."""

    name = "adaptive-rag-router"

    def __init__(self, path: str | Path, encoder: TextEncoder | None = None):
        self.path = Path(path).expanduser()
        manifest = read_router_manifest(self.path)
        if encoder is None:
            from metarag.retrieve.dense import DenseSettings

            encoder = MiniLMFeatures(DenseSettings(encoder=manifest["encoder"].get("encoder")))
        check_encoder(manifest, encoder, str(self.path))
        try:
            with np.load(self.path / MODEL_FILE, allow_pickle=False) as arrays:
                weights, bias = arrays["W0"], arrays["b0"]
        except (ValueError, KeyError, OSError, EOFError) as exc:
            raise DataError(f"not a router weight file: {str(exc).splitlines()[0]}",
                            path=str(self.path / MODEL_FILE)) from None
        self._set(weights, bias, manifest["classes"], encoder)

    @classmethod
    def from_arrays(cls, weights: np.ndarray, bias: np.ndarray, classes: Sequence[str],
                    encoder: TextEncoder) -> TrainedRouter:
        router = cls.__new__(cls)
        router.path = Path("(in memory)")
        router._set(weights, bias, classes, encoder)
        return router

    def _set(self, weights: np.ndarray, bias: np.ndarray, classes: Sequence[str], encoder: TextEncoder) -> None:
        weights, bias = np.asarray(weights, dtype=np.float64), np.asarray(bias, dtype=np.float64)
        if weights.ndim != 2 or bias.shape != (weights.shape[1],) or len(classes) != weights.shape[1] \
                or not set(classes) <= set(ROUTES):
            raise DataError("router weights do not fit its classes (W0 features x classes, b0 classes, classes "
                            "among A, B, C)", path=str(self.path))
        self.weights, self.bias, self.classes, self.encoder = weights, bias, list(classes), encoder

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.weights.shape[0]:
            raise DataError(f"the router expects {self.weights.shape[0]} features per question, the encoder gives "
                            f"{x.shape[1] if x.ndim == 2 else x.shape}")
        logits = x @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, features: np.ndarray) -> list[str]:
        return [self.classes[i] for i in self.probabilities(features).argmax(axis=1)]

    def judge(self, inputs: Mapping[str, str]) -> Verdict:
        p = self.probabilities(self.encoder.encode([inputs["question"]]))[0]
        probs = {r: 0.0 for r in ROUTES} | {c: float(v) for c, v in zip(self.classes, p)}
        route = self.classes[int(p.argmax())]
        # No LLM request: the runner records this step's wall-clock latency as its usage.
        return Verdict(route, probs[route], detail=f"router {self.path.name}",
                       signals=tuple((f"p_{r}", probs[r]) for r in ROUTES))


def read_router_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the router in `folder`, checked for kind, format and fields."""
    file = folder / MANIFEST_FILE
    if not folder.is_dir() or not file.is_file() or not (folder / MODEL_FILE).is_file():
        raise ConfigError(f"{str(folder)!r} is not a trained router folder (it needs {MODEL_FILE} and {MANIFEST_FILE}; "
                          "make one with `metarag train-router`)")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"unreadable router manifest: {exc}", path=str(file)) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != ROUTER_KIND or manifest.get("format") != ROUTER_FORMAT:
        raise DataError(f"not a format-{ROUTER_FORMAT} {ROUTER_KIND} manifest", path=str(file))
    for key in ("encoder", "classes"):
        if key not in manifest:
            raise DataError("router manifest lacks its field", path=str(file), field=key)
    return manifest


def load_router(path: str | Path, encoder: TextEncoder | None = None) -> TrainedRouter:
    """The trained router saved in folder `path` (see `TrainedRouter`)."""
    return TrainedRouter(path, encoder)
