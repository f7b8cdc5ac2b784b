"""Readable renderings of trace steps for the terminal: one line per step, then the answer."""
from __future__ import annotations

from collections.abc import Sequence

from metarag.evaluate.cost import served_usage
from metarag.records import Answer, Decide, Generate, Judge, Rerank, Retrieve, Score, Step, Trace, Usage


def format_usage(u: Usage) -> str:
    parts = [f"{u.latency_s:.2f} s"]
    if u.llm_requests:
        tok = f"{u.prompt_tokens}+{u.completion_tokens} tok"
        if u.cached_tokens:
            tok += f" ({u.cached_tokens} cached)"
        parts.append(tok)
    if u.cache_hits:
        # a step of several requests (a reranker's) may have only some of them cached
        parts.append("from response cache" if u.cache_hits >= u.llm_requests
                     else f"{u.cache_hits} of {u.llm_requests} requests from response cache")
    return ", ".join(parts)


def format_step(step: Step) -> str:
    """One step as a line (a few for retrieval: one per passage title)."""
    if isinstance(step, Retrieve):
        titles = "\n".join(f"      {i}. {h.passage.title}  ({h.retriever} {h.score:.3f})"
                           for i, h in enumerate(step.hits, 1))
        return f"  retrieve  [{format_usage(step.usage)}] {step.query!r} -> {len(step.hits)} passages\n{titles}"
    if isinstance(step, Generate):
        text = " ".join(step.text.split())
        return f"  generate  [{format_usage(step.usage)}] {step.purpose}: {text[:300]}"
    if isinstance(step, Score):
        probs = ", ".join(f"P({label})={p:.3f}" for label, p in zip(step.labels, step.probs))
        return f"  score     [{format_usage(step.usage)}] {step.purpose}: {probs}"
    if isinstance(step, Judge):
        score = f" ({step.score:.3f})" if step.score is not None else ""
        detail = f" — {step.detail[:160]}" if step.detail else ""
        fallback = f" [fallback: {step.fallback[:80]}]" if step.fallback else ""
        return f"  judge     [{format_usage(step.usage)}] {step.name}: {step.verdict!r}{score}{detail}{fallback}"
    if isinstance(step, Rerank):
        moved = ", ".join(h.passage.title for h in step.hits)
        note = f" [kept input order: {step.fallback}]" if step.fallback else ""
        return f"  rerank    [{format_usage(step.usage)}] {step.reranker}: {len(step.before)} -> {moved}{note}"
    if isinstance(step, Decide):
        signals = ", ".join(f"{k}={v:.3f}" for k, v in step.signals.items())
        return f"  decide    {step.name}: {step.choice}" + (f" ({signals})" if signals else "")
    if isinstance(step, Answer):
        return f"  answer    {step.text}"
    return f"  {step.kind}"


def format_trace(trace: Trace, *, header_only: bool = False) -> str:
    """The whole trace (or, with header_only, the summary after live step lines were printed)."""
    lines = [] if header_only else [f"Q: {trace.question}  [{trace.method}]",
                                    *(format_step(s) for s in trace.steps)]
    lines.append(f"Answer: {trace.answer}" if trace.error is None else f"Error: {trace.error}")
    lines.append(format_totals(trace.steps))
    return "\n".join(lines)


def format_totals(steps: Sequence[Step]) -> str:
    """The totals line: all requests (as the papers count them), then what the model served apart from
    what metarag's response cache answered, with the model-served tokens and time."""
    u = sum((s.usage for s in steps), Usage())
    line = (f"Total: {u.latency_s:.2f} s, {u.llm_requests} LLM requests, {u.prompt_tokens} prompt + "
            f"{u.completion_tokens} completion tokens ({u.cached_tokens} cached), "
            f"{u.retrieval_calls} retrieval calls")
    if u.cache_hits:
        served = served_usage(steps)
        line += (f"\nServed by the model: {served.llm_requests} of the {u.llm_requests} requests "
                 f"({u.cache_hits} from the response cache), {served.prompt_tokens} prompt + "
                 f"{served.completion_tokens} completion tokens, {served.latency_s:.2f} s")
    return line
