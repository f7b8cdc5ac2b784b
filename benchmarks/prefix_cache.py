"""KV-cache prefix reuse of the embedded llama.cpp back-end.

Prints the latency of a call that shares an ~800-token evidence prefix with the call before it,
divided by the latency of the same call with a cold cache (target: <= 0.1); and the same ratio
when an unrelated prompt ran in between (served by the saved prefix states).

    .venv/bin/python benchmarks/prefix_cache.py [--model qwen2.5-coder-1.5b-instruct]
"""
from __future__ import annotations

import argparse
import time

from metarag.llm.base import Decoding
from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
from metarag.records import Message


def evidence_prompt(question: str) -> list[Message]:
    passages = "\n\n".join(
        f"[{i}] Town {i}\nTown {i} is a small settlement founded in {1700 + 7 * i} on the river Aa{i}. "
        f"Its mayor in 2010 was Person {i}, and its population at the 2011 census was {1000 + 37 * i}."
        for i in range(1, 13))
    return [Message("system", "Answer the question using the passages. Give a short answer only."),
            Message("user", f"Passages:\n{passages}\n\nQuestion: {question}\nShort answer:")]


def timed(llm: LlamaCppLLM, messages) -> tuple[float, int, int]:
    start = time.perf_counter()
    out = llm.chat(messages, Decoding(max_tokens=8))
    return time.perf_counter() - start, out.usage.prompt_tokens, out.usage.cached_tokens


def cold(llm: LlamaCppLLM) -> None:
    """Forget every saved state and leave an unrelated prompt in the context."""
    llm._states.clear()
    llm._state_bytes = 0
    llm.chat([Message("user", "Say hello.")], Decoding(max_tokens=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = parser.parse_args()
    llm = LlamaCppLLM(LlamaCppSettings(embedded=args.model))
    first, second = evidence_prompt("Who was the mayor of Town 3?"), evidence_prompt("When was Town 9 founded?")

    cold(llm)
    t_cold, n_prompt, _ = timed(llm, second)
    cold(llm)
    timed(llm, first)
    t_warm, _, cached_warm = timed(llm, second)
    cold(llm)
    timed(llm, first)
    llm.chat([Message("user", "Name a colour.")], Decoding(max_tokens=2))  # unrelated call between
    t_between, _, cached_between = timed(llm, second)

    print(f"model: {llm.identity}")
    print(f"prompt tokens: {n_prompt}")
    print(f"cold cache:                       {t_cold:6.2f} s")
    print(f"after a call sharing the prefix:  {t_warm:6.2f} s  ({cached_warm} tokens reused)"
          f"  ratio {t_warm / t_cold:.3f}")
    print(f"same, with an unrelated call between: {t_between:6.2f} s  ({cached_between} tokens reused)"
          f"  ratio {t_between / t_cold:.3f}")


if __name__ == "__main__":
    main()
