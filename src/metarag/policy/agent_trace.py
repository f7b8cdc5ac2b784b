"""The search agents' trace contract, read as decision steps: what `methods/search_agent.py`
(`search-r1`, `belief-agent`) and the agentic methods beside it write into a trace, and what the
trainer's rewards (`train/rewards.py`), the step judges (`judges/process.py`, `judges/under_search.py`)
and `report --analysis agent` read back.

Per decision step t, in this order: an optional belief probe (`Decide("belief", signals={"step": t,
"b": b})`), an optional verify-first candidate (`Decide("agent-candidate", choice=...)`), the step's
generation (`Generate` purpose "agent-step", with per-token log-probs), the step's action
(`Decide("agent-step", choice=search|answer|invalid, signals={"step": t, "forced": 0|1,
"verified": 0|1})`) and, for a search, its `Retrieve` step (a `Rerank` right after it replaces the
passages). `agent_steps` turns a trace into `AgentStep` tuples and refuses a trace that breaks the
order; the belief-action gap diagnosis of Algorithm 1 (Qi et al., 2026, §3.4) and its pooled rates
work on those tuples.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from metarag.errors import ConfigError, DataError
from metarag.records import Decide, Generate, Rerank, Retrieve, TokenLogprob, Trace

SEARCH, ANSWER, INVALID = "search", "answer", "invalid"
ACTIONS = (SEARCH, ANSWER, INVALID)

# names of the trace contract
STEP_DECISION = "agent-step"
BELIEF_DECISION = "belief"
CANDIDATE_DECISION = "agent-candidate"
STEP_PURPOSE = "agent-step"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"

# the diagnoses of Algorithm 1 (and one for a step whose output was no valid action)
OPTIMAL, OVER_SEARCH, UNDER_SEARCH, MARGIN_ZONE = "optimal", "over-search", "under-search", "margin"
DIAGNOSES = (OPTIMAL, OVER_SEARCH, UNDER_SEARCH, MARGIN_ZONE, INVALID)


def decision_generations(trace: Trace) -> list[Generate]:
    """The trace's decision-step generations (`Generate` purpose "agent-step"), in order: what the
    rewards read the answer from, what the trainer trains on and what `cut_share` counts."""
    return [s for s in trace.steps if isinstance(s, Generate) and s.purpose == STEP_PURPOSE]


@dataclass(frozen=True)
class AgentStep:
    """One decision step of a search agent, read off its trace.

    `action`: search, answer or invalid (no tag, both tags, an empty query). `candidate`: the
    verify-first candidate action (belief-agent), None without one. `belief`: the probe's
    b = P(Yes) − P(No) on the step's context, None when the run did not probe. `query` and
    `passage_ids`: what a search sent and got back. `query_logprobs`: the log-probabilities of the
    generated tokens inside <search>...</search> (β-GRPO's query confidence). `forced`: the last
    turn forced an answer. `verified`: the model kept the candidate (belief-agent), else None.
    `text`: the step's generation (its reasoning and its tag)."""

    step: int
    action: str
    candidate: str | None = None
    belief: float | None = None
    query: str | None = None
    passage_ids: tuple[str, ...] = ()
    query_logprobs: tuple[float, ...] = ()
    forced: bool = False
    verified: bool | None = None
    text: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise DataError(f"agent step {self.step}: action {self.action!r} is none of {', '.join(ACTIONS)}")
        if self.belief is not None and not -1.0 <= self.belief <= 1.0:  # NaN fails too
            raise DataError(f"agent step {self.step}: belief score {self.belief!r} is outside [-1, 1]")

    @property
    def query_confidence(self) -> float | None:
        """β-GRPO's confidence of a search call: the lowest probability among its query's tokens
        (Wu et al., 2025b); None for a step with no query tokens."""
        return math.exp(min(self.query_logprobs)) if self.query_logprobs else None


# ----------------------------------------------------------------------------- reading a trace
def agent_steps(trace: Trace) -> tuple[AgentStep, ...]:
    """The decision steps of a `search-r1` / `belief-agent` trace, in order (empty for a trace of
    another method). A trace that breaks the contract (steps out of order, a belief score missing
    or out of range, an unknown action) is a DataError naming the question and the step."""
    where = f"trace of question {trace.question_id!r}"
    steps: list[AgentStep] = []
    beliefs: dict[int, float] = {}
    candidates: dict[int, str] = {}
    generation: Generate | None = None
    searching = False  # the last step was a search whose Retrieve step has not come yet
    retrieved = False  # the last step's Retrieve came last: a Rerank now replaces its passages
    for s in trace.steps:
        if isinstance(s, Decide) and s.name in (BELIEF_DECISION, CANDIDATE_DECISION, STEP_DECISION):
            t = _step_index(s, where)
            retrieved = False
            if t != len(steps):
                raise DataError(f"{where}: Decide {s.name!r} of step {t} where step {len(steps)} was due")
            searching = False
            if s.name == BELIEF_DECISION:
                if "b" not in s.signals:
                    raise DataError(f"{where}: the belief decision of step {t} has no signal 'b'")
                beliefs[t] = s.signals["b"]
            elif s.name == CANDIDATE_DECISION:
                candidates[t] = s.choice
            else:
                text = generation.text if generation is not None else ""
                logprobs = _query_logprobs(text, generation.logprobs) if generation and s.choice == SEARCH else ()
                verified = s.signals.get("verified")
                steps.append(AgentStep(
                    step=t, action=s.choice, candidate=candidates.get(t), belief=beliefs.get(t),
                    query=_search_text(text) if s.choice == SEARCH else None, query_logprobs=logprobs,
                    forced=bool(s.signals.get("forced", 0)),
                    verified=None if verified is None or t not in candidates else bool(verified), text=text))
                generation = None
                searching = s.choice == SEARCH
        elif isinstance(s, Generate) and s.purpose == STEP_PURPOSE:
            generation = s
            searching = retrieved = False
        elif isinstance(s, Retrieve):
            if searching:
                steps[-1] = dataclasses.replace(steps[-1], query=s.query,
                                                passage_ids=tuple(h.passage.id for h in s.hits))
            searching, retrieved = False, searching
        elif isinstance(s, Rerank) and retrieved:
            steps[-1] = dataclasses.replace(steps[-1], passage_ids=tuple(h.passage.id for h in s.hits))
    return tuple(steps)


def _step_index(step: Decide, where: str) -> int:
    value = step.signals.get("step")
    if value is None or not float(value).is_integer() or value < 0:
        raise DataError(f"{where}: Decide {step.name!r} has no valid 'step' signal (got {value!r})")
    return int(value)


def _search_span(text: str) -> tuple[int, int] | None:
    """Character span of the query inside the last <search> of a generation, whitespace trimmed.
    Generation stops at </search>, so the closing tag is usually cut off: the span then runs to the end."""
    opening = text.rfind(SEARCH_OPEN)
    if opening < 0:
        return None
    start = opening + len(SEARCH_OPEN)
    end = text.find(SEARCH_CLOSE, start)
    end = len(text) if end < 0 else end
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _search_text(text: str) -> str | None:
    span = _search_span(text)
    return None if span is None else text[span[0]:span[1]]


def _query_logprobs(text: str, tokens: Sequence[TokenLogprob] | None) -> tuple[float, ...]:
    """Log-probs of the generated tokens whose piece overlaps the query inside <search>...</search>.
    Offsets are the tokens' own; tokens recorded without offsets (all 0) are placed by their pieces."""
    span = _search_span(text)
    if not tokens or span is None or span[0] == span[1]:
        return ()
    if any(t.offset for t in tokens[1:]):
        offsets = [t.offset for t in tokens]
    else:
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
    start, end = span
    return tuple(t.logprob for t, off in zip(tokens, offsets) if off < end and off + len(t.token) > start)


# ---------------------------------------------------------------------------------- diagnosis
def diagnose(belief: float, action: str, margin: float = 0.0) -> str:
    """Algorithm 1's belief-action gap diagnosis of one step (§3.4), margin m in [0, 1):
    b > m and ANSWER, or b < −m and SEARCH: optimal; b > m and SEARCH: over-search; b < −m and
    ANSWER: under-search; |b| ≤ m: the margin zone. A step with no valid action is `invalid`."""
    check_margin(margin)
    if not -1.0 <= belief <= 1.0:
        raise DataError(f"belief score {belief!r} is outside [-1, 1]")
    if action == INVALID:
        return INVALID
    if action not in (SEARCH, ANSWER):
        raise DataError(f"action {action!r} is none of {', '.join(ACTIONS)}")
    if abs(belief) <= margin:
        return MARGIN_ZONE
    if belief > margin:
        return OPTIMAL if action == ANSWER else OVER_SEARCH
    return OPTIMAL if action == SEARCH else UNDER_SEARCH


def diagnoses(steps: Sequence[AgentStep], margin: float = 0.0) -> tuple[str | None, ...]:
    """Each step's diagnosis; None for a step the run did not probe."""
    return tuple(None if s.belief is None else diagnose(s.belief, s.action, margin) for s in steps)


def check_margin(margin: float) -> None:
    if not 0.0 <= margin < 1.0:  # NaN fails too
        raise ConfigError(f"the margin m must be in [0, 1), got {margin!r}")


@dataclass(frozen=True)
class GapRates:
    """Belief-based search-error rates over many trajectories' probed steps (pooled, not averaged
    per trajectory): under-search = share of ANSWER steps with b < −m (the paper's Figure 3),
    over-search = share of SEARCH steps with b > m; NaN where there is no such step. `unprobed`
    counts valid steps without a belief score, left out of both."""

    answer_steps: int
    under_search: int
    search_steps: int
    over_search: int
    unprobed: int = 0

    @property
    def under_search_rate(self) -> float:
        return self.under_search / self.answer_steps if self.answer_steps else math.nan

    @property
    def over_search_rate(self) -> float:
        return self.over_search / self.search_steps if self.search_steps else math.nan


def gap_rates(trajectories: Iterable[Sequence[AgentStep]], margin: float = 0.0) -> GapRates:
    """Pooled under- and over-search rates of a run's (or a rollout group's) trajectories."""
    check_margin(margin)
    counts = dict(answer_steps=0, under_search=0, search_steps=0, over_search=0, unprobed=0)
    for steps in trajectories:
        for s in steps:
            if s.action == INVALID:
                continue
            if s.belief is None:
                counts["unprobed"] += 1
                continue
            diagnosis = diagnose(s.belief, s.action, margin)
            if s.action == ANSWER:
                counts["answer_steps"] += 1
                counts["under_search"] += diagnosis == UNDER_SEARCH
            else:
                counts["search_steps"] += 1
                counts["over_search"] += diagnosis == OVER_SEARCH
    return GapRates(**counts)
