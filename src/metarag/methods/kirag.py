"""KiRAG (Fang, Meng & Macdonald, ACL 2025, "KiRAG: Knowledge-Driven Iterative Retriever for Enhancing
Retrieval-Augmented Generation"): knowledge-triple-guided iterative retrieval, then a reader.

One question, as a policy over the shared runner loop (the paper's three iterative steps, and its public
code, jyfang6/kirag knowledge_graph/models.py):

1. Knowledge decomposition: retrieve the top-k passages for the question and the reasoning chain so far
   (the question followed by the chain's triples; the public code appends only the latest step); the
   LLM extracts <head; relation; tail> triples from each passage not seen before (once per passage; the
   paper extracts them offline with Llama3, a cache the response cache plays here).
2. Candidate knowledge identification: the triples of every passage retrieved so far, minus those in
   the chain, cut to the N that fit the question and the chain best.
3. Reasoning chain construction: the LLM picks the next triple among the N candidates (the Reasoning
   Chain Constructor's choice); it joins the chain, and a judge Probe asks whether the chain now
   answers the question: "Yes" (P >= 0.5) stops the loop, as does the round budget or running out of
   candidates.
4. Document ranking and reading: the passages behind the chain's triples first, in chain order, then
   the other retrieved passages by rank; the reader answers from the first `answer_k` of them.

Every round is a `kirag-step` Decide step ("extend" with the candidate count and the chosen triple's
probability, "no-candidates"), and the judge's verdict a `kirag-stop` one ("stop"/"go-on", with P(Yes)).
Departures, on purpose, each because the toolkit ships no trained model for it:
- The Reasoning Chain Aligner (a fine-tuned E5 bi-encoder scoring each triple against "question +
  chain") is replaced in two parts: its first cut to N candidates by word overlap between the triple
  and the question plus the chain (ties: the passage's retrieval order), and its ranking of those N by
  the LLM itself, one Probe whose labels are the candidates' letters (label probability of the choice).
- The stop rule is a yes/no judge Probe on the chain (the public code stops when the constructor has
  no further step to write, the paper when the chain is complete).
- One short extraction exemplar (MuSiQue train) instead of the paper's retrieved demonstrations.
"""
from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import MARKUP, clean_answer
from metarag.policy.actions import Ask, Note, Probe, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

EXTRACT_SYSTEM = (
    "You extract knowledge triples from a passage. Each triple <head entity; relation; tail entity> states one "
    "fact of the passage; the head and tail are the title or phrases of the text. Write one triple per line "
    "and nothing else.")
# Written from MuSiQue train (musique/train100_official.json, the Bubye River question's paragraph).
EXTRACT_EXEMPLAR = (
    Message("user", "Title: Bubye River\nText: The Bubye River, also known as Bubi River, is a tributary of the "
                    "Limpopo River in Beitbridge District and Gwanda District, Zimbabwe."),
    Message("assistant", "<Bubye River; also known as; Bubi River>\n<Bubye River; tributary of; Limpopo River>\n"
                         "<Bubye River; located in; Beitbridge District, Gwanda District, Zimbabwe>"),
)
EXTRACT_USER = "Title: {title}\nText: {text}"
SELECT_TASK = (
    "Question: {question}\nReasoning chain so far:\n{chain}\n\nCandidate knowledge triples:\n{candidates}\n\n"
    "Which candidate triple is the next step of the reasoning chain towards answering the question? "
    "Reply with its letter only.")
STOP_TASK = (
    "Question: {question}\nKnowledge triples:\n{chain}\n\n"
    "Do these knowledge triples answer the question? Reply Yes or No.")
ANSWER_TASK = ("Question: {question}\nAnswer the question using the passages. Give a short answer only: a name, "
               "a date, a number, a short phrase, or yes/no. Do not explain.\nShort answer:")

LETTERS = tuple(chr(ord("A") + i) for i in range(26))
NO_CHAIN = "(none yet)"
_WORD = re.compile(r"[0-9a-z]+")
_SHORT = 3  # words shorter than this (of, in, a ...) say nothing about fit; digits always count


