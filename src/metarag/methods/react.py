"""ReAct (Yao et al., 2023, "ReAct: Synergizing reasoning and acting in language models", §3;
the HotpotQA setup of their code, ysymyth/ReAct hotpotqa.ipynb): Thought / Action /
Observation steps over our retriever, as a policy over the shared runner loop.

One question:

1. The model continues one growing transcript: the instruction, two exemplars and the question in
   the user turn, the steps so far in the assistant turn, which each request continues from
   "Thought n:" (a final assistant message is continued, `actions.Ask`), so every request's prompt
   is the previous one's plus one step: a back-end's prefix cache reuses it. Generation stops at
   "\\nObservation n:" as the paper's code does (and at an unnumbered "\\nObservation:"), so a
   thought that mentions the word "observation" is not cut.
2. The reply's action (`split_thought_action`, `parse_react_action`: tolerant of
   case, spaces, quotes, a missing bracket, "Action n:" labels; of several actions the first) is
   carried out and its observation appended:
   - `Search[query]`: the top-k passages of *our retriever* for the query, one line "[1] Title: text
     [2] ...". This is not ReAct's Wikipedia API (which returns the first sentences of the page with
     that exact title, or similar titles); the corpus is the benchmark's passages.
   - `Lookup[term]`: the next sentence containing term (any case) among the passages retrieved so
     far, "(Result i / n) sentence", or "No more results." — ReAct's lookup, whose list is the
     current page's sentences, ours the sentences of every passage retrieved so far in retrieval
     order (a passage once); as in ReAct, the same term again gives the next sentence, a new term
     or a new Search starts again from the first.
   - `Finish[answer]` ends the question with that answer.
   A reply without any action is re-asked once for the action alone (the thought kept, "Action n:"
   continued up to the line's end), as ReAct's code does; an action that still cannot be read is
   observed as "Invalid action: ..." (ReAct's environment) and uses up its step.
3. At most `max_steps` steps (7: the paper's HotpotQA budget, `range(1, 8)` in the code). At the
   limit ReAct's code calls `finish[]`, so the answer is empty (the question scores 0); that is the
   default, `at_step_limit="empty"`. `at_step_limit="finish"` asks the model once more, continuing
   "Action n: Finish[", for a best guess (the paper's ReAct → CoT-SC fallback is not implemented).
   The same holds when the transcript would outgrow the context (`max_prompt_tokens`).

Every step records a `react-step` Decide step: "search", "lookup", "finish", "malformed" (the
fallback: the action could not be read, even after the re-ask) or, after the last step,
"step-limit" / "context-limit", with the step number and whether the action was re-asked.
Departures, on purpose: two exemplars written from MuSiQue train questions (ReAct's six HotpotQA
exemplars do not fit a 1.5B model's 4,096-token context beside seven observations), observations of
k passages, not one page, and the transcript's action line is the parsed action re-written
("Search[x]"), so later steps see a well-formed history.
"""
from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from metarag.llm.base import Decoding
from metarag.methods.evoctx import approx_tokens
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import clean_line
from metarag.policy.actions import Ask, Note, Search
from metarag.records import Hit, Message, Passage, Question
from metarag.settings import check_ranges, setting

REACT_SYSTEM = "You are a careful assistant for multi-hop question answering."
INSTRUCTION = (
    "Answer the question in steps. Each step is a Thought line, reasoning about what is known and what is "
    "still missing, then an Action line, then an Observation line with the action's result. An action is "
    "one of three:\n"
    "(1) Search[query]: searches a collection of encyclopedia passages and returns the top passages for the "
    "query.\n"
    "(2) Lookup[keyword]: returns the next sentence containing keyword in the passages found so far.\n"
    "(3) Finish[answer]: gives the answer and ends the task. The answer is short: a name, a date, a number, "
    "a short phrase, or yes/no.\n"
    "Two examples follow.\n")
