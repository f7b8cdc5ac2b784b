"""The entry points front ends call: build a method, open a corpus's retriever, answer a question.

Each function resolves names and settings first (failing fast on a mistake), then loads models.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from metarag.errors import ConfigError
from metarag.llm.base import LLM
from metarag.llm.registry import LLMSpec, make_llm
from metarag.methods.registry import CLOSED_BOOK, build_method
from metarag.methods.runner import Method, Runtime, run
from metarag.records import Passage, Question, Step, Trace
from metarag.retrieve.base import Retriever
from metarag.retrieve.index import REMOTE, check_retriever
from metarag.settings import parse_assignments

if TYPE_CHECKING:
    from metarag.retrieve.dense import DenseSettings

DEMO_CORPUS = "hotpotqa_train100_corpus.jsonl"
DEMO_QUESTIONS = "hotpotqa_train100.json"


def demo_file(name: str) -> Path:
    """A file of the HotpotQA train100 demo shipped inside the package."""
    path = Path(str(resources.files("metarag") / "demo" / name))
    if not path.exists():
        raise ConfigError(f"the demo file {name} is missing from the installed package")
    return path


def method_from_args(name: str, k: int | None = None, assignments: Sequence[str] = ()) -> Method:
    """A method from its name, an optional k and `key=value` overrides."""
    values: dict[str, str | int] = dict(parse_assignments(list(assignments)))
    if k is not None and name not in CLOSED_BOOK:
        values["k"] = k
    return build_method(name, values)


def load_passages(corpus: str | Path | None) -> list[Passage]:
    from metarag.data.corpus import load_corpus

    return load_corpus(corpus if corpus is not None else demo_file(DEMO_CORPUS))


def open_retriever(passages: list[Passage], kind: str = "bm25", index_dir: str | Path | None = None,
                   dense: DenseSettings | None = None) -> Retriever:
    """The retriever `kind` over `passages`, its index built once and reused while it matches;
    `remote:URL` is a `metarag serve-retriever` service (its index, not `passages`, answers).
    `dense` None means `DenseSettings()` for the dense side of "dense" and "hybrid"."""
    from metarag.retrieve import index

    if check_retriever(kind).startswith(REMOTE):
        from metarag.retrieve.remote import RemoteRetriever

        return RemoteRetriever(kind.removeprefix(REMOTE))
    root = Path(index_dir) if index_dir else index.default_index_dir(passages)
    if kind == "dense":
        return index.open_dense(passages, root, dense)
    if kind == "hybrid":
        return index.open_hybrid(passages, root, dense=dense)
    return index.open_bm25(passages, root)


def answer_question(text: str, method: Method, *, corpus: str | Path | None = None,
                    retriever: str = "bm25", index_dir: str | Path | None = None,
                    reranker: str = "none", rerank_depth: int = 20,
                    llm_spec: LLMSpec = LLMSpec(), llm: LLM | None = None,
                    on_step: Callable[[Step], None] | None = None) -> Trace:
    """Run `method` on one free-text question over `corpus` (the demo corpus by default), with an
    optional reranker after every retrieval round."""
    from metarag.rerank.registry import build_reranker, check_reranker

    if not text.strip():
        raise ConfigError("the question is empty")
    check_reranker(reranker)
    found = None
    if method.name not in CLOSED_BOOK:
        found = open_retriever(load_passages(corpus), retriever, index_dir)
    llm = llm if llm is not None else make_llm(llm_spec)
    check = getattr(llm, "check", None)
    if check is not None:  # a served model down or hung fails in seconds, as before an eval's first question
        check()
    runtime = Runtime(llm=llm, retriever=found, reranker=build_reranker(reranker), rerank_depth=rerank_depth)
    return run(method, Question(id="ask", text=text.strip()), runtime, on_step=on_step)


def build_indexes(corpus: str | Path | None, kinds: Sequence[str], index_dir: str | Path | None = None,
                  dense_index: str | None = None) -> list[str]:
    """Build or reuse each index kind of `corpus`; one report line per index.

    `dense_index` ("flat", "hnsw", "ivf" or "ivfpq") fixes the FAISS index type whatever the corpus
    size; None keeps `DenseSettings`'s rule (flat up to its threshold, then HNSW).
    """
    from metarag.retrieve import index
    from metarag.retrieve.dense import DenseSettings, with_index_type

    dense = None if dense_index is None else with_index_type(DenseSettings(), dense_index)

    kinds = [k.strip() for k in kinds if k.strip()]
    for kind in kinds:
        check_retriever(kind, remote=False)
    passages = load_passages(corpus)
    root = Path(index_dir) if index_dir else index.default_index_dir(passages)
    index.save_corpus(root, passages)  # so `metarag serve-retriever --index ROOT` needs no --corpus
    lines = []
    for kind in kinds:
        start = time.perf_counter()
        retriever = open_retriever(passages, kind, root, dense)
        elapsed = time.perf_counter() - start
        folder = Path(retriever.index_dir)
        stats = index.index_stats(folder)
        lines.append(f"{kind}: {stats.passages} passages, ready in {elapsed:.1f} s, "
                     f"{stats.size_bytes / 1e6:.1f} MB on disk at {folder}")
    lines.append(f"index folder: {root}")
    return lines
