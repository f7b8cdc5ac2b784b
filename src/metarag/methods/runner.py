"""THE loop: runs any method's policy on questions, carries out its actions, records every step
with its Usage and returns the Traces. The CLI, the evaluation harness and any UI all call `run`
(one question) or `run_many` (many in lockstep, their model calls batched); `run` is `run_many` of one.
"""
from __future__ import annotations

import hashlib
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from metarag.errors import BackendError, ConfigError, MetaRAGError
from metarag.llm.base import LLM, Decoding, TokenIds
from metarag.llm.batch import generate_many, score_many
from metarag.methods.actions import Action, Ask, Assess, Note, Probe, Search
from metarag.records import (
    Answer,
    Completion,
    Decide,
    Generate,
    Judge,
    LabelScores,
    Question,
    Rerank,
    Retrieve,
    Score,
    Step,
    Trace,
    Usage,
)
from metarag.rerank.base import Reranker
from metarag.retrieve.base import Retriever

Policy = Generator[Action, Any, str]


class Method(Protocol):
    """A method is a policy over the shared loop: `policy(question)` yields actions and returns the
    final short answer."""

    name: str

    def policy(self, question: Question) -> Policy: ...


@dataclass(frozen=True)
class Sampling:
    """A run-level decoding override: every Ask of the run is decoded at this `temperature` and
    `top_p` instead of its method's (greedy) decoding, so one policy serves greedy evaluation and
    sampled rollouts; `max_tokens`, `stop` and `logprobs` stay the method's. `seed` is the rollout's:
    the n-th Ask of a rollout (n = 0, 1, ...) is sampled with `request_seed(seed, n)`."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ConfigError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling top_p must be in (0, 1], got {self.top_p}")

    def decoding(self, decoding: Decoding, n: int) -> Decoding:
        """The decoding of the rollout's n-th Ask, whose method asked for `decoding`."""
        return replace(decoding, temperature=self.temperature, top_p=self.top_p, seed=request_seed(self.seed, n))


