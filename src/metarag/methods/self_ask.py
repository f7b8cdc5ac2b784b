"""Self-Ask (Press et al., 2022, "Measuring and narrowing the compositionality gap in language
models", §3.2 and §3.3 "Self-ask + Search Engine"), with the retriever answering each follow-up.

One question, as a policy over the shared runner loop:

1. The model continues "Are follow up questions needed here:" (an assistant turn it writes on,
   after two demonstrations in the paper's format), stopped at "Intermediate answer:".
2. A "Follow up: <question>" retrieves the top-k passages for the follow-up, and the model answers
   the follow-up from them in a few words (an `intermediate-answer` Ask: in the paper the search
   engine's answer box answers it, from its own results only). "Intermediate answer: <answer>"
   joins the text and the model writes on. Up to `max_follow_ups` follow-ups.
3. "So the final answer is: <answer>" ends the loop; without one (the limit reached, or a reply
   with neither label), the text is continued from "So the final answer is:" (the paper's code
   appends that label when the model stops without it).

Every reply is a `self-ask-step` Decide step ("follow-up", "final" or "final-prompt", as IterDRAG's
`parsing.parse_step` reads the format), with the step and whether it was read without its label.
Departures, on purpose: two short demonstrations from MuSiQue's training split stand in for the
paper's four (a 1.5B model's context holds them next to the passages; the Bamboogle / 2Wiki
demonstrations are not from our training data); the model's text is rebuilt from the parsed
follow-ups and answers at each step (the paper keeps the raw text), so a reply's extra words do not
carry into the next prompt.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import FINAL_ANSWER_PATTERN, FOLLOW_UP_PATTERN, clean_answer, final_after, parse_step, strip_label
from metarag.policy.actions import Ask, Note, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

NEEDED = "Are follow up questions needed here:"
FINAL_LABEL = "So the final answer is:"
# Two demonstrations in the paper's format (its Figure 3), written from MuSiQue train questions
# 2hop__468258_495107 and 2hop__145144_562703 (`../shared/data/musique/train100_official.json`).
DEMONSTRATIONS = (
    "Question: What country was the author of Brand a citizen of?\n"
    f"{NEEDED} Yes.\n"
    "Follow up: Who wrote the play Brand?\n"
    "Intermediate answer: Henrik Ibsen\n"
    "Follow up: What country was Henrik Ibsen a citizen of?\n"
    "Intermediate answer: Norway\n"
    f"{FINAL_LABEL} Norway\n\n"
    "Question: In what county is the city where Harris W. Fawell was born?\n"
    f"{NEEDED} Yes.\n"
    "Follow up: In which city was Harris W. Fawell born?\n"
    "Intermediate answer: West Chicago\n"
    "Follow up: In what county is West Chicago?\n"
    "Intermediate answer: DuPage County\n"
    f"{FINAL_LABEL} DuPage County\n")
STEP_TASK = (
    "Answer the question by asking follow-up questions one at a time, as in the examples. Each follow-up "
    "is answered for you. When you know the answer, write 'So the final answer is:' and a short answer "
    "(a name, a date, a number, a short phrase, or yes/no).\n\n" + DEMONSTRATIONS + "\nQuestion: {question}")
STEP_SYSTEM = "You are a careful assistant for multi-hop question answering."
INTERMEDIATE_TASK = (
    "Question: {follow_up}\n"
    "Answer the question from the passages in a few words.\nAnswer:")
STEP_STOP = ("Intermediate answer:", "Intermediate Answer:", "\nQuestion:")


@dataclass(frozen=True)
class SelfAskSettings:
    """Self-Ask settings (Press et al., 2022, §3.3, Self-ask + Search Engine).

    k = 5 passages per follow-up (the MetaRAG study's depth, §4.3.2; the paper's search engine gives
    one answer). `max_follow_ups` = 5: the paper sets no limit (its model writes until it gives a
    final answer, within the generation length); 5 is FlashRAG's `max_iter`, above the 2-4 hops of
    HotpotQA, 2Wiki and MuSiQue. `passages`: what a follow-up's intermediate answer reads. "replace"
    (default): the follow-up's own top-k, the earlier ones dropped, as the paper implies (the search
    engine answers each follow-up from its own results; nothing of an earlier search reaches later
    steps but the answer) and FlashRAG does; "accumulate": every passage retrieved so far (in
    retrieval order, each once). `step_context`: what the step prompts (the next follow-up, the final
    answer) read besides the question and the follow-ups with their answers. "none" (default): nothing,
    as in the paper, where the model's prompt holds only the self-ask text; "passages": FlashRAG's
    variant, which retrieves k for the question first and shows the passages held (as `passages`
    says). step/answer max tokens bound each generation. `stop_at_fixed_point`: the shared rule
    (`methods/fixed_point.py`) on the follow-ups with their answers and the passages held where a
    later prompt reads them; it cannot fire as the loop stands, since every step that goes on adds a
    follow-up to the text. `follow_up_rule` "labelled": the authors' loop, which goes on only while
    the reply's last line carries "Follow up:" and otherwise asks for the final answer
    (`parse_self_ask_step`); "first-line": an unlabelled first line is read as a follow-up
    (IterDRAG's rule, this method's before revision 2, which searched with answers such as "So the
    answer is Norway." as queries).
    """

    k: int = setting(5, ge=1)
    max_follow_ups: int = setting(5, ge=0)
    passages: Literal["replace", "accumulate"] = "replace"
    step_context: Literal["none", "passages"] = "none"
    step_max_tokens: int = setting(64, ge=1)
    answer_max_tokens: int = setting(32, ge=1)
    stop_at_fixed_point: bool = True
    follow_up_rule: Literal["labelled", "first-line"] = "labelled"

    def __post_init__(self) -> None:
        check_ranges(self)


class SelfAsk:
    """Self-Ask as a policy: ask follow-ups, answer each from its retrieved passages, then answer."""

    name = "self-ask"
    # Bumped when a prompt or rule changes what the method does for the same settings (hashed into run ids).
    revision = 2  # 2: the authors' follow-up rule (follow_up_rule "labelled")

    def __init__(self, settings: SelfAskSettings = SelfAskSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        held: list[Hit] = []  # the passages an intermediate answer (and, with step_context, a step) reads
        if s.step_context == "passages":
            held = yield Search(question.text, s.k)
        chain: list[tuple[str, str]] = []
        states: list[tuple[list[Hit], list[tuple[str, str]]]] = []  # at the start of each step
        for step in range(s.max_follow_ups):
            if s.stop_at_fixed_point:
                # the passages held reach a later prompt when a step reads them or the next answer adds to them
                seen = held if s.step_context == "passages" or s.passages == "accumulate" else []
                state = ("self-ask", tuple(h.passage.id for h in seen), tuple(chain))
                fixed = yield LoopState(state, step, s.max_follow_ups - 1)
                if fixed is not None:  # the full loop would end as step `ends_as` did: in the state after it
                    after = fixed.ends_as + 1
                    held, chain = states[after] if after < len(states) else (held, chain)
                    break
                states.append((list(held), list(chain)))
            out = yield Ask("follow-up", self._step_prompt(question, held, chain, ""),
                            Decoding(max_tokens=s.step_max_tokens, stop=STEP_STOP))
            kind, text, unlabelled = parse_self_ask_step(out.text, first=not chain, rule=s.follow_up_rule)
            yield Note("self-ask-step", kind, (("step", float(step)), ("unlabelled", float(unlabelled))))
            if kind == "final":
                return text
            if kind == "final-prompt":
                break
            hits = yield Search(text, s.k)
            held = hits if s.passages == "replace" else _union(held, hits)
            out = yield Ask("intermediate-answer",
                            evidence_prompt(format_passages(held), INTERMEDIATE_TASK.format(follow_up=text)),
                            Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
            chain.append((text, clean_answer(out.text)))
        out = yield Ask("answer", self._step_prompt(question, held, chain, FINAL_LABEL),
                        Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
        return clean_answer(out.text)

    def _step_prompt(self, question: Question, held: list[Hit], chain: list[tuple[str, str]],
                     suffix: str) -> tuple[Message, ...]:
        """The step prompt: the task with the demonstrations (after the passages held, with
        step_context "passages"), then the self-ask text so far as the assistant turn to continue."""
        task = STEP_TASK.format(question=question.text)
        if self.settings.step_context == "passages":
            head = evidence_prompt(format_passages(held), task)
        else:
            head = (Message("system", STEP_SYSTEM), Message("user", task))
        return head + (Message("assistant", self_ask_text(chain, suffix)),)


def self_ask_text(chain: list[tuple[str, str]], suffix: str = "") -> str:
    """The self-ask text so far: the "needed" line, each follow-up with its intermediate answer, then
    `suffix` (the final-answer label, when the final answer is asked for)."""
    if not chain:
        return f"{NEEDED} No.\n{suffix}" if suffix else NEEDED
    steps = "".join(f"Follow up: {q}\nIntermediate answer: {a}\n" for q, a in chain)
    return f"{NEEDED} Yes.\n{steps}{suffix}"


def _union(held: list[Hit], new: list[Hit]) -> list[Hit]:
    """`held` then the passages of `new` not in it, in retrieval order."""
    out = list(held)
    ids = {h.passage.id for h in out}
    for hit in new:
        if hit.passage.id not in ids:
            ids.add(hit.passage.id)
            out.append(hit)
    return out


# ----------------------------------------------------------------------------------- reading a step
# The question Self-Ask's first reply answers ("Are follow up questions needed here: Yes."): its verdict
# word, with the punctuation after it, at the very start of the reply.
_NEEDED = re.compile(r"^[\s*_]*(?:yes|no)\b[\s.,;:!*_]*", re.IGNORECASE)


def parse_self_ask_step(text: str, first: bool, rule: str = "labelled") -> tuple[str, str, bool]:
    """(kind, text, unlabelled) of one Self-Ask step, after the yes/no that answers "Are follow up
    questions needed here:" when this is the `first` reply (so a bare "No." is no follow-up "No.";
    "No.\nSo the final answer is: X" is ("final", X)).

    rule "labelled", the authors' loop (ofirpress/self-ask, `promptf`: it goes on while "Follow up:"
    is in the reply's last line, and otherwise asks for the final answer unless the reply gave one):
    a follow-up only where the last non-empty line carries the "Follow up:" label; else "So the
    final answer is: X" anywhere -> ("final", X); else ("final-prompt", "") — "So the answer is
    Norway." or "Final answer: Norway" is no follow-up. Rule "first-line": `parse_step`'s rules
    (IterDRAG's), where an unlabelled first line is read as the follow-up."""
    if first:
        text = text[_NEEDED.match(text).end():] if _NEEDED.match(text) else text
    if rule == "first-line":
        return parse_step(text)
    lines = [line for line in text.splitlines() if line.strip()]
    follow = FOLLOW_UP_PATTERN.search(lines[-1]) if lines else None
    if follow:
        query = strip_label(lines[-1][follow.end():])
        if query:
            return "follow-up", query, False
    if FINAL_ANSWER_PATTERN.search(text):
        answer = final_after(text)
        return ("final", answer, False) if answer else ("final-prompt", "", False)
    return "final-prompt", "", not any(FOLLOW_UP_PATTERN.search(line) for line in lines)
