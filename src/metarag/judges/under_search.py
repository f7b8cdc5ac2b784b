"""The external under-search judge of the belief-action paper (Qi et al., 2026, Appendix G, Table 8):
after a run, an LLM reads each trajectory's final ANSWER step and decides whether another search
should have come before the answer. Post-hoc only: never a reward, never seen by the agent.

Exactly the inputs the paper lists: the question, every passage retrieved before the answer, the
reasoning just before answering, the final answer and the gold answer; never belief scores,
candidates or rewards. Greedy (deterministic) decoding. The paper's prompt (its Figure 10) is an
image: `UNDER_SEARCH_TASK` is ours, written to its criteria. It asks for the verdict first and the
reason after it: with the reason first, the embedded 1.5B's reason ran past the 96-token budget
before the verdict line on up to 10 of 30 answers, which were then unjudged, and its reasons often
contradicted the verdict that followed them, so reasoning first bought no visible consistency while
losing a third of the verdicts. Like every judge that asks a model it is a sub-policy
(`judges/base.py`): it yields one Ask and the runner records it.
"""
from __future__ import annotations

import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.judges.base import JudgeAudit, Verdict
from metarag.llm.base import Decoding
from metarag.parsing import labelled_fields, parse_yes_no
from metarag.policy.actions import Action, Ask
from metarag.policy.agent_trace import ANSWER, agent_steps
from metarag.policy.evidence import format_passages
from metarag.records import Hit, Message, Trace
from metarag.settings import check_ranges, setting

UNDER_SEARCH, NOT_UNDER_SEARCH, UNJUDGED = "under-search", "not-under-search", "unjudged"

UNDER_SEARCH_TASK = (
    "You review the last step of a search agent. The agent answered a question after zero or more "
    "searches. Decide whether it should have searched again before answering.\n\n"
    "Question: {question}\n\n"
    "Passages the agent retrieved before answering:\n{passages}\n\n"
    "The agent's reasoning just before answering: {reasoning}\n"
    "The agent's final answer: {answer}\n"
    "Gold answer: {gold}\n\n"
    "It is under-search when another search was needed before answering: the passages lack evidence the "
    "answer depends on, an entity or attribute the question asks about was never retrieved, or the agent "
    "answered from evidence about a different entity or attribute (misused evidence). It is not "
    "under-search when the passages held what was needed and the agent reasoned about them wrongly.\n"
    "Reply in exactly this form:\nVerdict: <Yes if under-search, No if not>\nReason: <one sentence>")
NO_PASSAGES = "(none: the agent answered without searching)"
NO_REASONING = "(none)"

_VERDICT = re.compile(r"verdict[^\w\n]*[:\-][^\w\n]*(\w+)", re.IGNORECASE)
_ACTION_TAG = re.compile(r"<(?:answer|search)>.*", re.S)
_THINK_TAGS = re.compile(r"</?think>")


def under_search_prompt(inputs: Mapping[str, str]) -> tuple[Message, ...]:
    """The judge's prompt over its five inputs (see `under_search_inputs`)."""
    return (Message("user", UNDER_SEARCH_TASK.format(
        question=inputs["question"], passages=inputs.get("passages") or NO_PASSAGES,
        reasoning=inputs.get("reasoning") or NO_REASONING, answer=inputs["answer"], gold=inputs["gold"])),)


@dataclass(frozen=True)
class UnderSearchJudge:
    """Appendix G's judge. Verdict `under-search` or `not-under-search`, read from the reply's first
    `Verdict:` label, wherever it stands in the text (a small model sometimes writes it mid-line,
    "... wrongly. Verdict: No"), else from the reply's first word; a reply that gives neither is
    `unjudged`, recorded as a fallback, and left out of the judged rate (never counted as either).
    `model` names the judge model (the paper used GLM-5.1; e.g. "openai:MODEL@URL"); None asks the
    run's LLM. `max_tokens`: room for the verdict line and one sentence of reason (a reason cut
    short loses no verdict)."""

    max_tokens: int = setting(96, ge=8)
    model: str | None = None
    name: str = "under-search"

    def __post_init__(self) -> None:
        check_ranges(self)

    def judge(self, inputs: Mapping[str, str]) -> Generator[Action, Any, Verdict]:
        out = yield Ask(self.name, under_search_prompt(inputs), Decoding(max_tokens=self.max_tokens), model=self.model)
        label = _VERDICT.search(out.text)
        said = parse_yes_no(label.group(1)) if label else parse_yes_no(out.text)
        reason = _VERDICT.split(labelled_fields(out.text, ("reason",)).get("reason", ""))[0].strip()
        if said is None:
            return Verdict(UNJUDGED, None, detail=reason, fallback=f"no verdict in {out.text[:80]!r}")
        return Verdict(UNDER_SEARCH if said else NOT_UNDER_SEARCH, 1.0 if said else 0.0, detail=reason)


def under_search_inputs(trace: Trace, golds: Sequence[str]) -> dict[str, str] | None:
    """The judge's inputs for a search agent's trace, or None when it did not end with an ANSWER
    step (a failed or cut-off trajectory has no answer to judge).

    "The reasoning just before answering" is the ANSWER step's text before its `<answer>` tag; when
    the agent wrote none there, the latest earlier step's reasoning (its text before its action tag).
    The paper's trained agents think at every turn, so for them the two readings agree; an untrained
    `search-r1` often goes straight from `<information>` to `<answer>` (27 of 30 HotpotQA answers), and
    with "(none)" in that place the embedded judge called 22 of those 27 under-search (and 2 of the 3
    with reasoning not), so the final step's text alone would judge the missing `<think>`."""
    steps = agent_steps(trace)
    if not steps or steps[-1].action != ANSWER or trace.answer is None:
        return None
    seen: dict[str, Hit] = {}
    for hits in trace.retrieval_rounds():  # every retrieval precedes the final answer step
        for hit in hits:
            seen.setdefault(hit.passage.id, hit)
    reasoning = next((text for text in map(_reasoning, reversed(steps)) if text), "")
    return {"question": trace.question, "passages": format_passages(list(seen.values())),
            "reasoning": reasoning, "answer": trace.answer, "gold": "; ".join(golds)}


def _reasoning(step: Any) -> str:
    """A step's reasoning: its text before its action tag, think tags dropped, whitespace joined."""
    return " ".join(_THINK_TAGS.sub(" ", _ACTION_TAG.sub("", step.text)).split())


class UnderSearchAudit(JudgeAudit):
    """The judge over a finished run, as a method the runner runs (every model call goes through
    `methods/runner.py`): its policy for a question asks the judge about that question's recorded
    trajectory and returns the verdict. `inputs` maps question ids to `under_search_inputs`."""

    name = "under-search-audit"

    def __init__(self, inputs: Mapping[str, Mapping[str, str]], judge: UnderSearchJudge = UnderSearchJudge()):
        super().__init__(inputs, judge)
