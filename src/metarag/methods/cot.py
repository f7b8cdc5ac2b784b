"""Chain-of-Thought (Wei et al., 2022), closed book: reason step by step, then a final answer.

A baseline of the MetaRAG reproducibility study (§4.2). The short answer is taken from the
reasoning by one fixed rule (`extract_short_answer`: the text after the last "answer is" /
"Answer:" marker), so the metric never depends on how a model happened to phrase its ending.
"""
from __future__ import annotations

from dataclasses import dataclass

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import extract_short_answer
from metarag.policy.actions import Ask
from metarag.records import Message, Question
from metarag.settings import check_ranges, setting

SYSTEM = ("Answer the question by reasoning step by step in a few short sentences. "
          "End with a line of the form 'So the answer is: <short answer>.' where the short answer is "
          "a name, a date, a number, a short phrase, or yes/no.")
FEW_SHOT = (
    Message("user", "Question: Who was born first, the director of Jaws or the director of Alien?"),
    Message("assistant", "Jaws was directed by Steven Spielberg, born in 1946. Alien was directed by "
                         "Ridley Scott, born in 1937. 1937 is earlier than 1946.\n"
                         "So the answer is: Ridley Scott."),
)
QUESTION = "Question: {question}"


@dataclass(frozen=True)
class CoTSettings:
    """Chain-of-Thought settings: greedy decoding (study §4.3.1), one worked example (study §4.2's
    fixed few-shot setup), room for a few sentences of reasoning."""

    max_tokens: int = setting(200, ge=1)
    few_shot: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


class ChainOfThought:
    name = "cot"

    def __init__(self, settings: CoTSettings = CoTSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        shots = FEW_SHOT if self.settings.few_shot else ()
        prompt = (Message("system", SYSTEM), *shots, Message("user", QUESTION.format(question=question.text)))
        completion = yield Ask("reason", prompt, Decoding(max_tokens=self.settings.max_tokens))
        return extract_short_answer(completion.text)