# Written from MuSiQue train questions 2hop__468258_495107 and 2hop__141468_119861
# (../shared/data/musique/train100_official.json), their passages abridged; never an evaluated question.
EXEMPLARS = (
    "Question: What country was the author of Brand a citizen of?\n"
    "Thought 1: I need to find who wrote Brand, then that person's country.\n"
    "Action 1: Search[Brand play author]\n"
    "Observation 1: [1] Brand (play): Brand is a play by the Norwegian playwright Henrik Ibsen. It is a verse "
    "tragedy, written in 1865.\n"
    "Thought 2: Brand was written by Henrik Ibsen, a Norwegian playwright. So he was a citizen of Norway.\n"
    "Action 2: Finish[Norway]\n"
    "\n"
    "Question: What year did the company Novair International Airways is part of dissolve?\n"
    "Thought 1: I need the company Novair International Airways belongs to, then the year it dissolved.\n"
    "Action 1: Search[Novair International Airways]\n"
    "Observation 1: [1] Novair International Airways: Novair International Airways was formed on 7 December "
    "1988 following the sole acquisition of Cal Air International by the Rank Organisation.\n"
    "Thought 2: Novair is part of the Rank Organisation. I need to find when the Rank Organisation dissolved.\n"
    "Action 2: Search[Rank Organisation]\n"
    "Observation 2: [1] The Rank Organisation: The Rank Organisation was a British entertainment conglomerate. In "
    "1995, the Rank Group acquired all the outstanding shares of the Rank Organisation.\n"
    "Thought 3: The passage may say more about its end. I look up 1995.\n"
    "Action 3: Lookup[1995]\n"
    "Observation 3: (Result 1 / 1) In 1995, the Rank Group acquired all the outstanding shares of the Rank "
    "Organisation.\n"
    "Thought 4: The Rank Organisation ended in 1995, when the Rank Group took it over.\n"
    "Action 4: Finish[1995]\n"
    "\n")
QUESTION_LINE = "Question: {question}"
INVALID = "Invalid action: {action}"  # ReAct's environment's observation for an action it cannot read
NO_MORE = "No more results."
NO_PASSAGES = "No passages found."

AtStepLimit = Literal["empty", "finish"]
AT_STEP_LIMIT = get_args(AtStepLimit)
STOP = ("\nObservation {i}:", "\nObservation:", "\nQuestion:")  # step i's stops (the paper's first)


@dataclass(frozen=True)
class ReActSettings:
    """ReAct settings (Yao et al., 2023, HotpotQA).

    max_steps = 7 (the paper's HotpotQA budget, §3; its code's `for i in range(1, 8)`). k = 3
    passages per Search: the paper's observation is one page's first five sentences (~100 tokens);
    three HotpotQA paragraphs are ~300, so seven observations stay inside a 4,096-token context.
    step_max_tokens = 100 (the code's max_tokens). `at_step_limit`: "empty" (the code's `finish[]`:
    no answer) or "finish" (one more request continuing "Finish[", for a best
    guess; finish_max_tokens bounds it). `max_prompt_tokens`: the run halts ("context-limit") when
    the next prompt would pass it, estimated from the last request's measured prompt and output
    tokens plus the new observation (whitespace words × 3/2), 0 for no check; 3,896 as Reflexion's
    ReAct agent halts (agents.py `is_halted`), 200 tokens under a 4,096 context for one step's reply.
    `stop_at_fixed_point`: the shared rule (`methods/fixed_point.py`) on the transcript and the
    lookup cursor; it cannot fire as the loop stands, since every step appends to the transcript.
    """

    k: int = setting(3, ge=1)
    max_steps: int = setting(7, ge=1)
    step_max_tokens: int = setting(100, ge=1)
    at_step_limit: AtStepLimit = "empty"
    finish_max_tokens: int = setting(32, ge=1)
    max_prompt_tokens: int = setting(3896, ge=0)
    stop_at_fixed_point: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Trial:
    """What one ReAct run of a question came to: its answer ("" without one), the transcript
    ("Thought 1: ...\\nAction 1: ...\\nObservation 1: ...\\n..."), whether Finish ended it (False: it
    halted at the step limit or the context budget) and the steps it took."""

    answer: str
    transcript: str
    finished: bool
    steps: int


@dataclass
class _Lookup:
    """ReAct's lookup cursor over the sentences of the passages retrieved so far."""

    passages: list[Passage] = field(default_factory=list)
    keyword: str | None = None
    matches: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, hits: list[Hit]) -> None:
        ids = {p.id for p in self.passages}
        for hit in hits:
            if hit.passage.id not in ids:
                self.passages.append(hit.passage)
                ids.add(hit.passage.id)
        self.keyword = None  # as ReAct: a new Search resets the lookup

    def next(self, keyword: str) -> str:
        if keyword != self.keyword:
            self.keyword, self.count = keyword, 0
            self.matches = [s for p in self.passages for s in sentences(p.text) if keyword.lower() in s.lower()]
        if self.count >= len(self.matches):
            return NO_MORE
        self.count += 1
        return f"(Result {self.count} / {len(self.matches)}) {self.matches[self.count - 1]}"


