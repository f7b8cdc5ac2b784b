"""Listwise reranking: an LLM orders a window of candidates at once, sliding from the back to the front.

Permutation generation as in RankGPT (Sun et al., EMNLP 2023, "Is ChatGPT Good at Search?"): the
passages are numbered [1] ... [n], the model answers "[3] > [1] > ...", and a window of 20 slides
by 10 from the end of the list to its start, so a strong passage can climb from any depth to the
top. The MetaRAG reproducibility study (§4.3.4) reranks with RankGPT through RankLLM; this runs the
same scheme on any LLM of the protocol (the embedded model or an OpenAI-compatible server).
"""
from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.errors import ConfigError
from metarag.llm.base import Decoding
from metarag.policy.actions import Action, Ask
from metarag.records import Hit, Message, Passage
from metarag.rerank.base import Reranked
from metarag.rerank.pointwise import passage_excerpt
from metarag.settings import check_ranges, setting

# RankGPT's prompt (Sun et al., 2023), reworded: the system role, the passages as [1] ... [n] in one
# user turn (RankGPT sends one turn per passage, which costs template tokens on every passage), and
# the ranking instruction last, after the passages, where the model reads it just before answering.
LISTWISE_SYSTEM = "You are RankGPT, an intelligent assistant that ranks passages by their relevance to a query."
LISTWISE_INTRO = ("I will give you {n} passages, each marked with a number identifier in brackets []. "
                  "Rank them by their relevance to the search query: {query}")
LISTWISE_INSTRUCTION = ("Search Query: {query}\n"
                        "Rank the {n} passages above by their relevance to the search query, in descending "
                        "order, using their identifiers: the most relevant passage first. Answer in the "
                        "format [] > [], e.g., [1] > [2]. Give the ranking only; do not explain or add any "
                        "other words.")


def sliding_windows(n: int, window: int, step: int) -> list[tuple[int, int]]:
    """The (start, end) slices a list of n candidates is ranked in, back of the list first.

    As RankGPT's sliding window, except that the last window always starts at 0: RankGPT's loop
    stops when the next start would be negative, which leaves the top of the list unranked unless
    n - window is a multiple of the step (n=25, window 20, step 10 would rank only [5:25]).
    """
    if n < 2:
        return []
    spans = []
    end = n
    while True:
        start = max(end - window, 0)
        spans.append((start, end))
        if start == 0:
            return spans
        end -= step


