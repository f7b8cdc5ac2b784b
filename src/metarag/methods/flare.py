"""FLARE (Jiang et al., 2023, "Active Retrieval Augmented Generation", §3.2: FLARE-direct), a
baseline of the MetaRAG reproducibility study (§4.2, Table 1): write the answer sentence by
sentence, retrieving only when the model is unsure of the sentence it is about to write.

One question, as a policy over the shared runner loop:

1. Retrieve the top-k passages for the question (§3.1: at the first step the user input is the
   query; the released 2WikiMultihopQA config's `look_ahead_pre_retrieval: "first"`).
2. Until the answer ends or the length budget is spent, per sentence:
   - look ahead: the model continues the partial answer (an Ask whose last message is the partial
     assistant turn, continued, not closed) with per-token probabilities, for up to
     `look_ahead_tokens` tokens or to the first sentence end (`look_ahead_sentence`);
   - if every token's probability is at least θ, the sentence is kept as written ("keep");
   - else ("retrieve") the query is the sentence with the tokens below β masked out (§3.2.2,
     implicit query; `masked_query`) or, with `query_mode="question"`, one generated question per
     low-confidence span (§3.2.2, explicit query; `low_spans`); the passages retrieved replace the
     context, and the sentence is generated again from them.
3. The short answer is read off the answer text the way the paper's multihop-QA exemplars end it,
   "So the answer is X." (`marked_answer`); an answer that never says it (budget spent) is continued
   once with "So the answer is" and that continuation is the answer.

Every sentence is a `flare-sentence` Decide step ("keep" / "retrieve"; signals: the sentence's
index, its lowest token probability, how many tokens were masked, its length in tokens, whether the
query came out empty). The final reading is a `flare-answer` Decide step ("marked" / "prompted").

Departures and choices the paper leaves open, on purpose:
- The look-ahead sees the passages of the last retrieval, as the released code's prompt keeps them
  (the paper's notation writes it without documents); a kept sentence is not generated a second time
  (the released code asks again with the same prompt, which under greedy decoding repeats it).
- Generation stops at the first sentence end (stop strings ". ", "? ", "! " ...) where the released
  code decodes 64 tokens and cuts after the first sentence: the same sentence under greedy decoding.
  Where a stop fires inside a sentence — at an abbreviation or an initial ("Dr. ", "Henry J. ") —
  generation goes on from there with the budget left (`_sentence`), so the sentence is the one the
  released code's sentencizer would cut (revision 2 took the text through such a stop as the
  sentence, and "So the answer is Henry J." ended the answer one word short).
- Two short exemplars from the MuSiQue train split stand in for the paper's eight 2Wiki exemplars
  (a 1.5B model's context holds five passages and little else), in the paper's "Answer: <reasoning>.
  So the answer is X." form; a chat template stands in for text-davinci-003's raw completion.
- A sentence that reads "So the answer is ..." ends the answer (the exemplars end there; the paper's
  model stops at the blank line that follows, which a chat model does not reliably write).
- "question" mode asks the question about each low-confidence span as the released code does, but
  without its extra model calls that first widen each span to a whole phrase; questions that do not
  end with "?" are dropped (as there), and when none is left the masked sentence is the query.
- Back-ends without token probabilities cannot run FLARE: the look-ahead is refused with a one-line
  ConfigError.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from metarag.errors import ConfigError
from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer, marked_answer, sentence_spans
from metarag.policy.actions import Ask, Note, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Completion, Hit, Message, Question
from metarag.settings import check_ranges, setting

# Exemplars written from MuSiQue train (train100_official.json: 2hop__468258_495107 and
# 2hop__205146_62031), in FLARE's multihop-QA answer form; not from HotpotQA train100, whose
# questions are the demo set's.
EXEMPLARS = (
    "Question: What country was the author of Brand a citizen of?\n"
    "Answer: Brand was written by Henrik Ibsen. Henrik Ibsen was a citizen of Norway. So the answer is Norway.\n\n"
    "Question: What is the name of the waterfall in the country where the Bubye River is found?\n"
    "Answer: The Bubye River is found in Zimbabwe. The waterfall in Zimbabwe is Victoria Falls. So the answer is "
    "Victoria Falls.\n\n")
# Each exemplar's own search results, shown before it as the released 2Wiki configuration does
# (`use_ctx_for_examplars`: "ret", the exemplars retrieval-augmented): the opening sentences of the
# questions' supporting MuSiQue paragraphs, so the model sees how an answer uses its passages.
EXEMPLAR_CONTEXTS = (
    "Search results:\n[1] Brand (play): Brand is a play by the Norwegian playwright Henrik Ibsen.\n"
    "[2] Nora Ibsen: Nora Bergliot Ibsen (born 1951) is a Norwegian theatrical producer, noted for being the "
    "producer of the 2006 Ibsen Year, Norway's major anniversary of playwright Henrik Ibsen's death.\n",
    "Search results:\n[1] Bubye River: The Bubye River, also known as Bubi River, is a tributary of the Limpopo "
    "River in Beitbridge District and Gwanda District, Zimbabwe.\n"
    "[2] Victoria Falls: Victoria Falls is a waterfall in southern Africa on the Zambezi River at the border "
    "between Zambia and Zimbabwe.\n")
ANSWER_HEAD = ("Answer the question by reasoning step by step in a few short sentences, then end with 'So the "
               "answer is <short answer>.' (a name, a date, a number, a short phrase, or yes/no), as in the "
               "examples.\n\n")
ANSWER_TASK = ANSWER_HEAD + EXEMPLARS + "Question: {question}\nAnswer:"
ANSWER_TASK_WITH_CONTEXTS = ANSWER_HEAD + "".join(
    context + exemplar + "\n\n" for context, exemplar in zip(EXEMPLAR_CONTEXTS, EXEMPLARS.split("\n\n"))
) + "Question: {question}\nAnswer:"
# The released code's explicit-query prompt (templates.py `ask_question_text`), over the answer so far.
QUESTION_TASK = ('{text}\n\nGiven the above passage, ask a question to which the answer is the term/entity/phrase '
                 '"{term}".')
ANSWER_CUE = "So the answer is"

ANSWER_END = "\n\n"  # the released code's final stop: a blank line ends the answer
# A look-ahead stops at its first sentence end instead of decoding all 64 tokens and cutting there as
# the released code does: under greedy decoding the sentence kept is the same, for a third of the work.
SENTENCE_STOPS = (ANSWER_END, ". ", "? ", "! ", ".\n", "?\n", "!\n")
MIN_SENTENCE_CHARS = 5  # the released code's `min_sent_len`: a boundary earlier than this is no sentence end
SPAN_GAP = 5  # the released code's `min_gap`: low tokens fewer than this apart belong to one span


@dataclass(frozen=True)
class FLARESettings:
    """FLARE-direct settings, with the paper's values for multihop QA (2WikiMultihopQA).

    θ = 0.8 and β = 0.4: retrieve when any token of the look-ahead sentence has probability below θ
    (§3.2.1), mask the tokens below β out of the query (§3.2.2); the values the authors released for
    2WikiMultihopQA (configs/2wikihop_flare_config.json: `look_ahead_filter_prob` 0.8,
    `look_ahead_mask_prob` 0.4), which the paper's appendix table of per-dataset hyperparameters
    lists. FlashRAG's θ = 0.2 retrieves for fewer sentences. The released code triggers at "<= θ";
    the paper's "lower than θ" is used here (they differ only at exactly θ).
    `look_ahead_tokens` = 64 (the config's `look_ahead_steps`) and `max_tokens` = 256,
    the answer's length budget (openai.sh `max_generation_len` for 2WikiMultihopQA). k = 5, the
    study's depth for every method (§4.3.2) where the paper retrieved 2 documents for 2Wiki.
    `query_mode`: "masked" (implicit queries, the paper's 2Wiki choice) or "question" (explicit).
    `initial_retrieval`: retrieve with the question before the first sentence (the paper does).
    `stop_at_fixed_point`: the shared rule on the context and the answer so far; it cannot fire as
    the loop stands, since every sentence that goes on adds at least one token to the answer.
    `exemplar_contexts`: each exemplar shown after its own search results, as the released 2Wiki
    configuration's `use_ctx_for_examplars` ("ret") does; off: the exemplars alone (before revision 4).
    """

    k: int = setting(5, ge=1)
    theta: float = setting(0.8, ge=0, le=1)
    beta: float = setting(0.4, ge=0, le=1)
    query_mode: Literal["masked", "question"] = "masked"
    look_ahead_tokens: int = setting(64, ge=1)
    max_tokens: int = setting(256, ge=1)
    initial_retrieval: bool = True
    question_max_tokens: int = setting(32, ge=1)
    answer_max_tokens: int = setting(32, ge=1)
    stop_at_fixed_point: bool = True
    exemplar_contexts: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


class FLARE:
    """FLARE-direct as a policy: look ahead one sentence, retrieve and rewrite it when unsure."""

    name = "flare"
    # Revision 2: revision 1's exemplars were HotpotQA train questions, which are also demo questions.
    # Revision 3: a stop that fires inside a sentence (an abbreviation, an initial) no longer ends it.
    # Revision 4: the exemplars with their own search results (exemplar_contexts).
    revision = 4
    # checked against the back-end before the first question (methods.runner.check_needs)
    needs = {"token_logprobs": "flare needs per-token probabilities, which this LLM back-end does not return: use "
                               "--llm embedded, gguf:PATH or hf"}

    def __init__(self, settings: FLARESettings = FLARESettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        task = answer_task(question.text, s.exemplar_contexts)
        context: list[Hit] = (yield Search(question.text, s.k)) if s.initial_retrieval else []
        answer, used = "", 0
        states: list[list[Hit]] = []  # the context each sentence started from
        last = s.max_tokens - 1  # each sentence adds a token at least: at most max_tokens of them
        for index in range(s.max_tokens):
            if used >= s.max_tokens:
                break
            if s.stop_at_fixed_point:
                state = (tuple((h.passage.id, h.passage.text) for h in context), answer)
                fixed = yield LoopState(state, index, last)
                if fixed is not None:  # the same context and answer: the full loop only repeats itself
                    context = states[fixed.ends_as]
                    break
                states.append(list(context))
            budget = min(s.look_ahead_tokens, s.max_tokens - used)
            look = yield from _sentence("look-ahead", task, context, answer, budget)
            sentence, probs, ended = look_ahead_sentence(look)
            if not sentence.strip():
                break
            lowest = min(probs, default=1.0)
            chosen, masked, empty = look, 0, False
            if lowest < s.theta:
                query, masked = masked_query(list(zip(_pieces(look, len(probs)), probs)), s.beta)
                queries = [query] if query else []
                if s.query_mode == "question":
                    asked = yield from self._questions(answer + sentence, _pieces(look, len(probs)), probs)
                    queries = asked or queries
                empty = not queries
                if queries:
                    found = []
                    for q in queries:
                        found.append((yield Search(q, s.k)))
                    context = merge_round_robin(found, s.k)
                    chosen = yield from _sentence("regenerate", task, context, answer, budget)
                    sentence, probs, ended = look_ahead_sentence(chosen)
            choice = "retrieve" if chosen is not look else "keep"
            yield Note("flare-sentence", choice, (("sentence", float(index)), ("min_prob", lowest),
                                                  ("masked", float(masked)), ("tokens", float(len(probs))),
                                                  ("empty_query", float(empty))))
            if not sentence.strip():
                break
            answer += sentence
            used += max(1, len(probs))
            if ended or marked_answer(sentence) is not None:
                break
        found = marked_answer(answer)
        yield Note("flare-answer", "marked" if found is not None else "prompted", (("tokens", float(used)),))
        if found is not None:
            return found
        cue = answer + ("" if not answer or answer[-1].isspace() else " ") + ANSWER_CUE
        out = yield Ask("answer", answer_prompt(task, context, cue),
                        Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
        return clean_answer(out.text)

    def _questions(self, text: str, pieces: list[str], probs: list[float]) -> Policy:
        """Explicit queries (§3.2.2): one generated question per low-confidence span of the sentence."""
        questions = []
        for term in low_spans(pieces, probs, self.settings.beta):
            out = yield Ask("question", (Message("user", QUESTION_TASK.format(text=text.strip(), term=term)),),
                            Decoding(max_tokens=self.settings.question_max_tokens, stop=("\n",)))
            asked = re.sub(r"^\s*(?:question\s*:\s*)?", "", out.text.strip(), flags=re.I).strip()
            if asked.endswith("?"):
                questions.append(asked)
        return questions


def answer_task(question: str, exemplar_contexts: bool = True) -> str:
    """The task: the instruction, the exemplars (after their own search results, or alone) and the question."""
    return (ANSWER_TASK_WITH_CONTEXTS if exemplar_contexts else ANSWER_TASK).format(question=question)


def answer_prompt(task: str, context: Sequence[Hit], answer: str) -> tuple[Message, ...]:
    """The passages and the task (`answer_task`); the answer so far as the assistant's open turn."""
    prompt = evidence_prompt(format_passages(context), task)
    return prompt + (Message("assistant", answer),) if answer else prompt


def _sentence(purpose: str, task: str, context: Sequence[Hit], answer: str, budget: int) -> Policy:
    """Ask for the next sentence of the answer, within `budget` tokens. When a sentence stop fired
    where no sentence ends (an abbreviation or an initial: "Henry J. "), ask again from the answer
    through that stop, with the budget left, and join the two outputs (their tokens' offsets shifted
    into one text), until a real sentence end or the budget is spent. Returns one Completion."""
    out = yield Ask(purpose, answer_prompt(task, context, answer),
                    Decoding(max_tokens=budget, stop=SENTENCE_STOPS, logprobs=1))
    _require_tokens(out)
    while (out.finish_reason == "stop" and out.stop in SENTENCE_STOPS[1:]
           and sentence_end(out.text + out.stop) is None and budget - len(out.tokens or ()) > 0):
        head = out.text + out.stop.rstrip()  # the open turn ends at the mark: the model writes the space
        more = yield Ask(purpose, answer_prompt(task, context, answer + head),
                         Decoding(max_tokens=budget - len(out.tokens or ()), stop=SENTENCE_STOPS, logprobs=1))
        _require_tokens(more)
        tokens = tuple(out.tokens or ()) + tuple(dataclasses.replace(t, offset=t.offset + len(head))
                                                 for t in more.tokens or ())
        out = dataclasses.replace(more, text=head + more.text, tokens=tokens)
    return out


def _require_tokens(completion: Completion) -> None:
    if completion.tokens is None or (completion.text.strip() and not completion.tokens):
        raise ConfigError("flare needs per-token probabilities, but the run's LLM back-end returned none for the "
                          "look-ahead (an OpenAI-compatible server without logprobs?): use the embedded, hf or "
                          "scripted back-end, or a server that returns logprobs")


def _pieces(completion: Completion, n: int) -> list[str]:
    return [t.token for t in (completion.tokens or ())[:n]]


# ------------------------------------------------------------------------------------ sentences
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "no", "mt", "inc",
                            "ltd", "co", "gen", "col", "lt", "sgt", "capt", "rev", "fig", "vol", "ca"})


