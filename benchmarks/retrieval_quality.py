"""Supporting-passage recall and MRR of BM25, dense, hybrid RRF, and hybrid followed by each reranker.

Each system ranks `--depth` (20) candidates per question; the table gives the share of a question's
supporting passages within the top 5, 10 and `depth` (R@5, R@10, R@20; averaged over questions) and
the mean reciprocal rank of the first supporting passage within the top `depth` (0 when none is).
Rerankers reorder the hybrid top `depth` (the runner's rerank_depth), so hybrid's R@20 is their
ceiling. The LLM rerankers are slow on a CPU: each runs on the first questions, up to its
`--*-questions` limit and `--minutes-per-reranker` (15) of time; the hybrid row for the same
questions is printed above it, so each comparison is paired. "unchanged" counts the questions
whose candidate order a reranker left as it was.

Datasets: `hotpotqa-dev500` (500 questions over their distractor pool of 4,858 passages) and
`2wiki-dev38` (38 questions over their own pool of 341 passages). `2wiki-dev1000`'s question file
carries no supporting passages, so recall cannot be measured on it.

    .venv/bin/python benchmarks/retrieval_quality.py [--llm embedded|embedded-0.5b] [--depth 20]
        [--datasets hotpotqa-dev500,2wiki-dev38] [--rerankers cosine,llm,listwise]
        [--cosine-questions 100] [--llm-questions 25] [--listwise-questions 25] [--minutes-per-reranker 15]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metarag.data.datasets import resolve_preset
from metarag.errors import MetaRAGError
from metarag.llm.base import LLM
from metarag.llm.registry import LLMSpec, make_llm
from metarag.methods.runner import Runtime, drive
from metarag.metrics import support_recall
from metarag.records import Hit, Question
from metarag.rerank.base import Reranker
from metarag.rerank.registry import build_reranker
from metarag.retrieve.base import Retriever
from metarag.retrieve.fusion import FusionRetriever, FusionSettings
from metarag.retrieve.index import open_bm25, open_dense

CUTOFFS = (5, 10)


@dataclass(frozen=True)
class Row:
    """One line of the table: a system's mean scores over n questions."""

    dataset: str
    system: str
    n: int
    recall: dict[int, float]
    mrr: float
    seconds_per_question: float
    fallbacks: int = 0
    unchanged: int | None = None  # rerankers only: questions whose candidates kept their order


def reciprocal_rank(ranked_ids: Sequence[str], supporting: Sequence[str]) -> float:
    """1 / the rank of the first supporting passage in `ranked_ids`, 0 if none is there."""
    support = set(supporting)
    return next((1.0 / rank for rank, pid in enumerate(ranked_ids, 1) if pid in support), 0.0)


def score(dataset: str, system: str, questions: Sequence[Question], rankings: Sequence[Sequence[Hit]],
          seconds: float, depth: int, fallbacks: int = 0, unchanged: int | None = None) -> Row:
    """Mean R@5, R@10, R@depth and MRR@depth of `rankings` (one per question)."""
    recall = {}
    for cutoff in (*CUTOFFS, depth):
        values = [support_recall([h.passage.id for h in hits[:cutoff]], q.supporting_ids)
                  for q, hits in zip(questions, rankings)]
        recall[cutoff] = sum(values) / len(values)
    mrr = sum(reciprocal_rank([h.passage.id for h in hits[:depth]], q.supporting_ids)
              for q, hits in zip(questions, rankings)) / len(questions)
    return Row(dataset, system, len(questions), recall, mrr, seconds / len(questions), fallbacks, unchanged)


def first_stage(dataset: str, name: str, retriever: Retriever, questions: Sequence[Question],
                depth: int) -> tuple[Row, list[list[Hit]]]:
    """Score one retriever over `questions` (searched one query at a time, as methods do)."""
    retriever.search(questions[0].text, depth)  # warm up (model load, memory maps) outside the timing
    start = time.perf_counter()
    rankings = [retriever.search(q.text, depth) for q in questions]
    return score(dataset, name, questions, rankings, time.perf_counter() - start, depth), rankings


def rerank_all(dataset: str, name: str, reranker: Reranker, runtime: Runtime, questions: Sequence[Question],
               candidates: Sequence[Sequence[Hit]], depth: int, budget_s: float) -> Row:
    """Rerank each question's hybrid candidates, keeping all `depth`; a failure keeps their order.

    Questions are taken in order until `budget_s` seconds are spent (0: no budget), so a slow
    machine ranks fewer of them; the row's n says how many.
    """
    rankings: list[Sequence[Hit]] = []
    fallbacks = unchanged = 0
    start = time.perf_counter()
    for i, (question, hits) in enumerate(zip(questions, candidates), 1):
        began = time.perf_counter()
        try:
            reranked, _ = drive(reranker.rerank(question.text, hits, depth), runtime)
            ranking, fallback = reranked.hits, reranked.fallback
        except MetaRAGError as exc:  # e.g. a prompt over the context: count it, keep the retrieval order
            ranking, fallback = hits, f"{type(exc).__name__}: {exc}"
        fallbacks += fallback is not None
        unchanged += [h.passage.id for h in ranking] == [h.passage.id for h in hits]
        rankings.append(ranking)
        note = f" (fallback: {fallback})" if fallback else ""
        print(f"  {dataset} {name}: question {i}/{len(questions)} in {time.perf_counter() - began:.1f} s{note}",
              file=sys.stderr, flush=True)
        if budget_s and time.perf_counter() - start >= budget_s:
            break
    done = questions[:len(rankings)]
    return score(dataset, name, done, rankings, time.perf_counter() - start, depth, fallbacks, unchanged)


