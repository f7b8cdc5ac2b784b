"""LLM-as-judge answer correctness, the accuracy agentic-RAG papers report next to EM (R1-Searcher's
ACC_L, Song et al., 2025): a model reads the question, the gold answers and a prediction and says
whether the prediction is right. Post-hoc only: it scores a finished run's answers
(`evaluate/answer_judge.py`), never a method's decision.

The prompts are ours, written to the papers' criterion (the prediction is right when it carries the
meaning and the key facts of a gold answer); each is a named setting, and its text is stored with the
verdicts it gave. Which paper judges how: R1-Searcher asks gpt-4o-mini with the question, the golden
answer and the prediction, and reads True / False (`evaluation/metric_calc_gpt_as_judge.py`, lines
64-91): "r1-searcher" has that structure, in our words. Search-o1's release has no judge (its
accuracy is a substring match, `metrics.search_o1_accuracy`). "agentic-rag" is our wording of the
same criterion, stricter about hedges and partial answers; "equivalence" leaves the question out.
Like every judge that asks a model it is a sub-policy (`judges/base.py`): it yields one Ask and the
runner records it.
"""
from __future__ import annotations

import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from metarag.judges.base import JudgeAudit, Verdict
from metarag.llm.base import Decoding
from metarag.parsing import parse_yes_no
from metarag.policy.actions import Action, Ask
from metarag.records import Message
from metarag.settings import check_ranges, setting

CORRECT, INCORRECT, UNJUDGED = "correct", "incorrect", "unjudged"

# The papers' judge: question, gold answers and prediction in, a yes/no verdict out.
AGENTIC_RAG_TASK = (
    "You grade the answer a question-answering system gave. Decide whether the predicted answer is "
    "correct, using the gold answers as the truth.\n\n"
    "Question: {question}\n"
    "Gold answers (any one of them is right): {golds}\n"
    "Predicted answer: {prediction}\n\n"
    "The prediction is correct when it states the same meaning and the same key information as at least "
    "one gold answer; other wording, abbreviations, word order or added detail that agrees with the gold "
    "answer do not make it wrong. It is incorrect when it names another entity, number or date, leaves out "
    "part of what the question asks, hedges between answers, or declines to answer.\n"
    "Reply in exactly this form:\nVerdict: <Yes if correct, No if not>")
# The same criterion without the question: is the prediction a paraphrase of a gold answer?
EQUIVALENCE_TASK = (
    "Decide whether the predicted answer means the same as one of the gold answers.\n\n"
    "Gold answers: {golds}\n"
    "Predicted answer: {prediction}\n\n"
    "Answer Yes when the prediction names the same entity, number, date or fact as a gold answer, however "
    "it is worded; No otherwise.\n"
    "Reply in exactly this form:\nVerdict: <Yes or No>")
# R1-Searcher's judge: question, golden answer and prediction in, True or False out (our words, its structure)
R1_SEARCHER_TASK = (
    "Check a predicted answer to a question against the question's golden answer. The prediction is correct "
    "only when it agrees fully with the meaning and the key information of the golden answer. Reply True if "
    "the prediction is correct and False if it is not.\n\n"
    "Question: {question}\n"
    "Golden Answer: {golds}\n"
    "Predicted Answer: {prediction}")
PROMPTS = {"agentic-rag": AGENTIC_RAG_TASK, "equivalence": EQUIVALENCE_TASK, "r1-searcher": R1_SEARCHER_TASK}
GOLD_SEPARATOR = " | "

_VERDICT = re.compile(r"verdict[^\w\n]*[:\-][^\w\n]*(\w+)", re.IGNORECASE)


def correctness_prompt(task: str, inputs: Mapping[str, str]) -> tuple[Message, ...]:
    """The prompt named `task` (a key of PROMPTS) over a question, its gold answers and a prediction."""
    return (Message("user", PROMPTS[task].format(question=inputs["question"], golds=inputs["golds"],
                                                 prediction=inputs["prediction"])),)


@dataclass(frozen=True)
class AnswerJudge:
    """The answer-correctness judge. `prompt`: a name in PROMPTS. Default "equivalence" (gold answers
    and prediction: is it the same answer?), because it is the one the default judge, the embedded
    1.5B, can give: asked with the question too ("agentic-rag", the criterion R1-Searcher and Search-o1
    judge by, with their large judges), the 1.5B calls 83-100 % of a run's answers right, wrong ones
    included (Cohen's kappa with EM 0.00-0.04 over the agentic table's 14 runs,
    docs/notes/2026-12-05-the-agentic-rag-baselines.md); with
    "equivalence" its verdicts follow the answers (kappa 0.33-1.00, agreement with EM 80-100 %).
    Name "agentic-rag", or "r1-searcher" (R1-Searcher's judge, gpt-4o-mini in its paper), with a judge
    that can read the question (`--judge-llm openai:MODEL@URL --judge-prompt r1-searcher`); several
    gold aliases reach every prompt joined by " | " (R1-Searcher's sets give one). The verdict is read
    from the reply's first `Verdict:` label,
    else from its first word (Yes / No, True / False, Correct / Incorrect); a reply that gives neither
    is `unjudged`, recorded with the reply as its fallback, and counted as neither right nor wrong.
    `model` names the judge model as a spec string ("openai:MODEL@URL"); None asks the LLM the judge is
    run with. Greedy decoding; `max_tokens` leaves room for the verdict line."""

    prompt: Literal["agentic-rag", "equivalence", "r1-searcher"] = "equivalence"
    max_tokens: int = setting(16, ge=2)
    model: str | None = None
    name: str = "answer-correctness"

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def task(self) -> str:
        """The prompt's text, stored with every verdict file this judge writes."""
        return PROMPTS[self.prompt]

    def judge(self, inputs: Mapping[str, str]) -> Generator[Action, Any, Verdict]:
        out = yield Ask(self.name, correctness_prompt(self.prompt, inputs), Decoding(max_tokens=self.max_tokens),
                        model=self.model)
        return read_verdict(out.text)


def read_verdict(text: str) -> Verdict:
    """A judge reply as a Verdict: the first `Verdict:` label's word, else the reply's first word;
    neither a yes nor a no word: `unjudged`, with the reply kept as the fallback's reason."""
    label = _VERDICT.search(text)
    said = parse_yes_no(label.group(1)) if label else parse_yes_no(text)
    if said is None:
        return Verdict(UNJUDGED, None, fallback=f"no verdict in {text[:80]!r}")
    return Verdict(CORRECT if said else INCORRECT, 1.0 if said else 0.0)


class AnswerAudit(JudgeAudit):
    """The judge over recorded answers, as a method the runner runs (every model call goes through
    `methods/runner.py`): its policy for a question asks the judge about that answer and returns the
    verdict. `inputs` maps the audit's question ids to the judge's inputs (question, golds, prediction)."""

    name = "answer-audit"

    def __init__(self, inputs: Mapping[str, Mapping[str, str]], judge: AnswerJudge = AnswerJudge()):
        super().__init__(inputs, judge)
