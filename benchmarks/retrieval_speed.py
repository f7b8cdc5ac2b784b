"""How fast BM25 search is, one query at a time: our BM25Retriever, raw bm25s, and rank_bm25.

Loads the 2WikiMultiHopQA 6,119-passage corpus and its 1,000 dev questions, indexes the corpus
once with bm25s, and reports queries per second for
  (a) BM25Retriever.search, (b) raw bm25s (tokenize + retrieve) on the same saved index,
  (c) rank_bm25's BM25Okapi get_scores + argsort (on a subset: it scores every passage in Python),
plus our overhead over raw bm25s and how much faster raw bm25s is than rank_bm25.

    PYTHONPATH=src python benchmarks/retrieval_speed.py [--data DIR] [--k 10]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from metarag.data.corpus import load_corpus
from metarag.retrieve.bm25 import BM25Retriever, BM25Settings
from metarag.retrieve.memory import tokenize

# The shared benchmark data sits beside the repository: <repo>/../shared/data.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def queries_per_second(run_one: Callable[[str], object], queries: Sequence[str], repeats: int) -> float:
    """Best of `repeats` passes over `queries` (the least disturbed by other work on the machine)."""
    for query in queries[:20]:  # warm caches and memory maps before timing
        run_one(query)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for query in queries:
            run_one(query)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best


def paired_queries_per_second(first: Callable[[str], object], second: Callable[[str], object],
                              queries: Sequence[str], repeats: int) -> tuple[float, float]:
    """Queries per second of two searches timed query by query, alternating which runs first.

    Pairing each query's two runs lets drift in machine load hit both alike; each side keeps its
    best pass of `repeats`.
    """
    for query in queries[:20]:
        first(query)
        second(query)
    best = [float("inf"), float("inf")]
    clock = time.perf_counter
    for rep in range(repeats):
        totals = [0.0, 0.0]
        order = ((0, first), (1, second)) if rep % 2 == 0 else ((1, second), (0, first))
        for query in queries:
            for side, run_one in order:
                start = clock()
                run_one(query)
                totals[side] += clock() - start
        best = [min(b, t) for b, t in zip(best, totals)]
    return len(queries) / best[0], len(queries) / best[1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--corpus", default="2wikimultihopqa/dev1000_hipporag_corpus.json")
    parser.add_argument("--questions", default="2wikimultihopqa/dev1000_hipporag_questions.json")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank-bm25-queries", type=int, default=200,
                        help="how many questions rank_bm25 is timed on (it is slow)")
    args = parser.parse_args(argv)

    import bm25s
    from rank_bm25 import BM25Okapi

    passages = load_corpus(args.data / args.corpus)
    questions = [q["question"] for q in json.loads((args.data / args.questions).read_text(encoding="utf-8"))]
    settings = BM25Settings()
    print(f"corpus: {len(passages)} passages; {len(questions)} questions; k={args.k}; "
          f"k1={settings.k1} b={settings.b} stopwords={settings.stopwords}")

    start = time.perf_counter()
    built = BM25Retriever.build(passages, settings)
    print(f"bm25s index built in {time.perf_counter() - start:.2f} s")

    with tempfile.TemporaryDirectory() as tmp:
        built.save(tmp)
        # Both read the very same saved files, memory-mapped, as open_bm25 does.
        ours = BM25Retriever.load(tmp, passages)
        raw = bm25s.BM25.load(tmp, mmap=True, show_progress=False)

        def raw_search(query: str) -> object:
            tokens = bm25s.tokenize(query, stopwords=settings.stopwords, return_ids=False,
                                    show_progress=False)
            return raw.retrieve(tokens, k=args.k, show_progress=False, n_threads=0)

        # Compared as sets: bm25s orders tied scores arbitrarily, we keep corpus order.
        agree = sum(
            {h.passage.id for h in ours.search(q, args.k)}
            == {passages[i].id for i, s in zip(*(row[0] for row in raw_search(q))) if s > 0}
            for q in questions)
        print(f"same top-{args.k} passages as raw bm25s: {agree}/{len(questions)} questions")

        ours_best, raw_best = paired_queries_per_second(lambda q: ours.search(q, args.k), raw_search,
                                                        questions, args.repeats)

        start = time.perf_counter()
        ours.search_many(questions, args.k)
        batch_qps = len(questions) / (time.perf_counter() - start)

    stopwords = frozenset(bm25s.stopwords.STOPWORDS_EN) if settings.stopwords else frozenset()
    okapi = BM25Okapi([tokenize(p.contents(), stopwords) for p in passages], k1=settings.k1, b=settings.b)
    subset = questions[: args.rank_bm25_queries]

    def okapi_search(query: str) -> object:
        scores = okapi.get_scores(tokenize(query, stopwords))
        return np.argsort(-scores)[: args.k]

    okapi_qps = queries_per_second(okapi_search, subset, 1)

    print(f"(a) metarag BM25Retriever.search : {ours_best:9.1f} queries/s (best of {args.repeats} x "
          f"{len(questions)})")
    print(f"(b) raw bm25s tokenize+retrieve  : {raw_best:9.1f} queries/s (best of {args.repeats} x "
          f"{len(questions)})")
    print(f"(c) rank_bm25 BM25Okapi          : {okapi_qps:9.1f} queries/s (on the first {len(subset)} "
          "questions only)")
    print(f"    metarag search_many (batch)  : {batch_qps:9.1f} queries/s (all {len(questions)} in one call)")
    print(f"our overhead over raw bm25s: {100 * (raw_best / ours_best - 1):+.1f}% time per query")
    print(f"raw bm25s / rank_bm25 speed: {raw_best / okapi_qps:.1f}x")


if __name__ == "__main__":
    main()
