"""THE loop: runs any method's policy on a question, carries out its actions, records every step
with its Usage and returns the Trace. The CLI, the evaluation harness and any UI all call `run`."""
from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from metarag.errors import BackendError, ConfigError, MetaRAGError
from metarag.llm.base import LLM, generate
from metarag.methods.actions import Action, Ask, Assess, Note, Probe, Search
from metarag.records import Answer, Decide, Generate, Judge, Question, Rerank, Retrieve, Score, Step, Trace, Usage
from metarag.rerank.base import Reranker
from metarag.retrieve.base import Retriever

Policy = Generator[Action, Any, str]


class Method(Protocol):
    """A method is a policy over the shared loop: `policy(question)` yields actions and returns the
    final short answer."""

    name: str

    def policy(self, question: Question) -> Policy: ...


@dataclass
class Runtime:
    """The components a run carries out actions with. `retriever` is None for closed-book runs.
    With a `reranker`, each Search retrieves `rerank_depth` candidates and the reranker keeps k
    (the study reranks after every retrieval round and keeps the top five, §4.3.4)."""

    llm: LLM
    retriever: Retriever | None = None
    reranker: Reranker | None = None
    rerank_depth: int = 20


def run(method: Method, question: Question, runtime: Runtime,
        on_step: Callable[[Step], None] | None = None) -> Trace:
    # execute() may record two steps for one action (retrieve, then rerank): it returns a list
    """Run `method` on `question`; never raises for a failure inside the method: the trace records
    the error (with the steps done before it) and the caller decides what to do with it."""
    steps: list[Step] = []
    retryable = False
    policy = method.policy(question)
    reply: Any = None
    try:
        while True:
            action = policy.send(reply)
            new_steps, reply = execute(action, runtime)
            for step in new_steps:
                steps.append(step)
                if on_step is not None:
                    on_step(step)
    except StopIteration as stop:
        answer = (stop.value or "").strip()
        final = Answer(Usage(), answer)
        steps.append(final)
        if on_step is not None:
            on_step(final)
        return Trace(question.id, question.text, method.name, tuple(steps), answer=answer)
    except MetaRAGError as exc:
        error = f"{type(exc).__name__}: {exc}"
        retryable = isinstance(exc, BackendError) and exc.retryable
    except Exception as exc:  # a bug or a library failure: keep the run going, keep the evidence
        where = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
    finally:
        policy.close()
    return Trace(question.id, question.text, method.name, tuple(steps), error=error, retryable=retryable)


def execute(action: Action, runtime: Runtime) -> tuple[list[Step], Any]:
    """Carry out one action; return the steps that record it and the reply for the policy."""
    if isinstance(action, Search):
        return _search(action, runtime)
    if isinstance(action, Ask):
        completion = generate(runtime.llm, action.prompt, action.decoding)
        return [Generate(completion.usage, action.purpose, action.prompt, completion.text,
                         completion.logprobs)], completion
    if isinstance(action, Probe):
        scores = runtime.llm.score_labels(action.prompt, action.labels)
        return [Score(scores.usage, action.purpose, action.prompt, scores.labels, scores.probs)], scores
    if isinstance(action, Assess):
        start = time.perf_counter()
        verdict = action.judge.judge(runtime, action.inputs)
        usage = verdict.usage if verdict.usage.llm_requests else Usage(latency_s=time.perf_counter() - start)
        # input sizes: words of a text, items of a list (e.g. an evidence boundary)
        sizes = {name: len(value.split()) if isinstance(value, str) else len(value)
                 for name, value in action.inputs.items()}
        return [Judge(usage, action.judge.name, verdict.verdict, verdict.score, sizes, verdict.detail,
                      verdict.fallback)], verdict
    if isinstance(action, Note):
        return [Decide(Usage(), action.name, action.choice, dict(action.signals))], None
    raise TypeError(f"a method yielded {action!r}, which is not an action")


def _search(action: Search, runtime: Runtime) -> tuple[list[Step], list]:
    if runtime.retriever is None:
        raise ConfigError("this method retrieves, but the run has no retriever (give --corpus)")
    depth = max(action.k, runtime.rerank_depth) if runtime.reranker is not None else action.k
    start = time.perf_counter()
    hits = runtime.retriever.search(action.query, depth, exclude=action.exclude)
    usage = Usage(latency_s=time.perf_counter() - start, retrieval_calls=1)
    steps: list[Step] = [Retrieve(usage, action.query, depth, tuple(hits))]
    if runtime.reranker is None:
        return steps, hits
    reranked = runtime.reranker.rerank(action.query, hits, action.k)
    steps.append(Rerank(reranked.usage, runtime.reranker.name, action.query,
                        tuple(h.passage.id for h in hits), reranked.hits, reranked.fallback))
    return steps, list(reranked.hits)
