"""IRCoT (Trivedi et al., 2023, "Interleaving retrieval with chain-of-thought reasoning for
knowledge-intensive multi-step questions", §3, and its code, StonyBrookNLP/ircot): one
chain-of-thought sentence, then one retrieval with that sentence as the query, in turn.

One question, as a policy over the shared runner loop:

1. Retrieve the top-K paragraphs for the question.
2. Reason: the model continues its chain of thought (an assistant turn it writes on, after two
   demonstrations) over the paragraphs collected so far; only the first sentence is kept
   (`first_sentence`). The chain stops at a sentence with "answer is" (the paper's
   "So the answer is:", `answer_is`), at an empty sentence, or after `max_steps` sentences.
3. Retrieve: otherwise the last sentence that is not a reasoning step ("So ...", "Thus ...", the
   code's rule) is the query; its top-K paragraphs not yet collected are appended, up to
   `max_paragraphs` in all, and the model reasons on.
4. Read: a separate QA prompt over all the paragraphs collected answers the question (IRCoT QA,
   §3.2: the reader is "direct" or "cot", a setting).

The paragraphs stay in the order they were collected (the first retrieval's, then each step's, in
rank order), as the paper's code keeps them, so every prompt's passages extend the previous ones
(a prefix cache reuses them). FlashRAG's IRCoT sorts the merged passages by ascending score instead
(the weakest first), which looks like a bug; not copied.

Every sentence is an `ircot-step` Decide step: "retrieve", "answer" (stop phrase), "empty",
"step-limit" or "cap-full" (the cap reached: the code still queries the retriever, which can add
nothing, so no Search is made), with the step and the paragraphs held. The policy is callable as a
sub-policy (`answer = yield from IRCoT(settings).policy(question)`, Adaptive-RAG's multi-step route);
its loop states are tagged "ircot" so they never meet a caller's.
Departures, on purpose: two short demonstrations without paragraphs (from MuSiQue's training split)
stand in for the paper's demonstrations with gold and distractor paragraphs (a 1.5B model's context
cannot hold them next to 15 paragraphs); the query is the sentence as written (the code drops
wh-words from Elasticsearch queries; a dense retriever reads the sentence); copies are found by
passage id (the code compares titles and text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer, extract_short_answer, sentence_spans
from metarag.policy.actions import Ask, Note, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

# Two demonstrations in the paper's "Q: ... A: <CoT> So the answer is: X." format, written from
# MuSiQue train questions 2hop__468258_495107 and 2hop__145144_562703.
DEMONSTRATIONS = (
    "Q: What country was the author of Brand a citizen of?\n"
    "A: Brand is a play by the Norwegian playwright Henrik Ibsen. Henrik Ibsen was a citizen of Norway. "
    "So the answer is: Norway.\n\n"
    "Q: In what county is the city where Harris W. Fawell was born?\n"
    "A: Harris W. Fawell was born in West Chicago. West Chicago is a city in DuPage County, Illinois. "
    "So the answer is: DuPage County.\n")
REASON_TASK = (
    "Answer the question by reasoning step by step from the passages, one short sentence per fact, as in "
    "the examples. End with 'So the answer is:' and a short answer (a name, a date, a number, a short "
    "phrase, or yes/no).\n\n" + DEMONSTRATIONS + "\nQ: {question}\nA:")
# The readers (IRCoT QA, §3.2): "direct" answers at once, "cot" reasons then answers.
DIRECT_READER_TASK = (
    "Answer the question using the passages. Give a short answer only: a name, a date, a number, a short "
    "phrase, or yes/no. Do not explain.\nQuestion: {question}\nShort answer:")
COT_READER_TASK = REASON_TASK

# The code's reasoning sentences (never a query): these openings, or arithmetic "a + b = c".
_REASONING_STARTS = ("thus ", "thus,", "so ", "so,", "that is,", "therefore", "hence")
_ARITHMETIC = re.compile(r".*(?:\d[\d,]*\.?\d+|\d+) [+-] (?:\d[\d,]*\.?\d+|\d+) = (?:\d[\d,]*\.?\d+|\d+)")


@dataclass(frozen=True)
class IRCoTSettings:
    """IRCoT settings (Trivedi et al., 2023, §3 and the released configs, StonyBrookNLP/ircot).

    k = 6 paragraphs per retrieval: the paper picks K from {2, 4, 6, 8} on development questions
    per dataset and model (`run.py`'s grid); 6 is the value the released base configs carry, and we
    tune nothing on evaluated questions. `max_paragraphs` = 15, the cap on collected paragraphs
    (`global_max_num_paras`, for the reader's context). `max_steps` = 10 sentences, the code's
    exit-controller limit (`max_num_sentences`, unchanged by every config). `reader` = "direct":
    the paper picks the reader on development questions too, and the released configs use the
    direct reader for every model below GPT3's size (Flan-T5 base to XXL; "cot" for
    code-davinci-002), the size class of the 1.5B model here. `step_max_tokens` bounds one reasoning
    generation (one sentence is kept); `answer_max_tokens` the direct reader, `cot_max_tokens` the
    CoT reader. `stop_at_fixed_point`: the shared rule (`methods/fixed_point.py`) on the paragraphs
    and the sentences; it cannot fire as the loop stands, since every step that goes on adds a
    sentence to the chain, so no step starts from an earlier one's state. `leading_newline` "skip":
    a reasoning reply that begins with a line break (the "\\n" stop fires before any text) is
    continued once from after the break, as the code reads a stripped generation; "end": such a
    reply is an empty sentence and ends the chain (before revision 2).
    """

    k: int = setting(6, ge=1)
    max_paragraphs: int = setting(15, ge=1)
    max_steps: int = setting(10, ge=1)
    reader: Literal["direct", "cot"] = "direct"
    step_max_tokens: int = setting(48, ge=1)
    answer_max_tokens: int = setting(32, ge=1)
    cot_max_tokens: int = setting(200, ge=1)
    stop_at_fixed_point: bool = True
    leading_newline: Literal["skip", "end"] = "skip"

    def __post_init__(self) -> None:
        check_ranges(self)


class IRCoT:
    """IRCoT as a policy: one CoT sentence, one retrieval, in turn; then a reader over all paragraphs."""

    name = "ircot"
    # Bumped when a prompt or rule changes what the method does for the same settings (hashed into run ids).
    revision = 2  # 2: a reply that begins with a line break is read on (leading_newline)

    def __init__(self, settings: IRCoTSettings = IRCoTSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        paragraphs = collect([], (yield Search(question.text, s.k)), s.max_paragraphs)
        sentences: list[str] = []
        states: list[tuple[list[Hit], list[str]]] = []  # at the start of each step
        for step in range(s.max_steps):
            if s.stop_at_fixed_point:
                state = ("ircot", tuple(h.passage.id for h in paragraphs), tuple(sentences))
                fixed = yield LoopState(state, step, s.max_steps - 1)
                if fixed is not None:  # the full loop would end as step `ends_as` did: in the state after it
                    after = fixed.ends_as + 1
                    paragraphs, sentences = states[after] if after < len(states) else (paragraphs, sentences)
                    break
                states.append((list(paragraphs), list(sentences)))
            prompt = reason_prompt(question.text, paragraphs, sentences)
            out = yield Ask("reason", prompt, Decoding(max_tokens=s.step_max_tokens, stop=("\n",)))
            if not out.text.strip() and out.finish_reason == "stop" and s.leading_newline == "skip":
                # the reply began with a line break: the code strips the generation and reads on, so
                # the sentence is what follows it (one more request, from after the break)
                head, turn = prompt[:-1], prompt[-1]
                out = yield Ask("reason", head + (Message("assistant", turn.content + out.text + "\n"),),
                                Decoding(max_tokens=s.step_max_tokens, stop=("\n",)))
            sentence = first_sentence(out.text)
            if sentence:
                sentences.append(sentence)
            if not sentence:
                choice = "empty"
            elif answer_is(sentence) is not None:
                choice = "answer"
            elif step == s.max_steps - 1:
                choice = "step-limit"
            elif len(paragraphs) >= s.max_paragraphs:
                choice = "cap-full"
            else:
                choice = "retrieve"
            yield Note("ircot-step", choice, (("step", float(step)), ("paragraphs", float(len(paragraphs)))))
            if choice in ("empty", "answer", "step-limit"):
                break
            if choice == "retrieve":
                hits = yield Search(retrieval_query(question.text, sentences), s.k)
                paragraphs = collect(paragraphs, hits, s.max_paragraphs)
        return (yield from self.read(question, paragraphs))

    def read(self, question: Question, paragraphs: list[Hit]) -> Policy:
        """IRCoT QA's reader over the collected paragraphs, in the order they were collected."""
        s = self.settings
        if s.reader == "direct":
            out = yield Ask("answer", evidence_prompt(format_passages(paragraphs),
                                                      DIRECT_READER_TASK.format(question=question.text)),
                            Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
            return clean_answer(out.text)
        out = yield Ask("answer", evidence_prompt(format_passages(paragraphs),
                                                  COT_READER_TASK.format(question=question.text)),
                        Decoding(max_tokens=s.cot_max_tokens, stop=("\n\n",)))
        return extract_short_answer(out.text)


def reason_prompt(question: str, paragraphs: list[Hit], sentences: list[str]) -> tuple[Message, ...]:
    """The reasoning prompt: the paragraphs, the task with the demonstrations, then the chain of
    thought so far as the assistant turn to continue."""
    return evidence_prompt(format_passages(paragraphs), REASON_TASK.format(question=question)) + (
        Message("assistant", " ".join(sentences)),)


def collect(paragraphs: list[Hit], hits: list[Hit], cap: int) -> list[Hit]:
    """`paragraphs` then the hits not among them, in rank order, until `cap` paragraphs in all."""
    out = list(paragraphs)
    ids = {h.passage.id for h in out}
    for hit in hits:
        if len(out) >= cap:
            break
        if hit.passage.id not in ids:
            ids.add(hit.passage.id)
            out.append(hit)
    return out


def first_sentence(text: str) -> str:
    """The first sentence of a reply (IRCoT keeps one CoT sentence per step), stripped; "" for none:
    the first sentence (`parsing.sentence_spans`) of the reply's first non-empty line, the whole line
    when nothing ends one."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    spans = sentence_spans(line)
    return line[spans[0][0]:spans[0][1]] if spans else ""


def is_reasoning_sentence(sentence: str) -> bool:
    """A sentence that states a conclusion, not a fact to retrieve with (the code's rule)."""
    return sentence.lower().startswith(_REASONING_STARTS) or _ARITHMETIC.match(sentence) is not None


def retrieval_query(question: str, sentences: list[str]) -> str:
    """The next query: the last sentence that is not a reasoning step, else the question."""
    facts = [s for s in sentences if not is_reasoning_sentence(s)]
    return facts[-1] if facts else question


# ---------------------------------------------------------------------------------- the stop phrase
# IRCoT's stop phrase ("So the answer is: X"): "answer is", not inside a word, an optional colon.
_ANSWER_IS = re.compile(r"(?<![A-Za-z])answer\s+is(?![\w'’])[\s*_]*:?", re.IGNORECASE)


def answer_is(text: str) -> str | None:
    """The answer after the first "answer is" phrase of `text` (IRCoT's stop phrase, "So the answer
    is: Dijon." -> "Dijon"), cleaned; "" when the phrase ends the text; None without the phrase."""
    found = _ANSWER_IS.search(text)
    return None if found is None else clean_answer(text[found.end():])