@dataclass(frozen=True)
class Triple:
    """A knowledge triple and the passage it was extracted from."""

    head: str
    relation: str
    tail: str
    passage_id: str

    @property
    def text(self) -> str:
        return f"<{self.head}; {self.relation}; {self.tail}>"

    @property
    def words(self) -> str:
        return f"{self.head} {self.relation} {self.tail}"


@dataclass(frozen=True)
class KiRAGSettings:
    """KiRAG settings, the defaults of the public code (KiRAG.__init__ in knowledge_graph/models.py).

    T = 5 rounds (num_turns), k = 10 passages per retrieval (topk), candidates = 20 triples offered to
    the constructor per round (num_candidate_triples; at most 26, one letter each), answer_k = 3
    passages for the reader (evaluation/qa_eval.py, --k 3). The EvoCtx paper ran its baselines at
    T = 8, k = 5 (§4.1); set those to match its table (k = 5 also halves the extraction calls).
    `stop_threshold`: P("Yes") of the stop judge at or above which the chain answers the question
    (0.5, the toolkit's yes/no rule). `max_triples` bounds one passage's triples (its extraction reply
    is cut at `extract_max_tokens` anyway). `stop_at_fixed_point`: the shared rule on the chain and
    the passages retrieved; it cannot fire as the loop stands (every round that goes on adds a triple
    not in the chain), so it only guards later changes.
    """

    k: int = setting(10, ge=1)
    T: int = setting(5, ge=1)
    candidates: int = setting(20, ge=1, le=len(LETTERS))
    answer_k: int = setting(3, ge=1)
    stop_threshold: float = setting(0.5, ge=0.0, le=1.0)
    max_triples: int = setting(12, ge=1)
    extract_max_tokens: int = setting(160, ge=1)
    answer_max_tokens: int = setting(32, ge=1)
    stop_at_fixed_point: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


