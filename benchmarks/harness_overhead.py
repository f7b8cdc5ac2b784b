"""Per-question overhead of the evaluation harness, next to which LLM time is what matters.

Runs Standard RAG through the whole harness (dataset loading, BM25 over the 2WikiMultiHopQA 6,119-
passage corpus, the runner, scoring, the run folder with an fsync per question) with the scripted
LLM, which answers instantly, and prints questions per second and milliseconds per question, split
into retrieval and everything else.

    .venv/bin/python benchmarks/harness_overhead.py [--limit 300]
"""
from __future__ import annotations

import argparse
import tempfile
import time

from metarag.data.datasets import resolve_preset
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.llm.scripted import ScriptedLLM
from metarag.pipeline import open_retriever


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=300)
    args = parser.parse_args()
    dataset = resolve_preset("2wiki-dev1000")
    with tempfile.TemporaryDirectory() as tmp:
        retriever = open_retriever(list(dataset.passages), "bm25", f"{tmp}/index")
        config = EvalConfig(method="standard-rag", dataset=DatasetSpec(preset="2wiki-dev1000", limit=args.limit),
                            runs_dir=f"{tmp}/runs")
        start = time.perf_counter()
        _, results = evaluate(config, progress=False, llm=ScriptedLLM(default="yes"), retriever=retriever)
        elapsed = time.perf_counter() - start
    retrieval = sum(r.trace.usage.latency_s for r in results) - sum(
        s.usage.latency_s for r in results for s in r.trace.steps if s.usage.llm_requests)
    n = len(results)
    print(f"questions: {n} (2wiki-dev1000, BM25 over {len(dataset.passages)} passages, scripted LLM)")
    print(f"throughput: {n / elapsed:.1f} questions/s")
    print(f"per question: {1000 * elapsed / n:.2f} ms in all, of which retrieval {1000 * retrieval / n:.2f} ms "
          f"and harness (dataset, runner, scoring, fsync'd result line) {1000 * (elapsed - retrieval) / n:.2f} ms")


if __name__ == "__main__":
    main()
