"""The records every stage passes along: questions, passages, hits, completions, usage and traces.

Frozen dataclasses, no I/O. Traces serialize to plain JSON (one trace per line in a run's
results.jsonl) and load back to equal objects; `to_json` / `from_json` do both.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of a corpus."""

    id: str
    title: str
    text: str

    def contents(self) -> str:
        """Title and text as one string, the form that is indexed and shown to models."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class Question:
    """A benchmark question with its gold answers (first the answer, then aliases)."""

    id: str
    text: str
    answers: tuple[str, ...] = ()
    supporting_ids: tuple[str, ...] = ()
    type: str | None = None
    hops: int | None = None


@dataclass(frozen=True)
class Hit:
    """A passage as one retriever ranked it."""

    passage: Passage
    score: float
    retriever: str


@dataclass(frozen=True)
class Usage:
    """What one step cost. A trace's cost is the sum of its steps' Usage, never a side counter.

    `cached_tokens` are prompt tokens the back-end did not recompute (KV-cache prefix reuse or a
    server's prompt cache); `cache_hits` counts requests answered from metarag's persistent response
    cache, whose token counts are those of the original request and whose latency is the lookup's.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    llm_requests: int = 0
    retrieval_calls: int = 0
    cache_hits: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: str
    content: str


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text piece, log-probability and the top alternatives at that position
    (when asked), its id in the back-end's vocabulary, the character offset of its piece in the raw
    output, and the entropy (nats) of the model's full next-token distribution there (None where the
    back-end returns only the top alternatives). Old traces without id/offset/entropy load as is."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    id: int | None = None
    offset: int = 0
    entropy: float | None = None


@dataclass(frozen=True)
class Completion:
    """What an LLM returned for one request.

    `tokens` are every generated token, in order, including the one whose text crossed a stop string
    (it was generated and is counted in `usage.completion_tokens`) and never an end-of-sequence
    token. `text` is the output cut before the stop string, so the tokens' pieces joined start with
    `text`. `finish_reason`: "stop" (the stop string `stop` fired; `stop` is None when a server did
    not say which), "eos" (the model ended its turn) or "length" (max_tokens). `prompt_ids` are the
    prompt's token ids as the model saw them (None where a back-end cannot tell). `internals` holds
    attention weights / hidden states when a request asked for them; it is never serialized.
    """

    RENAMED: ClassVar[dict[str, str]] = {"logprobs": "tokens"}

    text: str
    usage: Usage = Usage()
    tokens: tuple[TokenLogprob, ...] | None = None
    finish_reason: str = "stop"
    stop: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    internals: Any = field(default=None, compare=False, metadata={"transient": True})

    @property
    def logprobs(self) -> tuple[TokenLogprob, ...] | None:
        """The generated tokens (the name of this field before tokens carried ids and offsets)."""
        return self.tokens

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The ids of the generated tokens, None where the back-end does not return ids."""
        if self.tokens is None or any(t.id is None for t in self.tokens):
            return None
        return tuple(t.id for t in self.tokens)  # type: ignore[misc]


@dataclass(frozen=True)
class LabelScores:
    """Probability of each whole label as the model's continuation (`LLM.score_labels`): the product
    of its tokens' probabilities, teacher-forced, summed over the label's accepted variants.

    Read it with `p(label)`, the one rule every consumer uses for "no mass on any label"."""

    MIN_MASS: ClassVar[float] = 1e-4  # below this total, the labels say nothing (SIM-RAG critic's rule)

    labels: tuple[str, ...]
    probs: tuple[float, ...]
    usage: Usage = Usage()

    def prob(self, label: str) -> float:
        return self.probs[self.labels.index(label)]

    @property
    def mass(self) -> float:
        """The total probability of the labels."""
        return float(sum(self.probs))

    def p(self, label: str) -> tuple[float, str | None]:
        """(P(label) renormalized over the labels, fallback). When the labels together get less than
        MIN_MASS the probability is uniform, 1/len(labels), and `fallback` says why: the caller must
        then return its documented default verdict (never a silent positive one) and record it."""
        index = self.labels.index(label)
        total = self.mass
        if total < self.MIN_MASS:
            return 1.0 / len(self.labels), (f"no probability mass on the labels {'/'.join(self.labels)} "
                                            f"(total {total:.2g})")
        return self.probs[index] / total, None

    def normalized(self) -> dict[str, float]:
        """The label probabilities renormalized over the labels alone (uniform under MIN_MASS)."""
        return {label: self.p(label)[0] for label in self.labels}

    def best(self) -> str:
        return self.labels[max(range(len(self.labels)), key=self.probs.__getitem__)]


# ----------------------------------------------------------------------------------------- steps
@dataclass(frozen=True)
class Step:
    """Base of the typed, append-only trace steps; `kind` names the subclass in JSON."""

    kind: ClassVar[str] = "step"
    usage: Usage


@dataclass(frozen=True)
class Retrieve(Step):
    """A retrieval call: the query as sent and the hits that came back, best first."""

    kind: ClassVar[str] = "retrieve"
    query: str
    k: int
    hits: tuple[Hit, ...]


@dataclass(frozen=True)
class Rerank(Step):
    """A reranker's reordering of one retrieval's candidates: the ids in, the hits kept, and the
    reason when it fell back to the input order (e.g. an unparseable listwise answer)."""

    kind: ClassVar[str] = "rerank"
    reranker: str
    query: str
    before: tuple[str, ...]
    hits: tuple[Hit, ...]
    fallback: str | None = None


@dataclass(frozen=True)
class Generate(Step):
    """An LLM generation; `purpose` says what the method asked it for (answer, reason, rewrite...)."""

    kind: ClassVar[str] = "generate"
    purpose: str
    prompt: tuple[Message, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None  # the generated tokens, kept only when asked for
    # a prompt given as token ids (then `prompt` is empty); absent from the JSON when None
    prompt_ids: tuple[int, ...] | None = field(default=None, metadata={"omit_default": True})
    # the spec string of the model asked when it is not the run's LLM (`Ask.model`); absent when None
    model: str | None = field(default=None, metadata={"omit_default": True})
    # the reply ran into its max_tokens (finish_reason "length"): it was cut, not ended by a stop
    # string or the model; absent when False
    cut: bool = field(default=False, metadata={"omit_default": True})


@dataclass(frozen=True)
class Score(Step):
    """A whole-label probability read (`LLM.score_labels`), e.g. a yes/no probe."""

    kind: ClassVar[str] = "score"
    purpose: str
    prompt: tuple[Message, ...]
    labels: tuple[str, ...]
    probs: tuple[float, ...]
    prompt_ids: tuple[int, ...] | None = field(default=None, metadata={"omit_default": True})
    model: str | None = field(default=None, metadata={"omit_default": True})  # as in Generate


@dataclass(frozen=True)
class Judge(Step):
    """A judge's verdict (similarity, entailment, sufficiency ...) with its score and input sizes."""

    kind: ClassVar[str] = "judge"
    name: str
    verdict: str
    score: float | None = None
    inputs: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    fallback: str | None = None  # why the verdict is the judge's default (e.g. unparseable output)


