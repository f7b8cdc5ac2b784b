"""Reranker names -> lazily built rerankers. A spec is a name, or "cross-encoder:PATH" for a model folder.

`check_reranker` validates a spec and its settings before any model is loaded; `build_reranker` is
where a reranker's model loads (the LLM ones hold none: their requests go to the run's LLM).
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from metarag.errors import ConfigError, close_matches
from metarag.rerank.base import Reranker
from metarag.settings import override

# name: (module, reranker class, settings class); "none" runs no reranker.
RERANKERS: dict[str, tuple[str, str, str] | None] = {
    "none": None,
    "llm": ("metarag.rerank.pointwise", "LLMJudgeReranker", "LLMJudgeSettings"),
    "listwise": ("metarag.rerank.listwise", "ListwiseReranker", "ListwiseSettings"),
    "cosine": ("metarag.rerank.pointwise", "CosineReranker", "CosineSettings"),
    "cross-encoder": ("metarag.rerank.pointwise", "CrossEncoderReranker", "CrossEncoderSettings"),
}
# The reranker whose spec carries a model folder after a colon.
TAKES_PATH = frozenset({"cross-encoder"})


def parse_reranker_spec(spec: str) -> tuple[str, str | None]:
    """`"cross-encoder:/m/bge"` -> `("cross-encoder", "/m/bge")`, `"llm"` -> `("llm", None)`."""
    name, sep, argument = spec.strip().partition(":")
    name = name.strip()
    if name not in RERANKERS:
        raise ConfigError(f"unknown reranker {spec!r}{close_matches(name, RERANKERS)}")
    if name in TAKES_PATH:
        if not argument.strip():
            raise ConfigError(f"reranker {name!r} needs a model folder: {name}:PATH")
        return name, argument.strip()
    if sep:
        raise ConfigError(f"reranker {name!r} takes no argument, got {spec!r}")
    return name, None


def reranker_settings(spec: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """The resolved settings of the reranker `spec` names (None for "none"), with `overrides` applied."""
    name, path = parse_reranker_spec(spec)
    entry = RERANKERS[name]
    if entry is None:
        if overrides:
            raise ConfigError(f"reranker 'none' has no settings, got {', '.join(overrides)}")
        return None
    module, _, settings_cls = entry
    cls = getattr(importlib.import_module(module), settings_cls)
    settings = cls(path=path) if name in TAKES_PATH else cls()
    return override(settings, overrides or {}, owner=f"reranker {name!r}")


def check_reranker(spec: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Fail on an unknown reranker, a bad setting or a cross-encoder folder that is not one, loading nothing."""
    settings = reranker_settings(spec, overrides)
    if parse_reranker_spec(spec)[0] in TAKES_PATH:
        from metarag.rerank.pointwise import check_cross_encoder_folder

        check_cross_encoder_folder(settings.path)


def build_reranker(spec: str, overrides: Mapping[str, Any] | None = None) -> Reranker | None:
    """The reranker `spec` names ("none", "llm", "listwise", "cosine" or "cross-encoder:PATH"), or None
    for "none". The LLM rerankers ask the run's LLM through the runner; the others load their model here."""
    name, _ = parse_reranker_spec(spec)
    entry = RERANKERS[name]
    if entry is None:
        reranker_settings(spec, overrides)  # still refuse settings given to "none"
        return None
    settings = reranker_settings(spec, overrides)
    module, reranker_cls, _ = entry
    return getattr(importlib.import_module(module), reranker_cls)(settings)