def markdown(rows: Sequence[Row], depth: int) -> str:
    """The rows as a markdown table."""
    head = (f"| dataset | system | n | R@5 | R@10 | R@{depth} | MRR@{depth} | s/question | fallbacks | unchanged |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [f"| {r.dataset} | {r.system} | {r.n} | {r.recall[5]:.3f} | {r.recall[10]:.3f} | "
             f"{r.recall[depth]:.3f} | {r.mrr:.3f} | {r.seconds_per_question:.3f} | {r.fallbacks} | "
             f"{'' if r.unchanged is None else r.unchanged} |" for r in rows]
    return "\n".join([head, *lines])


def run_dataset(name: str, args: argparse.Namespace, llm: Callable[[], LLM]) -> list[Row]:
    """Every system's rows on dataset preset `name`."""
    dataset = resolve_preset(name, args.data)
    questions = [q for q in dataset.questions if q.supporting_ids][: args.questions or None]
    passages = list(dataset.passages or ())
    print(f"{name}: {len(questions)} questions with supporting passages, {len(passages)} passages",
          file=sys.stderr, flush=True)
    bm25 = open_bm25(passages, args.index_dir)
    dense = open_dense(passages, args.index_dir)
    hybrid = FusionRetriever([bm25, dense], FusionSettings())

    rows = []
    for system, retriever in (("BM25", bm25), ("dense (MiniLM)", dense), ("hybrid RRF", hybrid)):
        row, rankings = first_stage(name, system, retriever, questions, args.depth)
        rows.append(row)
    candidates = rankings  # the hybrid's, the last of the loop
    limits = {"cosine": args.cosine_questions, "llm": args.llm_questions, "listwise": args.listwise_questions}
    labels = {"cosine": "hybrid + cosine (MiniLM) rerank", "llm": f"hybrid + LLM judge rerank ({args.llm})",
              "listwise": f"hybrid + listwise rerank ({args.llm})"}
    for spec in args.rerankers:
        n = min(limits[spec], len(questions))
        reranker = build_reranker(spec)
        runtime = Runtime(llm() if spec in ("llm", "listwise") else None)  # the LLM rerankers' requests go here
        row = rerank_all(name, labels[spec], reranker, runtime, questions[:n], candidates[:n], args.depth,
                         60 * args.minutes_per_reranker)
        if row.n < len(questions):  # the paired baseline: hybrid on the same questions
            rows.append(score(name, f"hybrid RRF (first {row.n})", questions[:row.n], candidates[:row.n],
                              rows[2].seconds_per_question * row.n, args.depth))
        rows.append(row)
        print(markdown(rows[-1:], args.depth).splitlines()[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="hotpotqa-dev500,2wiki-dev38",
                        help="comma-separated dataset presets whose questions carry supporting passages")
    parser.add_argument("--data", default=None, help="the shared data folder (default: found beside the repo)")
    parser.add_argument("--index-dir", default=None, help="where the indexes are (default: $METARAG_HOME)")
    parser.add_argument("--depth", type=int, default=20, help="candidates ranked per question (rerank depth)")
    parser.add_argument("--questions", type=int, default=0, help="first-stage questions per dataset (0: all)")
    parser.add_argument("--rerankers", default="cosine,llm,listwise",
                        help="comma-separated: cosine, llm, listwise (empty: none)")
    parser.add_argument("--cosine-questions", type=int, default=100)
    parser.add_argument("--llm-questions", type=int, default=25, help="questions for the LLM judge")
    parser.add_argument("--listwise-questions", type=int, default=25)
    parser.add_argument("--minutes-per-reranker", type=float, default=15,
                        help="stop a reranker after the question that passes this many minutes (0: none)")
    parser.add_argument("--llm", choices=("embedded", "embedded-0.5b"), default="embedded",
                        help="the LLM of the LLM rerankers: the 1.5B (embedded) or 0.5B model")
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args(argv)
    args.rerankers = [s for s in args.rerankers.split(",") if s]
    unknown = set(args.rerankers) - {"cosine", "llm", "listwise"}
    if unknown:
        parser.error(f"unknown rerankers: {', '.join(sorted(unknown))} (cosine, llm, listwise)")

    loaded: list[LLM] = []

    def llm() -> LLM:
        # Loaded once, on first use; no response cache, so the timings are of the model.
        if not loaded:
            loaded.append(make_llm(LLMSpec(backend=args.llm, n_ctx=args.n_ctx, response_cache=False)))
        return loaded[0]

    rows = []
    for name in args.datasets.split(","):
        rows += run_dataset(name, args, llm)
    print(markdown(rows, args.depth))


if __name__ == "__main__":
    main()