@dataclass(frozen=True)
class Decide(Step):
    """A control decision a method took (a metacognitive transition, RETRIEVE vs THINK ...)."""

    kind: ClassVar[str] = "decide"
    name: str
    choice: str
    signals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer(Step):
    """The method's final short answer; always the last step of a successful trace."""

    kind: ClassVar[str] = "answer"
    text: str


STEP_TYPES: dict[str, type[Step]] = {cls.kind: cls for cls in (Retrieve, Rerank, Generate, Score, Judge, Decide,
                                                                 Answer)}


@dataclass(frozen=True)
class Trace:
    """Everything one method did on one question, in order, with the final answer or the error."""

    question_id: str
    question: str
    method: str
    steps: tuple[Step, ...] = ()
    answer: str | None = None
    error: str | None = None
    retryable: bool = False  # the error was a BackendError(retryable=True): a re-run tries the question again

    @property
    def usage(self) -> Usage:
        total = Usage()
        for step in self.steps:
            total = total + step.usage
        return total

    def of_kind(self, cls: type[Step]) -> list:
        return [s for s in self.steps if isinstance(s, cls)]

    def retrieved_ids(self) -> list[str]:
        """Ids of every passage a method was given (after reranking, when a reranker ran), in order
        of first appearance."""
        seen: dict[str, None] = {}
        for hits in self.retrieval_rounds():
            for hit in hits:
                seen.setdefault(hit.passage.id, None)
        return list(seen)

    def retrieval_rounds(self) -> list[tuple[Hit, ...]]:
        """The passages each retrieval round handed to the method: a Rerank step replaces the
        candidates of the Retrieve step before it."""
        rounds: list[tuple[Hit, ...]] = []
        for step in self.steps:
            if isinstance(step, Retrieve):
                rounds.append(step.hits)
            elif isinstance(step, Rerank) and rounds:
                rounds[-1] = step.hits
        return rounds

    def to_json(self) -> str:
        return json.dumps(to_plain(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trace:
        return from_plain(cls, json.loads(line))


# ------------------------------------------------------------------------------------ JSON codec
def to_plain(obj: Any) -> Any:
    """A record as JSON-ready values; steps carry their `kind` so a trace loads back exactly."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if _kept(obj, f)}
        if isinstance(obj, Step):
            out = {"kind": obj.kind, **out}
        return out
    if isinstance(obj, (tuple, list)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def _kept(obj: Any, f: dataclasses.Field) -> bool:
    """A field goes into JSON unless it is transient (live tensors) or an optional field at its
    default (so that adding one leaves existing traces and golden files unchanged)."""
    if f.metadata.get("transient"):
        return False
    return not (f.metadata.get("omit_default") and getattr(obj, f.name) == f.default)


_HINTS: dict[type, dict[str, Any]] = {}


def from_plain(tp: Any, value: Any) -> Any:
    """Rebuild a value of type `tp` (a record class or a typing form) from `to_plain` output."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        return from_plain(rest[0], value)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v) for v in value)
        return tuple(from_plain(a, v) for a, v in zip(args, value))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        return {from_plain(kt, k): from_plain(vt, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Step):
        if tp is Step:
            tp = STEP_TYPES[value["kind"]]
        value = {k: v for k, v in value.items() if k != "kind"}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _HINTS.get(tp)
        if hints is None:
            hints = _HINTS[tp] = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        renamed = getattr(tp, "RENAMED", {})
        if renamed:  # records written before a field was renamed
            value = {renamed.get(k, k) if renamed.get(k, k) not in value else k: v for k, v in value.items()}
        return tp(**{k: from_plain(hints[k], v) for k, v in value.items() if k in names})
    if tp is float and isinstance(value, int):
        return float(value)
    return value