def request_seed(rollout_seed: int, n: int) -> int:
    """The seed of the n-th request of the rollout seeded `rollout_seed`: distinct across requests
    and rollouts (a hash of both, so rollout 1's first request is not rollout 0's second), the same
    on every re-run, and 31 bits, which every back-end accepts."""
    digest = hashlib.blake2b(f"{rollout_seed}:{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF


@dataclass
class Runtime:
    """The components a run carries out actions with. `retriever` is None for closed-book runs.
    With a `reranker`, each Search retrieves `rerank_depth` candidates and the reranker keeps k
    (the study reranks after every retrieval round and keeps the top five, §4.3.4). `sampling`
    overrides every Ask's decoding (None: each method's own, greedy). `workers` is how many of a
    round's model requests go out at once to a back-end that does not batch (a server's slots)."""

    llm: LLM
    retriever: Retriever | None = None
    reranker: Reranker | None = None
    rerank_depth: int = 20
    sampling: Sampling | None = None
    workers: int = 1


def run(method: Method, question: Question, runtime: Runtime,
        on_step: Callable[[Step], None] | None = None, *, seed: int | None = None) -> Trace:
    """Run `method` on `question`; never raises for a failure inside the method: the trace records
    the error (with the steps done before it) and the caller decides what to do with it. `seed` is
    the rollout seed of a sampled run (default: `runtime.sampling.seed`)."""
    return run_many(method, [question], runtime, seeds=None if seed is None else [seed],
                    on_step=None if on_step is None else lambda _, step: on_step(step))[0]


@dataclass
class _Rollout:
    """One policy in flight: its steps so far and the action it waits on."""

    index: int
    question: Question
    policy: Policy
    sampling: Sampling | None
    steps: list[Step] = field(default_factory=list)
    action: Any = None
    asks: int = 0  # Asks made so far: the n of the next one's request seed
    trace: Trace | None = None


def run_many(method: Method, questions: Sequence[Question], runtime: Runtime, *,
             seeds: Sequence[int] | None = None, window: int | None = None,
             on_step: Callable[[int, Step], None] | None = None,
             on_trace: Callable[[int, Trace], None] | None = None) -> list[Trace]:
    """Run `method` on every question in lockstep: each round, every policy's pending Ask and Probe
    actions go to the back-end as one batch (`metarag.llm.batch`), then Search / Assess / Note are
    carried out in turn, question by question. Returns the traces in question order, each the
    trace `run` gives; a failing policy records its error and the others go on.

    `seeds`: one rollout seed per question, for a run with `runtime.sampling` (G sampled rollouts of
    one question: `run_many(m, [q] * G, rt, seeds=range(G))`); without it every rollout uses
    `runtime.sampling.seed`. `window`: at most this many policies in flight (the largest batch); a
    finished one's place goes to the next question. `on_step(i, step)` and `on_trace(i, trace)`
    report as they happen, i being the question's position."""
    questions = list(questions)
    if seeds is not None:
        seeds = list(seeds)
        if runtime.sampling is None:
            raise ConfigError("rollout seeds were given, but the run does not sample (no Runtime.sampling)")
        if len(seeds) != len(questions):
            raise ConfigError(f"{len(seeds)} rollout seeds for {len(questions)} questions")
    if window is not None and window < 1:
        raise ConfigError(f"the batch window must be at least 1, got {window}")
    if runtime.workers < 1:
        raise ConfigError(f"workers must be at least 1, got {runtime.workers}")
    traces: list[Trace | None] = [None] * len(questions)
    waiting = deque(range(len(questions)))
    active: list[_Rollout] = []

    def report(rollout: _Rollout, step: Step) -> None:
        rollout.steps.append(step)
        if on_step is not None:
            on_step(rollout.index, step)

    def settle(rollout: _Rollout) -> None:
        traces[rollout.index] = rollout.trace
        if on_trace is not None:
            on_trace(rollout.index, rollout.trace)

    try:
        while waiting or active:
            while waiting and (window is None or len(active) < window):
                i = waiting.popleft()
                sampling = runtime.sampling
                if sampling is not None and seeds is not None:
                    sampling = replace(sampling, seed=seeds[i])
                rollout = _Rollout(i, questions[i], method.policy(questions[i]), sampling)
                _advance(rollout, None, method.name, report)
                if rollout.trace is None:
                    active.append(rollout)
                else:
                    settle(rollout)
            outcomes = _model_round(active, runtime)
            for rollout in active:
                outcome = outcomes.get(rollout.index)
                if outcome is None:  # Search, Assess, Note: carried out now, in question order
                    try:
                        outcome = execute(rollout.action, runtime)
                    except Exception as exc:
                        outcome = exc
                if isinstance(outcome, Exception):
                    _fail(rollout, outcome, method.name)
                else:
                    new_steps, reply = outcome
                    try:
                        for step in new_steps:
                            report(rollout, step)
                    except Exception as exc:  # a failing on_step fails its question, as a failing action does
                        _fail(rollout, exc, method.name)
                    else:
                        _advance(rollout, reply, method.name, report)
                if rollout.trace is not None:
                    settle(rollout)
            active = [r for r in active if r.trace is None]
    finally:
        for rollout in active:  # an interrupt (KeyboardInterrupt, a failing callback) leaves no policy open
            rollout.policy.close()
    return traces  # type: ignore[return-value]  # every place is settled once the loop ends


def _advance(rollout: _Rollout, reply: Any, method: str, report: Callable[[_Rollout, Step], None]) -> None:
    """Send the policy its reply; keep the next action, or settle the trace with its answer or error."""
    try:
        rollout.action = rollout.policy.send(reply)
    except StopIteration as stop:
        answer = (stop.value or "").strip()
        report(rollout, Answer(Usage(), answer))
        rollout.trace = Trace(rollout.question.id, rollout.question.text, method, tuple(rollout.steps),
                              answer=answer)
        rollout.policy.close()
    except Exception as exc:
        _fail(rollout, exc, method)


def _fail(rollout: _Rollout, exc: Exception, method: str) -> None:
    retryable = False
    if isinstance(exc, MetaRAGError):
        error = f"{type(exc).__name__}: {exc}"
        retryable = isinstance(exc, BackendError) and exc.retryable
    else:  # a bug or a library failure: keep the run going, keep the evidence
        where = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
    rollout.policy.close()
    rollout.trace = Trace(rollout.question.id, rollout.question.text, method, tuple(rollout.steps),
                          error=error, retryable=retryable)


def _model_round(active: list[_Rollout], runtime: Runtime) -> dict[int, tuple[list[Step], Any] | Exception]:
    """Send every pending Ask and Probe of the round as one batch each; the steps and reply of each,
    or its exception, by question position."""
    asks = [r for r in active if isinstance(r.action, Ask)]
    probes = [r for r in active if isinstance(r.action, Probe)]
    decodings = []
    for rollout in asks:
        decoding = rollout.action.decoding
        if rollout.sampling is not None:
            decoding = rollout.sampling.decoding(decoding, rollout.asks)
        rollout.asks += 1
        decodings.append(decoding)
    outcomes: dict[int, tuple[list[Step], Any] | Exception] = {}
    completions = generate_many(runtime.llm, [r.action.prompt for r in asks], decodings, workers=runtime.workers)
    for rollout, completion in zip(asks, completions):
        outcomes[rollout.index] = completion if isinstance(completion, Exception) else \
            _generated(rollout.action, completion)
    scores = score_many(runtime.llm, [r.action.prompt for r in probes], [r.action.labels for r in probes],
                        workers=runtime.workers)
    for rollout, scored in zip(probes, scores):
        outcomes[rollout.index] = scored if isinstance(scored, Exception) else _scored(rollout.action, scored)
    return outcomes


def _generated(action: Ask, completion: Completion) -> tuple[list[Step], Completion]:
    # per-token data only when the request asked for it: traces stay small
    tokens = completion.tokens if action.decoding.wants_tokens else None
    prompt, ids = _recorded_prompt(action.prompt)
    return [Generate(completion.usage, action.purpose, prompt, completion.text, tokens, ids)], completion


def _scored(action: Probe, scores: LabelScores) -> tuple[list[Step], LabelScores]:
    prompt, ids = _recorded_prompt(action.prompt)
    return [Score(scores.usage, action.purpose, prompt, scores.labels, scores.probs, ids)], scores


def _recorded_prompt(prompt: Any) -> tuple[tuple, tuple[int, ...] | None]:
    """A step's (messages, prompt token ids): a token-id prompt is recorded by its ids."""
    if isinstance(prompt, TokenIds):
        return (), tuple(prompt.ids)
    return tuple(prompt), None


def execute(action: Action, runtime: Runtime) -> tuple[list[Step], Any]:
    """Carry out one Search, Assess or Note (Ask and Probe go in batches, `_model_round`); return the
    steps that record it and the reply for the policy."""
    if isinstance(action, Search):
        return _search(action, runtime)
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