@dataclass(frozen=True)
class ListwiseSettings:
    """The listwise reranker's window and prompt sizes; window 20 and step 10 are RankGPT's.

    RankGPT's sliding window strategy (Sun et al., EMNLP 2023) ranks 20 passages at a time, moving by 10.
    RankGPT cut passages to 300 words for GPT models; `max_words` (100) lets 20 passages fit in the
    4,096-token context of the embedded model. `max_answer_tokens` None allows 8 tokens per passage
    in the window ("[12] > " is 5 to 6 tokens) plus 16.
    """

    window: int = setting(20, ge=2)
    step: int = setting(10, ge=1)
    max_words: int = setting(100, ge=1)
    max_answer_tokens: int | None = setting(None, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.step > self.window:
            raise ConfigError(f"listwise step must be within 1..window ({self.window}), got {self.step}")

    def answer_tokens(self, n: int) -> int:
        """The generation budget for ranking a window of n passages."""
        return self.max_answer_tokens if self.max_answer_tokens is not None else 8 * n + 16


class ListwiseReranker:
    """RankGPT-style permutation generation over a sliding window, with any LLM of the protocol.

    Scores of the kept hits are reciprocal ranks (1, 1/2, 1/3 ...): a listwise model gives an order,
    not scores. A window whose answer names no valid passage keeps its order, and the failure is
    recorded in `Reranked.fallback`; partly valid answers are repaired (see `parse_permutation`).
    A sub-policy: one `Ask` per window (purpose "listwise"), each recorded by the runner as a step.
    """

    name = "listwise"

    def __init__(self, settings: ListwiseSettings = ListwiseSettings()):
        self.settings = settings

    def prompt(self, query: str, passages: Sequence[Passage]) -> tuple[Message, ...]:
        """The permutation request for one window of passages."""
        n = len(passages)
        listing = "\n".join(f"[{i}] {passage_excerpt(p, self.settings.max_words)}"
                            for i, p in enumerate(passages, 1))
        user = "\n\n".join((LISTWISE_INTRO.format(n=n, query=query), listing,
                            LISTWISE_INSTRUCTION.format(n=n, query=query)))
        return (Message("system", LISTWISE_SYSTEM), Message("user", user))

    def rerank(self, query: str, hits: Sequence[Hit], k: int) -> Generator[Action, Any, Reranked]:
        order = list(hits)
        failures: list[str] = []
        spans = sliding_windows(len(order), self.settings.window, self.settings.step)
        for number, (start, end) in enumerate(spans, 1):
            window = order[start:end]
            completion = yield Ask(self.name, self.prompt(query, [hit.passage for hit in window]),
                                   Decoding(max_tokens=self.settings.answer_tokens(len(window))))
            permutation, problems = parse_permutation(completion.text, len(window))
            if NO_IDS in problems:
                failures.append(f"window {number}/{len(spans)} (candidates {start + 1}-{end}): {NO_IDS}")
                continue
            order[start:end] = [window[i] for i in permutation]
        kept = tuple(Hit(hit.passage, 1.0 / rank, self.name) for rank, hit in enumerate(order[:max(k, 0)], 1))
        return Reranked(kept, "; ".join(failures) or None)


# ---------------------------------------------------------------------------- listwise rankings
_BRACKETED_ID = re.compile(r"\[\s*(\d+)\s*\]")                       # 1. every "[k]", in order
_BARE_CHAIN = re.compile(r"(?<!\d)\d++(?:\s*+[>,]\s*+\d++)+")        # 2. else the first "3 > 1 > 2"
_NUMBER = re.compile(r"\d+")
# Ids longer than this are out of range for any window; they are never converted with int(), which
# refuses strings of more than 4,300 digits.
_MAX_ID_DIGITS = 6
NO_IDS = "no valid passage ids in the answer"


def parse_permutation(text: str, n: int) -> tuple[list[int], list[str]]:
    """The order a listwise answer gives to passages [1] ... [n], as 0-based indices, and its problems.

    Rules: take every bracketed id "[k]" in order of appearance; if there is none, take the first
    chain of bare numbers joined by ">" or "," ("3 > 1 > 2"); other text is ignored, so a lone
    number in prose is not a ranking. Ids outside 1..n and repeats are dropped; passages the answer
    does not mention follow the ranked ones in their original order, so the result is always a
    permutation of range(n). Each repair is listed in the problems; NO_IDS among them means the
    answer named no valid passage and the order is the original one.
    """
    tokens = _BRACKETED_ID.findall(text)
    if not tokens:
        chain = _BARE_CHAIN.search(text)
        tokens = _NUMBER.findall(chain.group()) if chain else []
    order: list[int] = []
    ranked: set[int] = set()
    out_of_range: list[str] = []
    repeated: list[str] = []
    for token in tokens:
        number = int(token) if len(token) <= _MAX_ID_DIGITS else 0
        if not 1 <= number <= n:
            out_of_range.append(token if len(token) <= 12 else token[:12] + "...")
        elif number - 1 in ranked:
            repeated.append(token)
        else:
            order.append(number - 1)
            ranked.add(number - 1)
    problems: list[str] = []
    if out_of_range:
        problems.append(f"ids out of range 1..{n} ignored: {', '.join(out_of_range)}")
    if repeated:
        problems.append(f"repeated ids ignored: {', '.join(repeated)}")
    missing = [i for i in range(n) if i not in ranked]
    if n and not order:
        problems.append(NO_IDS)
    elif missing:
        problems.append(f"ids not ranked, kept after the ranked ones in their original order: "
                        f"{', '.join(str(i + 1) for i in missing)}")
    return order + missing, problems
