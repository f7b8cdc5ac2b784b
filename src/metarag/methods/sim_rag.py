"""SIM-RAG (Yang et al., 2025), as the MetaRAG reproducibility study compared it (§3.2, §4.3.5, §5.5):
a reasoner answers, a critic decides whether to accept the answer or to search again.

One question, as a policy over the shared runner loop:

1. Retrieve the top-k passages for the question (the study ran SIM-RAG on its own top-5 retrieval,
   §4.3.2; the official code starts from no passages, which `k=0` reproduces).
2. Turn 0..max_turns: the reasoner answers from the question and every passage gathered so far, as
   `Answer:` and `Rationale:` lines; the critic judges (question, passages, answer, rationale).
   Accepted: that answer is final. Rejected: the reasoner writes a search query, the top
   `k_followup` passages not seen before are appended in rank order, and it answers again. The
   critic judges the last turn's answer too (as the official code does, so its verdicts can be
   counted), but that answer is final whatever it says.

Every critic verdict is a Judge step (after the LLM critic's own Score step, its prompt and label
probabilities) and a `sim-rag-turn` Decide step (accept / reject, with p_accept and the turn).
Departures from the official code, on purpose: decoding is greedy (the study's temperature 0,
§4.3.1; the official code samples at 0.6), the query is asked for as one
plain line rather than a JSON object (small models break the JSON), and the loop stops early when a
follow-up search finds nothing new (greedy decoding would repeat the same answer and verdict).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from metarag.errors import ConfigError
from metarag.judges.base import Judge
from metarag.judges.critic import ACCEPT, LLMCritic, TrainedCritic
from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import clean_line, first_json_object, parse_answer_rationale
from metarag.policy.actions import Ask, Assess, Note, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

# The official reasoner prompt (force_answer_prompt and its "Answer: / Rationale:" format), put after
# the shared evidence prefix so the reasoner, the critic and the query writer share the KV cache.
ANSWER_TASK = ("Question: {question}\n"
               "Answer this multi-hop question based on the passages above, if any. If you do not know part of "
               "what the question refers to, do not make it up; if unsure, answer 'unsure'.\n"
               "Respond only in this format, nothing else:\n"
               "Answer: <the short answer: a name, a date, a number, a short phrase, or yes/no>\n"
               "Rationale: <a brief multi-hop explanation, one or two sentences>")
# The official search_query_prompt, shortened: one query for one missing part of the question.
QUERY_TASK = ("Question: {question}\n"
              "The passages above are not enough to answer the question. Write one search query for a single "
              "entity or fact the question needs that the passages do not cover yet. Do not repeat a passage "
              "title. Reply with the search query only.")


@dataclass(frozen=True)
class SimRAGSettings:
    """SIM-RAG settings.

    k = 5: the first retrieval, the study's top five passages (§4.3.2, identical retrieval conditions
    for MetaRAG and SIM-RAG); 0 starts from no passages as the official code does.
    k_followup = 2: passages per follow-up query (official `top_docs=2`), seen passages excluded
    (official `remove_repeat_docs`).
    max_turns = 4: follow-up turns after the first answer (official inference `max_turns=4`).
    critic: "llm" (the LLM's label probabilities), or the folder of a critic trained with
    `metarag train-critic`. critic_labels: accept label first; ("1", "0") are the official critic's.
    accept_threshold = 0.5: P(accept) at or above it accepts (the official critic takes its argmax).
    max_tokens = 128 for answer and rationale ("a brief explanation"; official cap 256),
    query_max_tokens = 32 for one search query.
    """

    k: int = setting(5, ge=0)
    k_followup: int = setting(2, ge=1)
    max_turns: int = setting(4, ge=0)
    critic: str = "llm"
    critic_labels: tuple[str, ...] = ("Yes", "No")
    accept_threshold: float = setting(0.5, ge=0, le=1)
    max_tokens: int = setting(128, ge=1)
    query_max_tokens: int = setting(32, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.critic.strip():
            raise ConfigError("sim-rag critic must be 'llm' or the folder of a trained critic")


def build_critic(settings: SimRAGSettings) -> Judge:
    """The critic `settings.critic` names: the LLM critic, or the trained one in that folder (its
    manifest and encoder are checked here, before any model is loaded)."""
    if settings.critic == "llm":
        return LLMCritic(tuple(settings.critic_labels), settings.accept_threshold)
    return TrainedCritic(settings.critic, settings.accept_threshold)


def reasoner_prompt(question: str, passages: str) -> tuple[Message, ...]:
    """The reasoner's prompt: the formatted passages first, the question and answer format last.
    Self-practice (`metarag.train.critic`) asks exactly this."""
    return evidence_prompt(passages, ANSWER_TASK.format(question=question))


def query_prompt(question: str, passages: str) -> tuple[Message, ...]:
    """The prompt asking for the next search query, over the same evidence prefix."""
    return evidence_prompt(passages, QUERY_TASK.format(question=question))


class SimRAG:
    """SIM-RAG: answer, let the critic accept or reject, search again on rejection (see the module)."""

    name = "sim-rag"

    def __init__(self, settings: SimRAGSettings = SimRAGSettings(), critic: Judge | None = None):
        self.settings = settings
        self.critic = critic if critic is not None else build_critic(settings)

    def policy(self, question: Question) -> Policy:
        s = self.settings
        hits: list[Hit] = list((yield Search(question.text, s.k))) if s.k > 0 else []
        answer = ""
        for turn in range(s.max_turns + 1):
            passages = format_passages(hits)
            completion = yield Ask("answer", reasoner_prompt(question.text, passages),
                                   Decoding(max_tokens=s.max_tokens))
            answer, rationale = parse_answer_rationale(completion.text)
            if not answer:  # nothing readable, or only the format's placeholder echoed: the critic judges ""
                yield Note("sim-rag-answer", "no-answer", (("turn", float(turn)),))
            verdict = yield Assess(self.critic, {"question": question.text, "passages": passages,
                                                 "answer": answer, "rationale": rationale})
            accepted = verdict.verdict == ACCEPT
            signals = [("turn", float(turn)), ("passages", float(len(hits)))]
            if verdict.score is not None:
                signals.insert(0, ("p_accept", float(verdict.score)))
            yield Note("sim-rag-turn", "accept" if accepted else "reject", tuple(signals))
            if accepted or turn == s.max_turns:
                break
            # No stop at a newline: a model that opens with a blank line or a code fence would be cut
            # before its query; parse_query takes the first line that holds one.
            reply = yield Ask("query", query_prompt(question.text, passages),
                              Decoding(max_tokens=s.query_max_tokens))
            query = parse_query(reply.text)
            if not query:
                yield Note("sim-rag-query", "question-fallback")
                query = question.text
            seen = frozenset(h.passage.id for h in hits)
            new = list((yield Search(query, s.k_followup, exclude=seen)))
            if not new:
                yield Note("sim-rag-stop", "no-new-passages", (("turn", float(turn)),))
                break
            hits.extend(new)
        return answer


# ----------------------------------------------------------------------------------- self-practice
PRACTICE_EVIDENCE = "practice-evidence"  # the Decide step naming how many passages the next answer saw


@dataclass(frozen=True)
class SelfPracticeSettings:
    """SIM-RAG's self-practice (Yang et al., 2025, §3.2): the reasoner answers a training question
    over growing evidence, so the critic learns from answers made with too little and with enough.

    evidence_sizes = (0, 1, 3, 5): answers over the top 0, 1, 3 and 5 passages of one retrieval (the
    official code varies evidence by running its retrieval turns; prefixes of one retrieval do the
    same in fewer calls, and share the KV cache). max_tokens = 128, the reasoner's budget in SIM-RAG.
    """

    evidence_sizes: tuple[int, ...] = (0, 1, 3, 5)
    max_tokens: int = setting(128, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.evidence_sizes or any(n < 0 for n in self.evidence_sizes):
            raise ConfigError(f"evidence_sizes must be counts >= 0, got {self.evidence_sizes}")


class SimRAGPractice:
    """Self-practice as a method, so the evaluation harness runs it (a run folder, resumable, every
    answer a Generate step): one retrieval of the top max(evidence_sizes) passages, then one answer
    per evidence size, smallest first so each prompt extends the previous one's cached prefix. Each
    answer follows a `practice-evidence` Decide step with the passages it saw; `metarag.train.critic`
    labels the answers from the trace. The returned answer is the one over the most evidence."""

    name = "sim-rag-practice"

    def __init__(self, settings: SelfPracticeSettings = SelfPracticeSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        sizes = sorted(set(self.settings.evidence_sizes))
        hits: list[Hit] = list((yield Search(question.text, sizes[-1]))) if sizes[-1] > 0 else []
        answer = ""
        for n in sizes:
            shown = hits[:n]
            yield Note(PRACTICE_EVIDENCE, str(len(shown)), (("passages", float(len(shown))),))
            completion = yield Ask("answer", reasoner_prompt(question.text, format_passages(shown)),
                                   Decoding(max_tokens=self.settings.max_tokens))
            answer = parse_answer_rationale(completion.text)[0]
        return answer


# -------------------------------------------------------------------------------- reading the reply
_QUERY_PREFIX = re.compile(r"^(?:search\s+query|query)\s*:\s*", re.IGNORECASE)


def parse_query(text: str) -> str:
    """The search query in a reply: a JSON object's "search_query" (SIM-RAG's official format), else
    the first line that is not empty once stripped of a "Query:" label, quotes, code fences and
    markdown. "" when there is none."""
    data = first_json_object(text)
    if data is not None:
        value = data.get("search_query", data.get("query"))
        if isinstance(value, str) and value.strip():
            return value.strip()
    for line in text.splitlines():
        if line.strip().startswith("```"):
            continue
        query = clean_line(_QUERY_PREFIX.sub("", clean_line(line)))
        if query:
            return query
    return ""
