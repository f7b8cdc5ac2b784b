"""Exact KV-cache reuse of the embedded llama.cpp back-end (`LlamaCppSettings.prefix_chunk`).

The requests our methods send — the top-5 BM25 passages of `hotpotqa-dev500` questions, then a
reasoning task and a short-answer task that share those passages — are decoded greedily in one
sequence on one loaded model (each request reusing what the one before left in the KV cache, as in
a run), and each again from an empty context (a fresh evaluation). For `prefix_chunk` 0 (reuse any
shared prefix, the default) and C (reuse whole aligned chunks only) it prints how many outputs differ
from the fresh evaluation's (the target for C is 0), the largest difference of a generated token's
log-prob where the tokens agree, the prompt tokens reused, and the time of the sequence with C
against 0 (the price of exactness: up to C − 1 recomputed tokens per request, smaller batches).

    .venv/bin/python benchmarks/prefix_chunk.py [--model qwen2.5-coder-0.5b-instruct] [--questions 6]
        [--chunk 32] [--max-tokens 32] [--threads 1]
"""
from __future__ import annotations

import argparse
import time

from metarag.evaluate.harness import DatasetSpec, load_questions
from metarag.llm.base import Decoding
from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
from metarag.pipeline import open_retriever
from metarag.policy.evidence import evidence_prompt, format_passages

TASKS = ("Question: {q}\nReason step by step from the passages in at most three short sentences, then give "
         "the answer.", "Question: {q}\nAnswer with a short answer only.")


def empty(llm: LlamaCppLLM) -> None:
    """Forget the context and every saved state: the next request is evaluated afresh."""
    llm._states.clear()
    llm._state_bytes = 0
    llm._llm.n_tokens = 0
    llm._clean = 0


def run(llm: LlamaCppLLM, prompts, decoding: Decoding, fresh: bool):
    outs, start = [], time.perf_counter()
    for messages in prompts:
        if fresh:
            empty(llm)
        outs.append(llm.chat(messages, decoding))
    return outs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    dataset = load_questions(DatasetSpec("hotpotqa-dev500", limit=args.questions, seed=0))
    search = open_retriever(dataset.passages, "bm25")
    prompts = [evidence_prompt(format_passages(search.search(q.text, 5)), task.format(q=q.text))
               for q in dataset.questions for task in TASKS]
    decoding = Decoding(max_tokens=args.max_tokens, logprobs=1)
    print(f"model: {args.model}; {len(prompts)} requests ({args.questions} questions x {len(TASKS)} tasks sharing "
          f"their passages), greedy, max {args.max_tokens} tokens, {args.threads} thread(s)")
    seconds = {}
    for chunk in (0, args.chunk):
        llm = LlamaCppLLM(LlamaCppSettings(embedded=args.model, n_threads=args.threads, prefix_chunk=chunk))
        run(llm, prompts[:1], Decoding(max_tokens=2), fresh=True)  # warm-up
        empty(llm)
        warm, seconds[chunk] = run(llm, prompts, decoding, fresh=False)
        cold, _ = run(llm, prompts, decoding, fresh=True)
        differ = [i for i, (a, b) in enumerate(zip(warm, cold)) if a.token_ids != b.token_ids]
        gap = max((abs(x.logprob - y.logprob) for a, b in zip(warm, cold) for x, y, i, j
                   in zip(a.tokens, b.tokens, a.token_ids, b.token_ids) if i == j), default=0.0)
        reused = sum(o.usage.cached_tokens for o in warm)
        total = sum(o.usage.prompt_tokens for o in warm)
        print(f"prefix_chunk={chunk:<3d}: outputs that differ from a fresh evaluation: {len(differ)} of {len(prompts)}"
              f"{f' (requests {differ})' if differ else ''}; largest log-prob gap on agreeing tokens {gap:.4f}; "
              f"prompt tokens reused {reused} of {total}; sequence {seconds[chunk]:.1f} s")
    print(f"time ratio (prefix_chunk={args.chunk} / 0): {seconds[args.chunk] / seconds[0]:.3f}")


if __name__ == "__main__":
    main()