def sentences(text: str) -> list[str]:
    """A passage's sentences by ReAct's rule (split at ". "), each ending with its period."""
    parts = [s.strip() for s in " ".join(text.split()).split(". ")]
    return [s if s.endswith((".", "!", "?")) else s + "." for s in parts if s]


def format_observation(hits: list[Hit]) -> str:
    """A Search observation on one line: "[1] Title: text [2] Title: text ..."."""
    if not hits:
        return NO_PASSAGES
    return " ".join(f"[{i}] {h.passage.title}: {' '.join(h.passage.text.split())}" for i, h in enumerate(hits, 1))


def step_prompt(question: str, transcript: str, memory: str = "") -> tuple[Message, ...]:
    """The conversation one step continues: instruction, exemplars, `memory` (Reflexion's reflections,
    "" for none) and the question, then the transcript as the assistant's unfinished turn."""
    user = INSTRUCTION + EXEMPLARS + memory + QUESTION_LINE.format(question=question)
    return (Message("system", REACT_SYSTEM), Message("user", user), Message("assistant", transcript))


def react_trial(question: Question, s: ReActSettings, memory: str = "") -> Generator[Any, Any, Trial]:
    """One ReAct run of `question` as a sub-policy (ReAct's policy, and each Reflexion trial):
    yields its actions and returns its `Trial`. `memory` goes into the prompt before the question."""
    transcript = ""
    lookup = _Lookup()
    starts: list[str] = []  # the transcript each step started from, for the fixed-point rule
    halted = "step-limit"
    for i in range(1, s.max_steps + 1):
        if s.stop_at_fixed_point:
            state = ("react", memory, transcript, lookup.keyword, lookup.count)
            fixed = yield LoopState(state, i - 1, s.max_steps - 1)
            if fixed is not None:  # the full loop cycles without a Finish: it ends at the step limit
                later = fixed.ends_as + 1
                transcript = starts[later] if later < len(starts) else transcript
                break
            starts.append(transcript)
        head = f"Thought {i}:"
        out = yield Ask("react-step", step_prompt(question.text, transcript + head, memory),
                        Decoding(max_tokens=s.step_max_tokens, stop=tuple(x.format(i=i) for x in STOP)))
        thought, action_text = split_thought_action(out.text)
        used = out.usage.prompt_tokens + out.usage.completion_tokens
        reasked = action_text is None
        if reasked:  # ReAct's code: keep the thought's first line, ask for the action alone
            prefix = f"{transcript}{head} {thought}\nAction {i}:"
            out = yield Ask("react-action", step_prompt(question.text, prefix, memory),
                            Decoding(max_tokens=s.step_max_tokens, stop=("\n",)))
            action_text = out.text.strip()
            used = out.usage.prompt_tokens + out.usage.completion_tokens
        parsed = parse_react_action(action_text)
        kind = parsed[0] if parsed else "malformed"
        yield Note("react-step", kind, (("step", float(i)), ("reasked", float(reasked))))
        if parsed is None:
            action, observation = action_text, INVALID.format(action=action_text)
        else:
            action = f"{kind.capitalize()}[{parsed[1]}]"
            if kind == "finish":
                transcript += f"{head} {thought}\nAction {i}: {action}\n"
                return Trial(clean_line(parsed[1]), transcript, True, i)
            if kind == "search":
                hits = yield Search(parsed[1], s.k)
                lookup.add(list(hits))
                observation = format_observation(list(hits))
            else:
                observation = lookup.next(parsed[1])
        transcript += f"{head} {thought}\nAction {i}: {action}\nObservation {i}: {observation}\n"
        # the next prompt: this request's, its reply (re-written as the transcript's step), the observation
        added = approx_tokens(f"{action}\nObservation {i}: {observation}\nThought {i + 1}:")
        if s.max_prompt_tokens and i < s.max_steps and used + added > s.max_prompt_tokens:
            halted = "context-limit"
            break
    steps = transcript.count("\nObservation ")
    yield Note("react-step", halted, (("step", float(steps)),))
    if s.at_step_limit == "finish":
        out = yield Ask("react-finish", step_prompt(question.text, f"{transcript}Action {steps + 1}: Finish[", memory),
                        Decoding(max_tokens=s.finish_max_tokens, stop=("]", "\n")))
        return Trial(clean_line(out.text), transcript, False, steps)
    return Trial("", transcript, False, steps)


