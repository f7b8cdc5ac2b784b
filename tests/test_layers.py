"""The house has floors: a module imports only from its own floor or the ones below, and no modules
import each other in a circle (function-level imports included). The order, lowest first, is the
data flow of README's "What is in it": records and the rules every floor scores and parses with; data,
models and retrieval; the vocabulary a policy speaks (`policy/`); judges and rerankers; methods; the
pipeline; evaluation; training; the front ends. A new top-level module must be given a floor here."""
from __future__ import annotations

import ast
from pathlib import Path

import metarag

FLOORS = (("errors", "records", "parsing", "paths", "settings", "metrics", "provenance"),
          ("data", "llm", "retrieve"),
          ("policy",),
          ("judges", "rerank"),
          ("methods",),
          ("pipeline", "doctor"),
          ("evaluate",),
          ("train",),
          ("api", "view", "display", "cli", "testing"))
PACKAGE = Path(metarag.__file__).parent


def floor(module: str) -> int | None:
    top = module.split(".")[1] if "." in module else None
    return next((i for i, names in enumerate(FLOORS) if top in names), None)


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for file in PACKAGE.rglob("*.py"):
        name = ".".join(("metarag", *file.relative_to(PACKAGE).with_suffix("").parts))
        modules[name.removesuffix(".__init__")] = file
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[module] |= {t for t in targets if t in modules and t not in (module, "metarag")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_floor():
    assert [m for m in import_graph() if m != "metarag" and floor(m) is None] == []


def test_no_module_imports_from_a_higher_floor():
    graph = import_graph()
    climbs = sorted(f"{a} -> {b}" for a in graph if a != "metarag" for b in graph[a] if floor(b) > floor(a))
    assert climbs == []


def test_no_modules_import_each_other_in_a_circle():
    assert cycles(import_graph()) == []


def test_the_check_sees_a_climb_and_a_circle():
    graph = {"metarag.judges.x": {"metarag.train.y"}, "metarag.train.y": {"metarag.judges.x"}}
    assert cycles(graph) == [["metarag.judges.x", "metarag.train.y"]]
    assert floor("metarag.train.y") > floor("metarag.judges.x")