def sentence_end(text: str, min_chars: int = MIN_SENTENCE_CHARS) -> int | None:
    """The end (exclusive, trailing whitespace not included) of the first sentence of `text`, or None
    when no sentence boundary closes one yet: `parsing.sentence_spans` on a text that goes on, with
    `_ABBREVIATIONS` and `min_chars` (the released code's sentencizer rules, without its trained model)."""
    spans = sentence_spans(text, abbreviations=_ABBREVIATIONS, min_chars=min_chars, open_end=True)
    return spans[0][1] if spans else None


def look_ahead_sentence(completion: Completion) -> tuple[str, list[float], bool]:
    """(the completion's first sentence, its tokens' probabilities, whether the answer ends with it).

    The sentence is the output through the stop string that ended it (`SENTENCE_STOPS`), cut at
    `sentence_end`, trailing whitespace left for the next sentence; its tokens are those that start
    before its end (a token that crosses the end counts). Without a sentence end: a sentence stop
    that fired at none ("Dr. ") gives the text through it, anything else the whole text. The answer
    ends with the sentence when nothing but whitespace follows it and the model ended its turn or
    wrote the blank line (the released code's final stop, "\n\n")."""
    stop = completion.stop if completion.finish_reason == "stop" and completion.stop else ""
    raw = completion.text + stop  # the output through the stop string
    end = sentence_end(raw)
    if end is None:
        end = len((raw if stop in SENTENCE_STOPS[1:] else completion.text).rstrip())
    probs = [math.exp(t.logprob) for t in completion.tokens or () if t.offset < end]
    final = completion.finish_reason == "eos" or stop == ANSWER_END
    return raw[:end], probs, final and not raw[end:].strip()


