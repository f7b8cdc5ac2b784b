"""THE loop: runs any method's policy on questions, carries out its actions, records every step
with its Usage and returns the Traces. The CLI, the evaluation harness and any UI all call `run`
(one question) or `run_many` (many in lockstep, their model calls batched); `run` is `run_many` of one.

An iterative method's `LoopState` action is answered here too, by the one fixed-point rule
(`methods/fixed_point.py`): stop when an iteration would start from a state already seen, under
deterministic decoding.

Every model call of a run is a step of its trace: a judge that asks a model (`Assess`) and an LLM
reranker (after each Search) run as sub-policies inside the method's policy (`_expanded`), so their
Ask / Probe actions are batched, sampled, cached and recorded like the method's own.
"""
from __future__ import annotations

import hashlib
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from metarag.errors import BackendError, ConfigError, MetaRAGError
from metarag.llm.base import LLM, Decoding, TokenIds
from metarag.llm.batch import generate_many, score_many
from metarag.methods.fixed_point import LoopState, LoopStates
from metarag.policy.actions import Action, Ask, Assess, Clip, Note, Probe, Search
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


def question_seed(run_seed: int, question_id: str) -> int:
    """The rollout seed of a question in a run seeded `run_seed` whose method samples on its own
    (a request of temperature > 0, no run-level `Sampling`): the seed the harness gives that
    question's first sample (`evaluate.harness.sample_seed(run_seed, question_id, 0)`), 31 bits."""
    digest = hashlib.blake2b(f"{run_seed}:{question_id}:0".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF


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
    round's model requests go out at once to a back-end that does not batch (a server's slots).
    `models` holds the other LLMs that Ask / Probe actions name by spec string (`Ask.model`, e.g.
    EvoCtx's decision model), each built on first use (`build_named_llm`) and kept for the run.
    `seed` is the run's (`--seed`): a request whose method asks to sample (temperature > 0, as
    Search-o1's) in a run without `sampling` gets the seed `request_seed(question_seed(seed, question
    id), n)`, n counting the question's requests, so such a run repeats, and resumes, as it ran."""

    llm: LLM
    retriever: Retriever | None = None
    reranker: Reranker | None = None
    rerank_depth: int = 20
    sampling: Sampling | None = None
    workers: int = 1
    models: dict[str, LLM] = field(default_factory=dict)
    seed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def llm_for(self, model: str | None) -> LLM:
        """The LLM a request names: the run's own for None, else the model `model` names, built once."""
        if not model:
            return self.llm
        with self._lock:  # the harness may run questions from several threads on one runtime
            llm = self.models.get(model)
            if llm is None:
                llm = self.models[model] = build_named_llm(model)
        return llm


def build_named_llm(spec: str, **fields: Any) -> LLM:
    """The LLM a spec string names (`metarag.llm.registry`: "embedded-0.5b", "hf:PATH",
    "openai:MODEL@URL" ...), `fields` setting the rest of its `LLMSpec` (e.g. `prefix_chunk`); this
    is where it loads."""
    from metarag.llm.registry import make_llm, parse_llm_spec

    return make_llm(parse_llm_spec(spec, **fields))


def check_needs(method: Method, llm: LLM) -> None:
    """Refuse, before any question, a method whose per-token needs (`needs`: capability -> the one-line
    refusal naming the ways out) the back-end cannot meet (`provides`, see `llm.base.CAPABILITIES`).
    A back-end that does not declare `provides` is let through: the method's own check then fails."""
    provides = getattr(llm, "provides", None)
    if provides is None:
        return
    for need, refusal in getattr(method, "needs", {}).items():
        if need not in provides:
            raise ConfigError(f"{refusal} (the back-end: {llm.identity})")


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
    loop: LoopStates = field(default_factory=LoopStates)  # its loop states, for the fixed-point rule


def run_many(method: Method, questions: Sequence[Question], runtime: Runtime, *,
             seeds: Sequence[int] | None = None, window: int | None = None,
             on_step: Callable[[int, Step], None] | None = None,
             on_trace: Callable[[int, Trace], None] | None = None,
             skip: Callable[[int], bool] | None = None) -> list[Trace]:
    """Run `method` on every question in lockstep: each round, every policy's pending Ask and Probe
    actions go to the back-end as one batch (`metarag.llm.batch`), then Search / Assess / Note are
    carried out in turn, question by question. Returns the traces in question order, each the
    trace `run` gives; a failing policy records its error and the others go on.

    `seeds`: one rollout seed per question, for a run with `runtime.sampling` (G sampled rollouts of
    one question: `run_many(m, [q] * G, rt, seeds=range(G))`); without it every rollout uses
    `runtime.sampling.seed`. `window`: at most this many policies in flight (the largest batch); a
    finished one's place goes to the next question. `on_step(i, step)` and `on_trace(i, trace)`
    report as they happen, i being the question's position. `skip(i)`, asked when question i would
    start: True leaves it unrun, None in its place (a difficulty filter's samples of a question
    already decided)."""
    check_needs(method, runtime.llm)
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
                if skip is not None and skip(i):
                    continue
                sampling = runtime.sampling
                if sampling is not None and seeds is not None:
                    sampling = replace(sampling, seed=seeds[i])
                rollout = _Rollout(i, questions[i], _expanded(method.policy(questions[i]), runtime), sampling)
                _advance(rollout, None, method.name, report)
                if rollout.trace is None:
                    active.append(rollout)
                else:
                    settle(rollout)
            outcomes = _model_round(active, runtime)
            for rollout in active:
                outcome = outcomes.get(rollout.index)
                if outcome is None:  # Search, Note, a sub-policy's record: carried out now, in question order
                    try:
                        if isinstance(rollout.action, LoopState):  # the fixed-point rule (methods/fixed_point.py)
                            outcome = rollout.loop.check(rollout.action, rollout.sampling is not None)
                        else:
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
    """Send every pending Ask and Probe of the round as one batch per model they name (the run's
    LLM, or `Ask.model`'s); the steps and reply of each, or its exception, by question position."""
    asks = [r for r in active if isinstance(r.action, Ask)]
    probes = [r for r in active if isinstance(r.action, Probe)]
    decodings = {}
    for rollout in asks:
        decoding = rollout.action.decoding
        if rollout.sampling is not None:
            decoding = rollout.sampling.decoding(decoding, rollout.asks)
        elif decoding.temperature > 0:  # the method's own sampling, seeded by the run's seed
            decoding = replace(decoding, seed=request_seed(question_seed(runtime.seed, rollout.question.id),
                                                           rollout.asks))
        rollout.asks += 1
        rollout.loop.sampled |= decoding.temperature > 0  # a sampled question never stops at a fixed point
        decodings[rollout.index] = decoding
    outcomes: dict[int, tuple[list[Step], Any] | Exception] = {}
    for model, group in _by_model(asks).items():
        try:
            llm = runtime.llm_for(model)
        except Exception as exc:  # a model that cannot be built fails the questions that asked for it
            outcomes.update((r.index, exc) for r in group)
            continue
        completions = generate_many(llm, [r.action.prompt for r in group], [decodings[r.index] for r in group],
                                    workers=runtime.workers)
        for rollout, completion in zip(group, completions):
            outcomes[rollout.index] = completion if isinstance(completion, Exception) else \
                _generated(rollout.action, completion)
    for model, group in _by_model(probes).items():
        try:
            llm = runtime.llm_for(model)
        except Exception as exc:
            outcomes.update((r.index, exc) for r in group)
            continue
        scores = score_many(llm, [r.action.prompt for r in group], [r.action.labels for r in group],
                            workers=runtime.workers)
        for rollout, scored in zip(group, scores):
            outcomes[rollout.index] = scored if isinstance(scored, Exception) else _scored(rollout.action, scored)
    return outcomes


def _by_model(rollouts: list[_Rollout]) -> dict[str | None, list[_Rollout]]:
    """The rollouts by the model their pending request names, in order (None: the run's LLM)."""
    groups: dict[str | None, list[_Rollout]] = {}
    for rollout in rollouts:
        groups.setdefault(rollout.action.model or None, []).append(rollout)
    return groups


def _generated(action: Ask, completion: Completion) -> tuple[list[Step], Completion]:
    # per-token data only when the request asked for it: traces stay small
    tokens = completion.tokens if action.decoding.wants_tokens else None
    prompt, ids = _recorded_prompt(action.prompt)
    return [Generate(completion.usage, action.purpose, prompt, completion.text, tokens, ids, action.model or None,
                     completion.finish_reason == "length")], \
        completion


def _scored(action: Probe, scores: LabelScores) -> tuple[list[Step], LabelScores]:
    prompt, ids = _recorded_prompt(action.prompt)
    return [Score(scores.usage, action.purpose, prompt, scores.labels, scores.probs, ids, action.model or None)], scores


def _recorded_prompt(prompt: Any) -> tuple[tuple, tuple[int, ...] | None]:
    """A step's (messages, prompt token ids): a token-id prompt is recorded by its ids."""
    if isinstance(prompt, TokenIds):
        return (), tuple(prompt.ids)
    return tuple(prompt), None


def execute(action: Action, runtime: Runtime) -> tuple[list[Step], Any]:
    """Carry out one Search or Note, or record a sub-policy's steps (Ask and Probe go in batches,
    `_model_round`; Assess and reranking are expanded into sub-policies, `_expanded`); return the
    steps that record it and the reply for the policy."""
    if isinstance(action, Search):
        return _search(action, runtime)
    if isinstance(action, _Record):
        return list(action.steps), None
    if isinstance(action, Note):
        return [Decide(Usage(), action.name, action.choice, dict(action.signals))], None
    if isinstance(action, Clip):
        return _clip(action, runtime.llm)
    raise TypeError(f"a method yielded {action!r}, which is not an action")


def _clip(action: Clip, llm: Any) -> tuple[list[Step], str]:
    """`Clip`: the first `max_tokens` of the text's tokens (the back-end's `piece_tokens`: no special
    tokens added); whole where the back-end has no tokenizer."""
    if not callable(getattr(llm, "piece_tokens", None)):
        return [], action.text
    ids = list(llm.piece_tokens(action.text))
    if len(ids) <= action.max_tokens:
        return [], action.text
    kept = llm.detokenize(ids[:action.max_tokens])
    return [Decide(Usage(), action.purpose, "clip", {"tokens": float(len(ids)),
                                                     "kept": float(action.max_tokens)})], kept


def _search(action: Search, runtime: Runtime) -> tuple[list[Step], list]:
    if runtime.retriever is None:
        raise ConfigError("this method retrieves, but the run has no retriever (give --corpus)")
    start = time.perf_counter()
    hits = runtime.retriever.search(action.query, action.k, exclude=action.exclude)
    usage = Usage(latency_s=time.perf_counter() - start, retrieval_calls=1)
    return [Retrieve(usage, action.query, action.k, tuple(hits))], hits


# ------------------------------------------------------------------------------ sub-policies
@dataclass(frozen=True)
class _Record:
    """Steps a sub-policy's end puts in the trace (a Judge or Rerank step); costs no request."""

    steps: tuple[Step, ...]


def _expanded(policy: Generator[Any, Any, Any], runtime: Runtime) -> Generator[Any, Any, Any]:
    """`policy` with every `Assess` run as the judge's sub-policy and, when the run reranks, every
    Search followed by the reranker's: their Ask / Probe actions pass up to the loop like the
    policy's own, then a Judge / Rerank step records the outcome. The same value as `policy`."""
    reply = None
    try:
        while True:
            try:
                action = policy.send(reply)
            except StopIteration as stop:
                return stop.value
            if isinstance(action, Assess):
                reply = yield from _assessed(action, runtime)
            elif isinstance(action, Search) and runtime.reranker is not None:
                reply = yield from _reranked(action, runtime)
            else:
                reply = yield action
    finally:
        policy.close()


def _assessed(action: Assess, runtime: Runtime) -> Generator[Any, Any, Any]:
    """A judge's verdict, and its Judge step. A judge that asks a model costs its requests' steps,
    so its Judge step's Usage is empty; one that computes is timed."""
    start = time.perf_counter()
    result = action.judge.judge(action.inputs)
    if isinstance(result, Generator):
        verdict = yield from _expanded(result, runtime)
        usage = Usage()
    else:
        verdict, usage = result, Usage(latency_s=time.perf_counter() - start)
    # input sizes: words of a text, items of a list (e.g. an evidence boundary)
    sizes = {name: len(value.split()) if isinstance(value, str) else len(value)
             for name, value in action.inputs.items()}
    yield _Record((Judge(usage, action.judge.name, verdict.verdict, verdict.score, sizes, verdict.detail,
                         verdict.fallback),))
    return verdict


def _reranked(action: Search, runtime: Runtime) -> Generator[Any, Any, list]:
    """A Search with the run's reranker: `rerank_depth` candidates retrieved, the reranker's top k
    kept, its requests (if it asks the LLM) and a Rerank step recorded."""
    reranker = runtime.reranker
    hits = yield replace(action, k=max(action.k, runtime.rerank_depth))
    start = time.perf_counter()
    result = reranker.rerank(action.query, hits, action.k)
    if isinstance(result, Generator):
        reranked = yield from _expanded(result, runtime)
        usage = Usage()
    else:
        reranked, usage = result, Usage(latency_s=time.perf_counter() - start)
    yield _Record((Rerank(usage, reranker.name, action.query, tuple(h.passage.id for h in hits), reranked.hits,
                          reranked.fallback),))
    return list(reranked.hits)


def drive(call: Any, runtime: Runtime) -> tuple[Any, Trace]:
    """What a judge's or reranker's call comes to, run through the loop on its own (for tools and
    tests; a method yields Assess instead): (its return value, the trace of its requests). `call`
    is a sub-policy or a plain value; an exception inside it is raised again here."""
    driven = _Driven(call)
    trace = run(driven, Question("drive", ""), runtime)
    if driven.error is not None:
        raise driven.error
    return driven.value, trace


class _Driven:
    name = "drive"

    def __init__(self, call: Any):
        self.call, self.value, self.error = call, None, None

    def policy(self, question: Question) -> Policy:
        try:
            self.value = (yield from self.call) if isinstance(self.call, Generator) else self.call
        except Exception as exc:
            self.error = exc
            raise
        return ""