class KiRAG:
    """KiRAG as a policy: grow a chain of knowledge triples by iterative retrieval, answer from its passages."""

    name = "kirag"
    revision = 1

    def __init__(self, settings: KiRAGSettings = KiRAGSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        retrieved: dict[str, Hit] = {}  # every passage retrieved so far, in order of first retrieval
        triples: dict[str, tuple[Triple, ...]] = {}  # the triples of each passage, extracted once
        chain: list[Triple] = []
        for round_ in range(s.T):
            if s.stop_at_fixed_point:
                state = (tuple(t.text for t in chain), tuple(retrieved))
                if (yield LoopState(state, round_, s.T - 1)) is not None:
                    break  # unreachable today (see KiRAGSettings); the chain so far is the outcome
            query = chain_query(question.text, chain)
            for hit in (yield Search(query, s.k)):
                retrieved.setdefault(hit.passage.id, hit)
            for pid, hit in retrieved.items():
                if pid not in triples:
                    triples[pid] = yield from self._extract(hit)
            in_chain = {t.text.lower() for t in chain}
            pool = [t for pid in retrieved for t in triples[pid] if t.text.lower() not in in_chain]
            candidates = first_cut(question.text, chain, pool, s.candidates)
            if not candidates:
                yield Note("kirag-step", "no-candidates", (("round", float(round_)),))
                break
            task = SELECT_TASK.format(question=question.text, chain=format_chain(chain),
                                      candidates=format_candidates(candidates))
            labels = LETTERS[:len(candidates)]
            scores = yield Probe("kirag-next-triple", (Message("user", task),), labels)
            chosen = max(range(len(candidates)), key=lambda i: (scores.probs[i], -i))  # ties: the better fit
            p_chosen, fallback = scores.p(labels[chosen])
            chain.append(candidates[chosen])
            yield Note("kirag-step", "extend", (("round", float(round_)), ("candidates", float(len(candidates))),
                                                ("choice", float(chosen)), ("p", p_chosen),
                                                ("fallback", float(fallback is not None))))
            task = STOP_TASK.format(question=question.text, chain=format_chain(chain))
            verdict = yield Probe("kirag-stop", (Message("user", task),), ("Yes", "No"))
            p_yes, fallback = verdict.p("Yes")
            stop = fallback is None and p_yes >= s.stop_threshold  # no mass on Yes/No: go on (recorded)
            yield Note("kirag-stop", "stop" if stop else "go-on",
                       (("round", float(round_)), ("p_yes", p_yes), ("fallback", float(fallback is not None))))
            if stop:
                break
        passages = rank_passages(chain, list(retrieved.values()))[:s.answer_k]
        task = ANSWER_TASK.format(question=question.text)
        out = yield Ask("answer", evidence_prompt(format_passages(passages), task),
                        Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
        return clean_answer(out.text)

    def _extract(self, hit: Hit) -> Generator[Any, Any, tuple[Triple, ...]]:
        """The knowledge triples of one passage, by the LLM (KiRAG's knowledge decomposition)."""
        prompt = (Message("system", EXTRACT_SYSTEM), *EXTRACT_EXEMPLAR,
                  Message("user", EXTRACT_USER.format(title=hit.passage.title, text=hit.passage.text)))
        out = yield Ask("extract-triples", prompt, Decoding(max_tokens=self.settings.extract_max_tokens,
                                                             stop=("\n\n",)))
        found = parse_triples(out.text)[:self.settings.max_triples]
        return tuple(Triple(h, r, t, hit.passage.id) for h, r, t in found)


def chain_query(question: str, chain: list[Triple]) -> str:
    """The retrieval query: the question, then the chain's triples as words."""
    return " ".join([question, *(t.words for t in chain)])


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= _SHORT or w.isdigit()}


def first_cut(question: str, chain: list[Triple], pool: list[Triple], n: int) -> list[Triple]:
    """The n triples of `pool` sharing the most distinct content words with the question and the chain
    (the stand-in for the aligner's first cut); ties keep the pool's order (passage retrieval order,
    then the order of extraction). A triple whose words are all in the chain already adds nothing and
    is left out, as are repeats of one triple from several passages (the first kept)."""
    wanted = _content_words(" ".join([question, *(t.words for t in chain)]))
    known = _content_words(" ".join(t.words for t in chain))
    seen: set[str] = set()
    scored = []
    for i, triple in enumerate(pool):
        key = triple.text.lower()
        words = _content_words(triple.words)
        if key in seen or (chain and words <= known):
            continue
        seen.add(key)
        scored.append((-len(words & wanted), i, triple))
    return [t for _, _, t in sorted(scored, key=lambda x: x[:2])[:n]]


def rank_passages(chain: list[Triple], hits: list[Hit]) -> list[Hit]:
    """The passages behind the chain's triples first (chain order), then the rest in retrieval order."""
    by_id = {h.passage.id: h for h in hits}
    first = list(dict.fromkeys(t.passage_id for t in chain if t.passage_id in by_id))
    return [by_id[pid] for pid in first] + [h for h in hits if h.passage.id not in set(first)]


def format_chain(chain: list[Triple]) -> str:
    return "\n".join(t.text for t in chain) or NO_CHAIN


def format_candidates(candidates: list[Triple]) -> str:
    return "\n".join(f"{letter}. {t.text}" for letter, t in zip(LETTERS, candidates))


# ------------------------------------------------------------------------ KiRAG's knowledge triples
_TRIPLE_BRACKETED = re.compile(r"<([^<>\n]*)>")
_LIST_MARK = re.compile(r"^\s*(?:[-*•]+|\d+[.)])?\s*")


def parse_triples(text: str) -> list[tuple[str, str, str]]:
    """The knowledge triples of an extraction reply, in order, without repeats (any case).

    A triple is "<head; relation; tail>" (KiRAG's format): every bracketed group with exactly three
    non-empty ";"-separated parts. Without any bracketed group, a line holding exactly three such
    parts (list marks and markup before it dropped) counts, for models that leave the brackets out.
    Anything else (prose, groups with two or four parts) is not a triple.
    """
    groups = _TRIPLE_BRACKETED.findall(text)
    if not groups:
        groups = [_LIST_MARK.sub("", line, count=1) for line in text.splitlines()]
    triples: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for group in groups:
        parts = [p.strip().strip(MARKUP).strip() for p in group.split(";")]
        if len(parts) == 3 and all(parts):
            triples.setdefault(tuple(p.lower() for p in parts), (parts[0], parts[1], parts[2]))
    return list(triples.values())
