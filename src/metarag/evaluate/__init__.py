"""evaluate stage of metarag: the run's description and resolution, the harness, metrics, reports.

The package is not a function: `metarag.evaluate(...)` raises a TypeError that names `metarag.run`,
the function that evaluates a method on a dataset.
"""
import sys
import types


class _EvaluatePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        raise TypeError("metarag.evaluate is the package of the harness, metrics and reports, not a function: "
                        "evaluate a method with metarag.run(method, dataset, ...)")


sys.modules[__name__].__class__ = _EvaluatePackage
