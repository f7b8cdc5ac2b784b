"""The LLM-based judges MetaRAG's critic consults, each the offline default for a model the papers
ran separately (a fine-tuned T5 expert, a T5-XXL NLI model): yes/no verdicts come from the
probability of the whole labels (a `Probe`), never from searching free text. Each judge is a
sub-policy: it yields its request (purpose: the judge's name) and the runner records it as a step.

Every judge takes named inputs (`question`, `passages` — already formatted —, `answer`,
`rationale`) and puts the passages first in its prompt (`evidence_prompt`), so the judges of one
round share the evidence prefix in the KV cache.
"""
from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from metarag.judges.base import Verdict
from metarag.llm.base import Decoding
from metarag.parsing import clean_answer, first_json_object, labelled_fields
from metarag.policy.actions import Action, Ask, Probe
from metarag.policy.evidence import evidence_prompt
from metarag.records import Message
from metarag.settings import check_ranges, setting

EXPERT_TASK = ("Question: {question}\nCopy the shortest span of words from the passages that answers the "
               "question (or yes/no for a yes/no question). Reply with the span only.")
INTERNAL_TASK = ("Question: {question}\nCan you answer this question correctly from your own knowledge alone, "
                 "without any documents? Answer Yes or No.")
EXTERNAL_TASK = ("Question: {question}\nDo the passages above contain all the information needed to answer "
                 "the question? Answer Yes or No.")
ENTAILMENT_TASK = ("Question: {question}\nReasoning: {rationale}\nClaim: the answer to the question is "
                   "\"{answer}\".\nDo the passages and the reasoning entail the claim? Answer Yes or No.")
REASONING_TASK = (
    "Question: {question}\nProposed reasoning: {rationale}\nProposed answer: {answer}\n"
    "Check the proposed answer for these errors: flawed logic (a step does not follow from the passages or "
    "the previous steps), misaligned (the answer does not give what the question asks for, e.g. a person "
    "instead of a date), redundant (the answer contains extra words beyond the short answer).\n"
    "Reply in exactly this form:\nError: <none | flawed logic | misaligned | redundant>\n"
    "Feedback: <one sentence on how to fix the answer, or 'none'>")


Judgement = Generator[Action, Any, Verdict]


@dataclass(frozen=True)
class ExpertQA:
    """MetaRAG's expert: a reference answer y′ read off the passages. Default: the LLM prompted as
    an extractive reader (a different prompt and role from the reasoner), standing in for the
    fine-tuned T5-large expert of the original (study §4.3.3), which is not available offline."""

    max_tokens: int = setting(24, ge=1)
    name: str = "expert"

    def __post_init__(self) -> None:
        check_ranges(self)

    def judge(self, inputs: Mapping[str, str]) -> Judgement:
        prompt = evidence_prompt(inputs["passages"], EXPERT_TASK.format(question=inputs["question"]))
        out = yield Ask(self.name, prompt, Decoding(max_tokens=self.max_tokens, stop=("\n",)))
        span = clean_answer(out.text)
        if not span:
            return Verdict("", None, fallback="empty expert answer")
        return Verdict(span, None)


@dataclass(frozen=True)
class YesNoJudge:
    """A yes/no question to the LLM over the evidence; verdict `yes_label` when P(Yes), normalized
    over Yes and No, reaches `threshold`, else `no_label`. Score = that probability. When neither
    label gets probability mass (`LabelScores.p`) the verdict is `no_label`, score None, with the
    fallback recorded: no mass is never read as a yes."""

    name: str
    task: str
    yes_label: str = "yes"
    no_label: str = "no"
    threshold: float = setting(0.5, ge=0, le=1)
    uses_passages: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)

    def judge(self, inputs: Mapping[str, str]) -> Judgement:
        task = self.task.format(**{k: inputs.get(k, "") for k in ("question", "answer", "rationale")})
        prompt = (evidence_prompt(inputs.get("passages", ""), task) if self.uses_passages
                  else (Message("user", task),))
        scores = yield Probe(self.name, prompt, ("Yes", "No"))
        p_yes, fallback = scores.p("Yes")
        if fallback is not None:
            return Verdict(self.no_label, None, fallback=f"{fallback}; default {self.no_label}")
        return Verdict(self.yes_label if p_yes >= self.threshold else self.no_label, p_yes)


def internal_sufficiency(threshold: float = 0.5) -> YesNoJudge:
    """Can the model answer from its own knowledge? (MetaRAG evaluation, internal knowledge.)"""
    return YesNoJudge("internal-sufficiency", INTERNAL_TASK, "sufficient", "insufficient", threshold,
                      uses_passages=False)


def external_sufficiency(threshold: float = 0.5) -> YesNoJudge:
    """Do the passages hold what is needed? (MetaRAG evaluation, external knowledge.)"""
    return YesNoJudge("external-sufficiency", EXTERNAL_TASK, "sufficient", "insufficient", threshold)


def llm_entailment(threshold: float = 0.5) -> YesNoJudge:
    """P(passages + rationale entail "the answer is y"): the offline stand-in for the T5-XXL NLI model
    the original MetaRAG used (study §4.3.3)."""
    return YesNoJudge("entailment", ENTAILMENT_TASK, "entailed", "not-entailed", threshold)


@dataclass(frozen=True)
class ReasoningCheck:
    """MetaRAG's procedural check of an answer for the original's error types (flawed logic, answer
    misaligned with the question, redundant content). The LLM writes `Error:` / `Feedback:` lines
    (JSON with those keys is read too); unreadable output falls back to "none" (no error claimed),
    recorded as a fallback."""

    max_tokens: int = 80
    name: str = "reasoning-check"

    def judge(self, inputs: Mapping[str, str]) -> Judgement:
        task = REASONING_TASK.format(question=inputs["question"], rationale=inputs.get("rationale", ""),
                                     answer=inputs["answer"])
        out = yield Ask(self.name, evidence_prompt(inputs["passages"], task), Decoding(max_tokens=self.max_tokens))
        error, feedback = parse_reasoning_check(out.text)
        if error is None:
            return Verdict("none", None, detail="", fallback=f"unparseable: {out.text[:80]!r}")
        return Verdict(error, None, detail=feedback)


# ------------------------------------------------------------------------ MetaRAG's reasoning check
REASONING_ERRORS = ("none", "flawed logic", "misaligned", "redundant")
_NO_ERROR = ("no error", "no errors", "n/a", "no")


def parse_reasoning_check(text: str) -> tuple[str | None, str]:
    """(error type, feedback) from MetaRAG's reasoning check: `Error:` / `Feedback:` lines or a JSON
    object with those keys. The error is one of REASONING_ERRORS, or None when the reply names none
    of them (an echo of the whole list "none | flawed logic | ..." names none); the format's
    placeholder brackets are accepted ("Error: <none>" is "none")."""
    data = first_json_object(text)
    if data is not None:
        fields = {str(k).lower(): str(v) for k, v in data.items()}
    else:
        fields = labelled_fields(text, ("error", "feedback"))
    raw = fields.get("error", "").strip().strip("<>[]()*`\"' ").strip(".").lower()
    raw = " ".join(raw.replace("_", " ").replace("-", " ").split())
    error = None
    if "|" not in raw:
        error = next((e for e in REASONING_ERRORS if raw == e or raw.startswith(e)), None)
        if error is None and raw in _NO_ERROR:
            error = "none"
    feedback = fields.get("feedback", "").strip().strip("<>").strip()
    if feedback.lower() in ("none", "n/a", "-"):
        feedback = ""
    return error, feedback
