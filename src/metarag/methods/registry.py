"""Method names -> each method class and its settings class: ours as lazy import paths, methods of
other packages by the `metarag.methods` entry-point group, and methods registered in the process
(`register_method`, a notebook's). Every front end (`evaluate`, `eval`, `sweep`, `report`, `view`)
finds a method here by name, so a method from elsewhere runs through them exactly as ours do."""
from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from metarag.errors import ConfigError, close_matches
from metarag.settings import override

log = logging.getLogger(__name__)

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
    "search-o1": ("metarag.methods.search_o1", "SearchO1", "SearchO1Settings"),
    "r1-searcher": ("metarag.methods.r1_searcher", "R1Searcher", "R1SearcherSettings"),
    "autorefine": ("metarag.methods.autorefine", "AutoRefine", "AutoRefineSettings"),
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


# The entry-point group a package names its methods in (pyproject.toml):
#   [project.entry-points."metarag.methods"]
#   my-method = "my_package.my_module:MyMethod"     # a class with `settings_class`
ENTRY_POINT_GROUP = "metarag.methods"
_REGISTERED: dict[str, tuple[type, type]] = {}  # register_method's, and entry points once loaded


# A method's name starts its run folders' names (runs/<method>-<dataset>-<model>-<id>): lowercase
# letters, digits, '.', '_' and '-', never a path.
METHOD_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


def register_method(name: str, method: type, settings: type | None = None) -> None:
    """Make `method` runnable by name everywhere ours are: a class built from one instance of its
    frozen settings dataclass (`settings`, else the class's `settings_class`), whose instances have
    `name` and `policy(question)` (the actions of `metarag.policy.actions`), optionally `revision`
    (hashed into run ids: bump it when a prompt or rule changes) and `components`. The name is
    `METHOD_NAME`'s; a name of ours is refused; registering a name again replaces it (a notebook cell
    run twice defines the class anew). Each is checked here, so a mistake fails at registration."""
    import dataclasses

    if not isinstance(name, str) or not METHOD_NAME.fullmatch(name):
        raise ConfigError(f"method name {name!r}: use lowercase letters, digits, '.', '_' and '-', starting with a "
                          "letter or digit (it starts the run folders' names)")
    if not isinstance(method, type):
        raise ConfigError(f"method {name!r}: give the method's class, not {type(method).__name__} instance "
                          f"{method!r:.60}")
    settings = settings if settings is not None else getattr(method, "settings_class", None)
    if settings is None or not isinstance(settings, type) or not dataclasses.is_dataclass(settings):
        given = "" if settings is None else f" (got {type(settings).__name__} {settings!r:.60})"
        raise ConfigError(f"method {name!r}: give its settings dataclass, the class itself (register_method(name, "
                          f"cls, settings) or a `settings_class` attribute){given}")
    if not settings.__dataclass_params__.frozen:
        raise ConfigError(f"method {name!r}: its settings class {settings.__name__} must be a frozen dataclass "
                          "(@dataclass(frozen=True)): a run's settings are one value, hashed into its id")
    try:
        settings()
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"method {name!r}: its settings class {settings.__name__} cannot be made with its defaults "
                          f"({type(exc).__name__}: {exc}); give every setting a default") from None
    if not callable(getattr(method, "policy", None)):
        raise ConfigError(f"method {name!r}: {method.__name__} has no policy(question) method")
    if name in METHODS:
        raise ConfigError(f"{name!r} is one of metarag's own methods: choose another name")
    _REGISTERED[name] = (method, settings)


def method_names() -> list[str]:
    """Every method that can run: ours, then those of installed packages and registered ones."""
    _load_entry_points()
    return [*METHODS, *(n for n in _REGISTERED if n not in METHODS)]


def method_classes(name: str) -> tuple[type, type]:
    """The method class and the settings class of method `name`."""
    if name in METHODS:
        module, method_cls, settings_cls = METHODS[name]
        loaded = importlib.import_module(module)
        return getattr(loaded, method_cls), getattr(loaded, settings_cls)
    if name not in _REGISTERED:
        _load_entry_points()
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}{close_matches(name, method_names())}") from None


_entry_points_loaded = False


def _load_entry_points() -> None:
    """Register the methods installed packages name in the entry-point group, once per process; one
    that does not load is refused with its package's name, never skipped."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = point.dist.name if point.dist else "?"
        if point.name in METHODS:
            log.warning(f"the method {point.name!r} of package {package} ({point.value}) has the name of one of "
                        "metarag's own methods, which runs under that name: it is not used (rename it)")
            continue
        if point.name in _REGISTERED:  # registered in this process, or named by a package read before
            log.warning(f"the method {point.name!r} of package {package} ({point.value}) is not used: that name "
                        f"already runs {_REGISTERED[point.name][0].__module__}.{_REGISTERED[point.name][0].__name__}")
            continue
        try:
            cls = point.load()
        except Exception as exc:  # noqa: BLE001  a plugin's own import error, reported with its name
            _entry_points_loaded = False
            raise ConfigError(f"the method {point.name!r} of package {package} ({point.value}) does not load: "
                              f"{type(exc).__name__}: {exc}") from None
        try:
            register_method(point.name, cls)
        except ConfigError as exc:
            _entry_points_loaded = False
            raise ConfigError(f"package {package} ({point.value}): {exc}") from None


def method_settings(name: str, values: Mapping[str, Any] | None = None) -> Any:
    """The resolved settings of method `name`: its paper defaults with `values` applied."""
    _, settings_cls = method_classes(name)
    return override(settings_cls(), values or {}, owner=f"method {name!r}")


def build_method(name: str, values: Mapping[str, Any] | None = None):
    """An instance of method `name` with its settings overridden by `values`."""
    method_cls, _ = method_classes(name)
    return method_cls(method_settings(name, values))


def method_revision(name: str) -> int:
    """The revision of method `name`'s prompts and rules (a class attribute `revision`, 1 when absent)."""
    return int(getattr(method_classes(name)[0], "revision", 1))


def component_revisions(name: str) -> dict[str, int]:
    """The revisions of the methods that method `name` runs inside it (a class attribute `components`,
    the registry names of e.g. Adaptive-RAG's three strategies or Reflexion's ReAct actor), so that a
    change to one of them changes the composite's run ids too; those at revision 1 are left out."""
    parts = getattr(method_classes(name)[0], "components", ())
    return {part: rev for part in parts if (rev := method_revision(part)) > 1}
