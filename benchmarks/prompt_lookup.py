"""Prompt-lookup decoding of the embedded llama.cpp back-end (`LlamaCppSettings.lookup_tokens`).

The same greedy requests decoded twice on one loaded model, one token at a time and with prompt-lookup
drafts: prints how many outputs differ (the drafts only save work, so the target is 0), the
generated tokens per second of each and the speed-up ratio, the share of tokens taken from drafts.
The requests are the kind our methods send: the top-5 BM25 passages of `hotpotqa-dev500` questions
with a step-by-step reasoning task (MetaRAG's reasoner, IRCoT and FLARE write such text) and a
short-answer task (Standard RAG). Run it on an otherwise idle machine.

    .venv/bin/python benchmarks/prompt_lookup.py [--questions 6] [--max-tokens 128] [--threads 2] [--cold-check]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from metarag.evaluate.harness import DatasetSpec, load_questions
from metarag.llm.base import Decoding
from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
from metarag.pipeline import open_retriever
from metarag.policy.evidence import evidence_prompt, format_passages

TASKS = {
    "reason": "Question: {q}\nReason step by step from the passages in at most three short sentences, "
              "quoting the facts you use, then give the answer.",
    "answer": "Question: {q}\nAnswer with a short answer only.",
}


def decode(llm: LlamaCppLLM, prompts, max_tokens: int, lookup: int, min_ngram: int = 2, cold: bool = False
           ) -> tuple[list[str], float, int]:
    """Greedy outputs, the seconds spent generating them and their tokens. Each prompt is evaluated
    first (a one-token request, untimed), so the timed request reuses its KV state and measures the
    decoding alone. `cold`: no such step; each request starts from an empty context instead."""
    llm.settings = dataclasses.replace(llm.settings, lookup_tokens=lookup, lookup_min_ngram=min_ngram)
    texts, seconds, tokens = [], 0.0, 0
    for messages in prompts:
        if cold:
            llm._states.clear()
            llm._state_bytes = 0
            llm._llm.n_tokens = 0
        else:
            llm.chat(messages, Decoding(max_tokens=1))
        start = time.perf_counter()
        out = llm.chat(messages, Decoding(max_tokens=max_tokens))
        seconds += time.perf_counter() - start
        texts.append(out.text)
        tokens += out.usage.completion_tokens
    return texts, seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lookup", type=int, default=4, help="drafts per step (lookup_tokens)")
    parser.add_argument("--min-ngram", type=int, default=2, help="shortest n-gram looked up (lookup_min_ngram)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cold-check", action="store_true", help="also decode each prompt from an empty context "
                        "and count the outputs that change (llama.cpp's kernels are not batch-invariant)")
    args = parser.parse_args()
    dataset = load_questions(DatasetSpec("hotpotqa-dev500", limit=args.questions, seed=0))
    search = open_retriever(dataset.passages, "bm25")
    prompts = [evidence_prompt(format_passages(search.search(q.text, 5)), task.format(q=q.text))
               for q in dataset.questions for task in TASKS.values()]
    llm = LlamaCppLLM(LlamaCppSettings(embedded=args.model, n_threads=args.threads))
    decode(llm, prompts[:1], 8, 0)  # warm-up
    plain, plain_s, n_plain = decode(llm, prompts, args.max_tokens, 0)
    drafted, drafted_s, n_drafted = decode(llm, prompts, args.max_tokens, args.lookup, args.min_ngram)
    stats = llm.lookup_stats
    differ = [i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b]
    print(f"model: {llm.identity}; {len(prompts)} requests ({args.questions} questions x {len(TASKS)} tasks), "
          f"greedy, max {args.max_tokens} tokens, lookup_tokens={args.lookup}, lookup_min_ngram={args.min_ngram}")
    print(f"outputs that differ: {len(differ)} of {len(prompts)}" + (f" (requests {differ})" if differ else ""))
    print(f"generated tokens: {n_plain} one at a time, {n_drafted} with drafts, {stats['accepted']} of them "
          f"taken from drafts ({stats['accepted'] / max(n_drafted, 1):.0%}; {stats['drafted']} drafted)")
    print(f"one token at a time: {plain_s:6.1f} s decoding, {n_plain / plain_s:5.1f} tok/s")
    print(f"prompt lookup:       {drafted_s:6.1f} s decoding, {n_drafted / drafted_s:5.1f} tok/s")
    print(f"decoding time ratio (lookup / one at a time): {drafted_s / plain_s:.3f}")
    if args.cold_check:
        cold, _, n_cold = decode(llm, prompts, args.max_tokens, 0, cold=True)
        changed = sum(a != b for a, b in zip(plain, cold))
        print(f"one token at a time from an empty context instead of the saved prompt state: {changed} of "
              f"{len(prompts)} outputs differ ({n_cold} tokens against {n_plain})")


if __name__ == "__main__":
    main()
