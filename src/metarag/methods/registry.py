"""Method names -> lazy import paths of each method and its settings class."""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from metarag.errors import ConfigError, close_matches
from metarag.settings import override

# name: (module, method class, settings class)
METHODS: dict[str, tuple[str, str, str]] = {
    "closed-book": ("metarag.methods.closed_book", "ClosedBook", "ClosedBookSettings"),
    "cot": ("metarag.methods.cot", "ChainOfThought", "CoTSettings"),
    "standard-rag": ("metarag.methods.standard_rag", "StandardRAG", "StandardRAGSettings"),
    "metarag": ("metarag.methods.metarag", "MetaRAG", "MetaRAGSettings"),
    "sim-rag": ("metarag.methods.sim_rag", "SimRAG", "SimRAGSettings"),
    # SIM-RAG's self-practice (the critic's training data), run by `metarag train-critic` through the harness
    "sim-rag-practice": ("metarag.methods.sim_rag", "SimRAGPractice", "SelfPracticeSettings"),
    "evoctx": ("metarag.methods.evoctx", "EvoCtx", "EvoCtxSettings"),
    "iterdrag": ("metarag.methods.iterdrag", "IterDRAG", "IterDRAGSettings"),
    "self-ask": ("metarag.methods.self_ask", "SelfAsk", "SelfAskSettings"),
    "ircot": ("metarag.methods.ircot", "IRCoT", "IRCoTSettings"),
    "search-r1": ("metarag.methods.search_agent", "SearchR1", "SearchR1Settings"),
    "belief-agent": ("metarag.methods.search_agent", "BeliefAgent", "BeliefAgentSettings"),
    "flare": ("metarag.methods.flare", "FLARE", "FLARESettings"),
    "react": ("metarag.methods.react", "ReAct", "ReActSettings"),
    "reflexion": ("metarag.methods.reflexion", "Reflexion", "ReflexionSettings"),
    "dragin": ("metarag.methods.dragin", "DRAGIN", "DRAGINSettings"),
    "dragin-entropy": ("metarag.methods.dragin", "DRAGINEntropy", "DRAGINSettings"),
    "self-rag": ("metarag.methods.self_rag", "SelfRAG", "SelfRAGSettings"),
    "self-rag-prompted": ("metarag.methods.self_rag", "SelfRAGPrompted", "SelfRAGPromptedSettings"),
    "kirag": ("metarag.methods.kirag", "KiRAG", "KiRAGSettings"),
    "adaptive-rag": ("metarag.methods.adaptive_rag", "AdaptiveRAG", "AdaptiveRAGSettings"),
}

# Methods that never retrieve: a run of them needs no corpus and loads no index.
CLOSED_BOOK = frozenset({"closed-book", "cot"})


def method_settings(name: str, values: Mapping[str, Any] | None = None) -> Any:
    """The resolved settings of method `name`: its paper defaults with `values` applied."""
    module, _, settings_cls = _entry(name)
    settings = getattr(importlib.import_module(module), settings_cls)()
    return override(settings, values or {}, owner=f"method {name!r}")


def build_method(name: str, values: Mapping[str, Any] | None = None):
    """An instance of method `name` with its settings overridden by `values`."""
    module, method_cls, _ = _entry(name)
    settings = method_settings(name, values)
    return getattr(importlib.import_module(module), method_cls)(settings)


def method_revision(name: str) -> int:
    """The revision of method `name`'s prompts and rules (a class attribute `revision`, 1 when absent)."""
    module, method_cls, _ = _entry(name)
    return int(getattr(getattr(importlib.import_module(module), method_cls), "revision", 1))


def component_revisions(name: str) -> dict[str, int]:
    """The revisions of the methods that method `name` runs inside it (a class attribute `components`,
    the registry names of e.g. Adaptive-RAG's three strategies or Reflexion's ReAct actor), so that a
    change to one of them changes the composite's run ids too; those at revision 1 are left out."""
    module, method_cls, _ = _entry(name)
    parts = getattr(getattr(importlib.import_module(module), method_cls), "components", ())
    return {part: rev for part in parts if (rev := method_revision(part)) > 1}


def _entry(name: str) -> tuple[str, str, str]:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}{close_matches(name, METHODS)}") from None
