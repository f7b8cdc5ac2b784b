"""metarag: metacognitive and adaptive retrieval-augmented generation for multi-hop QA.

Importing the package pulls the standard library and numpy only; every model back-end is imported
lazily by the component that needs it.
"""
from metarag.errors import BackendError, ConfigError, DataError, MetaRAGError, MissingDependency

__version__ = "0.1.0"

__all__ = ["BackendError", "ConfigError", "DataError", "MetaRAGError", "MissingDependency", "__version__"]
