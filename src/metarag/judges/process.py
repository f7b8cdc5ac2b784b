"""HiPRAG's process judges (Wu et al., 2025a, "HiPRAG: Hierarchical Process Rewards for Efficient
Agentic Retrieval Augmented Generation"; public code github.com/qualidea1217/HiPRAG, `analysis.py`,
`prompt.py`, `verl/utils/reward_score/qa_em_format.py`): during training an LLM marks every step of a
rollout as over-search, under-search or neither, and the share of clean steps becomes a process bonus
(`train/rewards.py`'s `hiprag` reward).

- A **search step** is over-search when the policy did not need it: the policy model is asked the
  step's query directly, without passages, and a judge decides whether that direct answer says the
  same as what the agent concluded after the search (HiPRAG's "direct" test; its other variant, which
  regenerates the step's conclusion with the search suppressed, needs HiPRAG's own step format).
- A **non-search step** is under-search when its reasoning or conclusion is factually wrong or does
  not follow: a judge checks the step's factual accuracy and internal logic; a step that fails either
  should have searched.

Our agents write Search-R1's format (`<think>…</think>` then `<search>` or `<answer>`), not HiPRAG's
`<step><reasoning>…<conclusion>` blocks, so two readings are ours, said here: the *conclusion* of a
search step is the reasoning the agent wrote right after its `<information>` (the next step's
`<think>`, or its answer when it answered at once); a search step with no step after it (the
trajectory ended on it) has no conclusion and is not judged. The non-search step is an agent's
ANSWER step; its content is its reasoning and answer, and the question is given with it (our answer
step's conclusion is a bare answer span that means nothing without the question; HiPRAG's conclusion
sentences restate it).

HiPRAG's judge was gpt-4.1-nano; `ProcessJudgeSettings.judge_model` None asks the run's LLM (offline),
a spec string names another (e.g. "embedded" for the frozen 1.5B, "openai:MODEL@URL"). The direct
answer is always the run's LLM: in training, the live policy. Both prompts are ours, written to
HiPRAG's criteria, and ask for its reply form (`<answer>True</answer>` / `<answer>False</answer>`).
A reply that gives neither verdict counts the step as clean, as HiPRAG's code does (its parse error
returns "not over-/under-searched"), and is recorded as a fallback. Greedy decoding throughout.
"""
from __future__ import annotations

import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.judges.base import Verdict
from metarag.llm.base import Decoding
from metarag.parsing import parse_yes_no
from metarag.policy.actions import Action, Ask, Assess
from metarag.policy.agent_trace import ANSWER, INVALID, SEARCH, AgentStep, agent_steps
from metarag.records import Judge, Message, Question, Trace
from metarag.settings import check_ranges, setting

OVER_SEARCH, NECESSARY_SEARCH = "over-search", "necessary-search"
UNDER_SEARCH, SUFFICIENT_REASONING = "under-search", "sufficient-reasoning"
NOT_JUDGED = "not-judged"
SEARCH_ERRORS = (OVER_SEARCH, UNDER_SEARCH)

DIRECT_ANSWER_PROMPT = ("Answer this question, or say what you know about this statement, from your own "
                        "knowledge: {query}")
EQUIVALENCE_TASK = (
    "Compare two statements and decide whether they mean the same thing: whether they carry the same "
    "core information, whatever their wording.\n\n"
    "Statement 1: {conclusion}\n\n"
    "Statement 2: {direct}\n\n"
    "Reply with <answer>True</answer> if they are equivalent, <answer>False</answer> if not.")
STEP_CHECK_TASK = (
    "You check one reasoning step of an AI agent that answers questions with a search tool. The agent "
    "took this step without searching. Decide from the step alone and your own knowledge whether it was "
    "right not to search: (1) is what the step states factually correct, and (2) does its conclusion "
    "follow from its reasoning?\n\n"
    "Question: {question}\n\n"
    "Step: {step}\n\n"
    "Reply with <answer>True</answer> if both hold, <answer>False</answer> if either fails.")

_ANSWER = re.compile(r"<answer>\s*(.*?)\s*(?:</answer>|$)", re.S | re.I)
_TAGS = re.compile(r"</?(?:think|answer|search)>")


def read_true_false(text: str) -> bool | None:
    """The verdict of a reply in HiPRAG's form: the last `<answer>…</answer>` (True / False, yes / no),
    else the reply's own first word; None when it gives neither."""
    found = _ANSWER.findall(text)
    return parse_yes_no(found[-1]) if found else parse_yes_no(text)


@dataclass(frozen=True)
class ProcessJudgeSettings:
    """The judges' knobs. `direct_max_tokens` 512 is the direct answer's budget in HiPRAG's
    transformers path (its vLLM path allows 1,024); `judge_max_tokens` is room for the tag and a short
    reason; `judge_model` None: the run's LLM (HiPRAG: gpt-4.1-nano)."""

    direct_max_tokens: int = setting(512, ge=1)
    judge_max_tokens: int = setting(32, ge=4)
    judge_model: str | None = None

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class OverSearchJudge:
    """A search step's test: the policy answers the query directly, then the judge compares that
    answer with the step's conclusion. Verdict `over-search` (equivalent: the search was not needed)
    or `necessary-search`. Inputs: `query`, `conclusion`."""

    settings: ProcessJudgeSettings = ProcessJudgeSettings()
    name: str = "hiprag-over-search"

    def judge(self, inputs: Mapping[str, str]) -> Generator[Action, Any, Verdict]:
        s = self.settings
        question = DIRECT_ANSWER_PROMPT.format(query=inputs["query"])
        direct = yield Ask("hiprag-direct-answer", (Message("user", question),),
                           Decoding(max_tokens=s.direct_max_tokens))
        prompt = EQUIVALENCE_TASK.format(conclusion=inputs["conclusion"], direct=direct.text.strip() or "(nothing)")
        return (yield from _ask_judge("hiprag-equivalence", prompt, s, if_true=OVER_SEARCH, if_false=NECESSARY_SEARCH))