# ------------------------------------------------------------------------------------- queries
def masked_query(tokens: Sequence[tuple[str, float]], beta: float) -> tuple[str, int]:
    """FLARE's implicit query (§3.2.2): the sentence with every token whose probability is below
    `beta` masked out. `tokens` are (piece, probability); a masked piece becomes a space, runs of
    whitespace one space. Returns (query, how many tokens were masked); "" when all were."""
    kept, masked = [], 0
    for piece, prob in tokens:
        if prob < beta:
            kept.append(" ")
            masked += 1
        else:
            kept.append(piece)
    return " ".join("".join(kept).split()), masked


def low_spans(pieces: Sequence[str], probs: Sequence[float], beta: float, gap: int = SPAN_GAP) -> list[str]:
    """The low-confidence spans of a sentence, for explicit queries: a token below `beta` starts a span,
    or extends the last one (through the tokens between) when fewer than `gap` tokens after its last
    low token (the released code's rule); each span's text stripped, punctuation-only spans dropped."""
    spans: list[list[int]] = []
    previous = None
    for i, p in enumerate(probs):
        if p >= beta:
            continue
        if previous is not None and i - previous < gap:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])
        previous = i
    terms = ["".join(pieces[a:b]).strip() for a, b in spans]
    return [t for t in terms if any(c.isalnum() for c in t)]


def merge_round_robin(results: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
    """The hits of several queries merged rank by rank (first of each, then second ...), each passage
    once, cut to k (the released code's merge of nested queries)."""
    merged: list[Hit] = []
    seen: set[str] = set()
    for rank in range(max((len(r) for r in results), default=0)):
        for hits in results:
            if rank < len(hits) and hits[rank].passage.id not in seen:
                seen.add(hits[rank].passage.id)
                merged.append(hits[rank])
    return merged[:k]
