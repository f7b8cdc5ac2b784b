"""Standard prompting (closed book): the LLM answers from its own knowledge, no retrieval.

The first baseline of the MetaRAG reproducibility study (Zhou et al. 2024, reproduced 2025, §4.2),
run like every baseline there with a fixed few-shot prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer
from metarag.policy.actions import Ask
from metarag.records import Message, Question
from metarag.settings import check_ranges, setting

SYSTEM = ("You answer questions with a short answer only: a name, a date, a number, a short phrase, "
          "or yes/no. Do not explain.")
FEW_SHOT = (
    Message("user", "Question: Which country is the city of Lyon in?"),
    Message("assistant", "France"),
    Message("user", "Question: Were Mozart and Beethoven both composers?"),
    Message("assistant", "yes"),
)
QUESTION = "Question: {question}"


@dataclass(frozen=True)
class ClosedBookSettings:
    """Closed-book settings. Defaults: greedy decoding (study §4.3.1: temperature 0), few-shot on
    (study §4.2: 'a fixed few-shot prompting setup'), a short-answer token budget."""

    max_tokens: int = setting(32, ge=1)
    few_shot: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


class ClosedBook:
    name = "closed-book"

    def __init__(self, settings: ClosedBookSettings = ClosedBookSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        shots = FEW_SHOT if self.settings.few_shot else ()
        prompt = (Message("system", SYSTEM), *shots, Message("user", QUESTION.format(question=question.text)))
        completion = yield Ask("answer", prompt, Decoding(max_tokens=self.settings.max_tokens, stop=("\n",)))
        return clean_answer(completion.text)
