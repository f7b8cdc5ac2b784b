"""Standard RAG (Lewis et al., 2020): retrieve the top-k passages once, answer from them.

As run in the MetaRAG reproducibility study (§4.2, §4.3.2): one retrieval of the top 5 passages for
the question, concatenated with the question, one greedy answer. The prompt puts the fixed
instruction and the passages first and the question last, so a back-end with prefix caching reuses
the evidence when later calls (other methods, judges) share it.
"""
from __future__ import annotations

from dataclasses import dataclass

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer
from metarag.policy.actions import Ask, Search
from metarag.policy.evidence import format_passages
from metarag.records import Message, Question
from metarag.settings import check_ranges, setting

SYSTEM = ("Answer the question using the passages. Give a short answer only: a name, a date, a number, "
          "a short phrase, or yes/no. Do not explain.")
USER = "Passages:\n{passages}\n\nQuestion: {question}\nShort answer:"


@dataclass(frozen=True)
class StandardRAGSettings:
    """Standard RAG settings: k = 5 passages (study §4.3.2: 'we retain the top five passages'),
    greedy decoding (§4.3.1)."""

    k: int = setting(5, ge=1)
    max_tokens: int = setting(32, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


class StandardRAG:
    name = "standard-rag"

    def __init__(self, settings: StandardRAGSettings = StandardRAGSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        hits = yield Search(question.text, self.settings.k)
        prompt = (Message("system", SYSTEM),
                  Message("user", USER.format(passages=format_passages(hits), question=question.text)))
        completion = yield Ask("answer", prompt, Decoding(max_tokens=self.settings.max_tokens, stop=("\n",)))
        return clean_answer(completion.text)