class ReAct:
    """ReAct as a policy: Thought / Action / Observation over the retriever, Finish gives the answer."""

    name = "react"
    revision = 2  # 2: stops at "\nObservation n:", not at the word anywhere

    def __init__(self, settings: ReActSettings = ReActSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        trial = yield from react_trial(question, self.settings)
        return trial.answer


# ----------------------------------------------------------------------------- ReAct's actions
# "Action:" / "Action 3:" labels (any case, markdown around them), not inside a word ("Reaction:").
_REACT_ACTION_LABEL = re.compile(r"(?<![A-Za-z])action[^\S\n]*+(?:\d++)?[*_\s]*:", re.IGNORECASE)
# A leading "Thought 2:" label the model repeated, markdown and spaces around it.
_REACT_THOUGHT_LABEL = re.compile(r"^[*_\s]*(?:thought[^\S\n]*+(?:\d++)?[*_\s]*:[*_\s]*)?", re.IGNORECASE)
# An action written without its label ("... so I search. Search[Paris]"): the name, then its bracket.
_REACT_BARE = re.compile(r"(?<![A-Za-z])(?:search|lookup|finish)[^\S\n]*+[\[(]", re.IGNORECASE)
# One action: its name (any case), an opening bracket "[" or "(" (or a colon), the argument up to the
# first closing bracket, or to the end of the line when the bracket is missing.
_REACT_CALL = re.compile(r"(search|lookup|finish)[^\S\n]*+(?:\[([^\]\n]*+)\]?|\(([^)\n]*+)\)?|:([^\n]*+))",
                         re.IGNORECASE)
_REACT_LEAD = "*_`\"' \t>-"
REACT_ACTIONS = ("search", "lookup", "finish")


def split_thought_action(text: str) -> tuple[str, str | None]:
    """(thought, action text) of one ReAct step reply, the reply continuing a "Thought n:" line.

    The thought is the text before the first "Action:" / "Action n:" label (any case), a repeated
    leading "Thought n:" label removed, its lines joined by spaces; the action text is the rest of
    that label's line, or, when the rest is empty, the next non-empty line. Without any label, the
    first action written bare ("Search[", "lookup(", any case) starts the action text (to its line's
    end). Without either, the action text is None: the reply holds no action (the caller re-asks
    for it, as ReAct's code does).
    """
    label = _REACT_ACTION_LABEL.search(text)
    if label is not None:
        head, rest = text[:label.start()], text[label.end():]
        lines = rest.split("\n")
        action = lines[0].strip() or next((ln.strip() for ln in lines[1:] if ln.strip()), "")
    else:
        bare = _REACT_BARE.search(text)
        if bare is None:
            return _thought(text), None
        head, action = text[:bare.start()], text[bare.start():].split("\n", 1)[0].strip()
    return _thought(head), action


def _thought(text: str) -> str:
    text = text[_REACT_THOUGHT_LABEL.match(text).end():]
    return " ".join(text.split()).rstrip("*_ ").strip()


def parse_react_action(text: str) -> tuple[str, str] | None:
    """(kind, argument) of a ReAct action, kind one of REACT_ACTIONS; None when the text is no action.

    Tolerant by fixed rules: the first action of the text counts (several actions in one reply: the
    first); a leading "Action n:" label, markdown and quotes are skipped; the name in any case;
    "[arg]", "(arg)" or "name: arg"; a missing closing bracket takes the rest of the line; spaces
    and quotes around the argument are removed. Search and Lookup need a non-empty argument (else
    None); an empty Finish[] is a finish with the answer "" (as ReAct's environment takes "finish[]").
    """
    label = _REACT_ACTION_LABEL.match(text.lstrip(_REACT_LEAD))
    if label is not None:
        text = text.lstrip(_REACT_LEAD)[label.end():]
    call = _REACT_CALL.search(text)
    if call is None or text[:call.start()].strip(_REACT_LEAD + "\n"):
        return None  # no action, or prose before it: "I would Search[x]" is not an action line
    kind = call.group(1).lower()
    raw = next(g for g in (call.group(2), call.group(3), call.group(4)) if g is not None)
    argument = raw.strip().strip("\"'`“”‘’*").strip()
    if not argument and kind != "finish":
        return None
    return kind, argument
