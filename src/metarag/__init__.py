"""metarag: metacognitive and adaptive retrieval-augmented generation for multi-hop QA.

The few names a user needs: `run` a method on a dataset (a `Run`: its results and report table), a
table from an experiment file (`load_experiment`, `run_experiment`),
write a method (`Method`, a policy yielding the actions `Search`, `Ask`, `Probe`, `Assess`, `Note`,
`Clip` over `Question`s, `Message`s and `Decoding`s) and `register_method` it. Importing the
package pulls the standard library and numpy only: each name is imported when first used, every model
back-end lazily by the component that needs it.
"""
from metarag.errors import BackendError, ConfigError, DataError, MetaRAGError, MissingDependency

__version__ = "0.1.0"

# public name -> the module it lives in (imported on first access: `import metarag` stays light)
_LAZY = {
    "run": "metarag.api", "Run": "metarag.api",
    "load_experiment": "metarag.evaluate.experiment", "run_experiment": "metarag.evaluate.experiment",
    "register_method": "metarag.methods.registry",
    "Method": "metarag.methods.runner", "Policy": "metarag.methods.runner",
    "Search": "metarag.policy.actions", "Ask": "metarag.policy.actions", "Probe": "metarag.policy.actions",
    "Assess": "metarag.policy.actions", "Note": "metarag.policy.actions", "Clip": "metarag.policy.actions",
    "Decoding": "metarag.llm.base",
    "Question": "metarag.records", "Passage": "metarag.records", "Hit": "metarag.records",
    "Message": "metarag.records", "Trace": "metarag.records",
}

__all__ = ["BackendError", "ConfigError", "DataError", "MetaRAGError", "MissingDependency", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "evaluate":  # the package; called, it names `run`, the function that evaluates
        import importlib

        return importlib.import_module("metarag.evaluate")
    raise AttributeError(f"module 'metarag' has no attribute {name!r}")