@dataclass(frozen=True)
class UnderSearchStepJudge:
    """A non-search step's test: factual accuracy and internal logic. Verdict `under-search` (either
    fails: it should have searched) or `sufficient-reasoning`. Inputs: `question`, `step`."""

    settings: ProcessJudgeSettings = ProcessJudgeSettings()
    name: str = "hiprag-under-search"

    def judge(self, inputs: Mapping[str, str]) -> Generator[Action, Any, Verdict]:
        s = self.settings
        prompt = STEP_CHECK_TASK.format(question=inputs["question"], step=inputs["step"])
        return (yield from _ask_judge("hiprag-step-check", prompt, s, if_true=SUFFICIENT_REASONING,
                                      if_false=UNDER_SEARCH))


def _ask_judge(purpose: str, prompt: str, s: ProcessJudgeSettings, *, if_true: str,
               if_false: str) -> Generator[Action, Any, Verdict]:
    """Ask the judge model one True/False question; the verdict is `if_true` / `if_false`, its score 1
    for a search error. No verdict in the reply: the step counts clean (the clean verdict, recorded
    as a fallback)."""
    out = yield Ask(purpose, (Message("user", prompt),), Decoding(max_tokens=s.judge_max_tokens), model=s.judge_model)
    said = read_true_false(out.text)
    clean = if_false if if_true in SEARCH_ERRORS else if_true
    if said is None:
        return Verdict(clean, 0.0, fallback=f"no True/False in {out.text[:80]!r}")
    verdict = if_true if said else if_false
    return Verdict(verdict, 1.0 if verdict in SEARCH_ERRORS else 0.0)


def _plain(text: str) -> str:
    return " ".join(_TAGS.sub(" ", text).split())


def step_inputs(trace: Trace) -> tuple[dict[str, str] | None, ...]:
    """Per decision step of an agent trace, what its judge reads (None: the step is not judged — an
    invalid step, or a search with no step after it). A search step gets its `query` and the
    `conclusion` the agent drew from the results; an ANSWER step the `question` and its `step` text."""
    steps = agent_steps(trace)
    out: list[dict[str, str] | None] = []
    for i, s in enumerate(steps):
        if s.action == SEARCH and s.query:
            after = steps[i + 1] if i + 1 < len(steps) else None
            conclusion = _plain(after.text) if after is not None and after.action != INVALID else ""
            out.append({"query": s.query, "conclusion": conclusion} if conclusion else None)
        elif s.action == ANSWER:
            out.append({"question": trace.question, "step": _plain(s.text) or (trace.answer or "")})
        else:
            out.append(None)
    return tuple(out)


def judge_for(inputs: Mapping[str, str], settings: ProcessJudgeSettings) -> Any:
    return OverSearchJudge(settings) if "query" in inputs else UnderSearchStepJudge(settings)


class ProcessAudit:
    """HiPRAG's step judgments as a method the runner runs (every model call goes through
    `methods/runner.py`): the policy for a question judges, in order, each judged step of the
    trajectory `inputs[question.id]` names and returns nothing; the verdicts are its Judge steps
    (`step_verdicts` reads them back)."""

    name = "hiprag-audit"
    revision = 1

    def __init__(self, inputs: Mapping[str, Sequence[Mapping[str, str] | None]],
                 settings: ProcessJudgeSettings = ProcessJudgeSettings()):
        self.inputs, self.settings = {k: tuple(v) for k, v in inputs.items()}, settings

    def policy(self, question: Question) -> Generator[Any, Any, str]:
        for item in self.inputs[question.id]:
            if item is not None:
                yield Assess(judge_for(item, self.settings), dict(item))
        return ""


def step_verdicts(inputs: Sequence[Mapping[str, str] | None], audit: Trace) -> tuple[str, ...]:
    """Each step's verdict, aligned with `inputs` (`not-judged` where it is None), read from the
    audit's Judge steps in order. An audit that failed or judged a different number of steps is a
    DataError: the reward must not be built from verdicts of another trajectory."""
    from metarag.errors import DataError

    if audit.error is not None:
        raise DataError(f"the HiPRAG audit of question {audit.question_id!r} failed: {audit.error}")
    judged = [s.verdict for s in audit.steps if isinstance(s, Judge)]
    wanted = sum(item is not None for item in inputs)
    if len(judged) != wanted:
        raise DataError(f"the HiPRAG audit of question {audit.question_id!r} has {len(judged)} verdicts for "
                        f"{wanted} judged steps")
    it = iter(judged)
    return tuple(NOT_JUDGED if item is None else next(it) for item in inputs)


def clean_share(verdicts: Sequence[str], steps: Sequence[AgentStep]) -> float:
    """N_corr / N of HiPRAG's process bonus: the share of a trajectory's steps that are neither
    over- nor under-search. Every decision step counts in N (the paper's formula; HiPRAG's code
    divides by the search steps only, which lets the share exceed 1 — we follow the paper); a step not
    judged counts as clean, as HiPRAG's code counts a step it could not test. 0 for no steps."""
    if len(verdicts) != len(steps):
        from metarag.errors import DataError

        raise DataError(f"{len(verdicts)} step verdicts for {len(steps)} agent steps")
    if not steps:
        return 0.0
    return sum(v not in SEARCH_ERRORS for v in verdicts) / len(steps)
