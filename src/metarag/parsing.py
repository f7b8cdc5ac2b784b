"""The rules that read model output which more than one module uses: short answers, cleaners, yes/no
and labelled verdicts, JSON objects, the self-ask / IterDRAG step format, the search agents' tags and
sentences. A reader that one module alone uses (ReAct's actions, EvoCtx's decisions, a listwise
ranking, KiRAG's triples ...) lives in that module, under the same rules.

Below `methods/`, `judges/` and `rerank/` (stdlib only). Each reader follows one explicit rule,
never raises on any text, never runs code from the text, and runs in time linear in its length:
a reader either finds what it reads in its place, or returns its documented "nothing" value, for
the caller's recorded fallback.
"""
from __future__ import annotations

import bisect
import json
import re
from collections.abc import Collection

# ----------------------------------------------------------------------------------- cleaners
# What may surround a short answer: whitespace, quotes, markdown emphasis, a format's placeholder
# brackets; leading colons (after a label), trailing periods.
MARKUP = "\"'`*_“”‘’«»<>"
_TRAILING = MARKUP + "."
# A leading answer label, markup and colons around it, repeated ("A: Answer: Paris", "**Answer:** x",
# "So the final answer is: x"), matched in one pass so an adversarial prefix costs linear time. A label
# may stand behind any punctuation ("- Answer: x", "### Answer -: x") and hold any between its word and its
# colon, as an "Answer:" line reads (`_ANSWER_LINE`): so what a reader returns, read again, stays as it is.
_LEADING = re.compile(
    r"(?:[\s\"'`*_“”‘’«»<>:]"
    r"|(?:[^\w\n]|_)*(?:so[^\S\n]+)?(?:the[^\S\n]+)?(?:(?:final|short|intermediate)[^\S\n]+)?answer"
    r"(?:[^\S\n]+is)?(?:[^\w]|_)*:"
    r"|(?:[^\w\n]|_)*a[^\S\n]*:)*",
    re.IGNORECASE)

# The placeholders the prompts' answer formats show (`<short answer>`, "(a name, a date, a number, a
# short phrase, or yes/no)"): a reply that only echoes one is no answer. Compared as lowercase words.
PLACEHOLDERS = frozenset({
    "a name a date a number a short phrase or yes no",
    "the short answer a name a date a number a short phrase or yes no",
    "short answer", "the short answer", "your short answer", "answer", "the answer", "your answer",
    "final answer", "the final answer", "short answer only",
})
_PLACEHOLDER_HEAD = "a name a date a number"
_WORDS = re.compile(r"[0-9a-z]+")


def is_placeholder(text: str) -> bool:
    """True when `text` (already cleaned) only echoes an answer format's placeholder, e.g. "a name, a
    date, a number, a short phrase, or yes/no" or "short answer"; "yes" or "unsure" are answers."""
    words = " ".join(_WORDS.findall(text.lower()))
    return words in PLACEHOLDERS or _PLACEHOLDER_HEAD in words


def clean_line(text: str) -> str:
    """One line of a short answer without what surrounds it: whitespace, quotes, markdown emphasis,
    placeholder brackets, leading answer labels and colons ("A: Answer:"), trailing periods.
    Idempotent; "" when nothing is left."""
    previous = None
    while text != previous:
        previous = text
        text = text[_LEADING.match(text).end():]
        end = len(text)
        while end and (text[end - 1] in _TRAILING or text[end - 1].isspace()):
            end -= 1
        text = text[:end]
    return text


def clean_answer(text: str) -> str:
    """The short answer in a reply to a prompt that asked for the answer alone: the first line that
    is not empty once cleaned (`clean_line`) and is not an echoed placeholder; "" when there is none.

    '"Paris".' -> 'Paris', '*Paris*.' -> 'Paris', 'A: Answer: Paris' -> 'Paris', 'answer:\\nParis' ->
    'Paris'. Idempotent.
    """
    for line in text.splitlines():
        cleaned = clean_line(line)
        if cleaned and not is_placeholder(cleaned):
            return cleaned
    return ""


# ------------------------------------------------------------------------------- short answers
# "answer:" / "answer is:" (markdown allowed before the colon: "**Answer:**", "**Final Answer**:") is
# an explicit answer label; "answer is" without a colon is an answer phrase ("the answer is Paris"),
# not "answer isn't". Not inside a word ("reanswer:").
_ANSWER_MARKER = re.compile(r"(?<![A-Za-z])answer(?P<is>\s+is(?![\w'’]))?(?P<colon>[\s*_]*:)?", re.IGNORECASE)
# At most this many answer markers are tried, from the last: a reply of thousands of empty markers
# costs linear time, and is read as having no marked answer.
_MAX_MARKERS_TRIED = 64


class _Lines:
    """A text's lines (as `str.splitlines` cuts them) with their start offsets and cleaned forms."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines()
        self.starts: list[int] = []
        offset = 0
        for raw in text.splitlines(keepends=True):
            self.starts.append(offset)
            offset += len(raw)
        self._next: list[int] | None = None
        self._cleaned: list[str] | None = None

    def cleaned(self, i: int) -> str:
        if self._cleaned is None:
            self._cleaned = [clean_line(line) for line in self.lines]
        return self._cleaned[i]

    def next_answer_line(self, i: int) -> int | None:
        """The index of the first line at or after `i` whose cleaned form is an answer, or None."""
        if self._next is None:
            nxt: list[int] = [-1] * (len(self.lines) + 1)
            for j in range(len(self.lines) - 1, -1, -1):
                c = self.cleaned(j)
                nxt[j] = j if c and not is_placeholder(c) else nxt[j + 1]
            self._next = nxt
        j = self._next[i] if i < len(self._next) else -1
        return None if j < 0 else j

    def line_of(self, pos: int) -> int:
        return max(0, bisect.bisect_right(self.starts, pos) - 1)

    def line_end(self, i: int) -> int:
        return self.starts[i] + len(self.lines[i]) if self.lines else 0


def _marker_answer(lines: _Lines, end: int) -> tuple[str, int] | None:
    """(answer, index of the line it is on) for the marker ending at offset `end`: the cleaned rest
    of the marker's line, else the next line that holds an answer; None when neither does."""
    if not lines.lines:
        return None
    i = lines.line_of(end)
    rest = clean_line(lines.text[end:lines.line_end(i)]) if end < lines.line_end(i) else ""
    if rest and not is_placeholder(rest):
        return rest, i
    j = lines.next_answer_line(i + 1)
    return (lines.cleaned(j), j) if j is not None else None


def _last_marked(lines: _Lines, markers: list[re.Match[str]]) -> tuple[str, int, re.Match[str]] | None:
    for marker in reversed(markers[-_MAX_MARKERS_TRIED:]):
        found = _marker_answer(lines, marker.end())
        if found is not None:
            return found[0], found[1], marker
    return None


def marked_answer(text: str) -> str | None:
    """The answer a reply marks, or None when it marks none (e.g. reasoning cut off by the token budget).

    Markers are "answer is" and "answer:" (any case, markdown allowed); a marker's answer is the
    cleaned rest of its line, or the next line holding an answer when the rest is empty. Rules:
    (1) an explicit label ("Answer:", "Final answer:", "So the answer is:") wins over a later
    phrase: of the explicit labels with an answer the last counts, and within its line a later
    marker still takes over ("Answer: the answer is Paris" -> "Paris"), but the next lines do not
    ("Answer: the Police.\\nThis answer is correct." -> "the Police"); (2) without one, the last
    "answer is" phrase with an answer. An echoed format placeholder is no answer.
    """
    markers = [m for m in _ANSWER_MARKER.finditer(text) if m.group("is") or m.group("colon")]
    if not markers:
        return None
    lines = _Lines(text)
    explicit = _last_marked(lines, [m for m in markers if m.group("colon")])
    if explicit is not None:
        answer, line, label = explicit
        end = lines.line_end(line)
        later = [m for m in markers if label.start() < m.start() and m.end() <= end]
        for marker in reversed(later[-_MAX_MARKERS_TRIED:]):  # the last later marker with its answer on this line
            found = _marker_answer(lines, marker.end())
            if found is not None and found[1] <= line:
                return found[0]
        return answer
    found = _last_marked(lines, markers)
    return found[0] if found is not None else None


def extract_short_answer(text: str) -> str:
    """The short final answer in a model's free text, by one fixed rule (CoT, MetaRAG, SIM-RAG).

    The answer `marked_answer` finds; without one, the first line of the text that is an answer once
    cleaned (`clean_line`: quotes, emphasis, labels, closing period). So "So the answer is: Paris."
    gives "Paris", "Answer:\\nParis" gives "Paris", reasoning ending "Final answer: 1990" gives
    "1990"; "Answer:" alone, or an echo of the format's placeholder, gives "" (no answer).
    """
    answer = marked_answer(text)
    return answer if answer is not None else clean_answer(text)


# ------------------------------------------------------------------ SIM-RAG's Answer / Rationale
_ANSWER_LINE = re.compile(r"^(?:[^\w\n]|_)*answer(?:[^\w\n]|_)*:(.*)$", re.IGNORECASE | re.MULTILINE)
_RATIONALE_LINE = re.compile(r"^(?:[^\w\n]|_)*rationale(?:[^\w\n]|_)*:", re.IGNORECASE | re.MULTILINE)


def parse_answer_rationale(text: str) -> tuple[str, str]:
    """(short answer, rationale) from a reply in SIM-RAG's `Answer:` / `Rationale:` format.

    The answer is the rest of the first line that starts with "Answer:" (markdown ignored), read by
    `extract_short_answer` (so "<unsure>" -> "unsure"), or the next line when that rest is empty; the
    rationale is everything after the first "Rationale:" label up to the next "Answer:" line.
    Without an "Answer:" line the answer is `extract_short_answer` of the whole reply and the
    rationale the whole reply. An echoed placeholder gives the answer "" (the caller records it).
    """
    answer_match = _ANSWER_LINE.search(text)
    rationale_match = _RATIONALE_LINE.search(text)
    rationale = ""
    if rationale_match:
        rest = text[rationale_match.end():]
        next_answer = _ANSWER_LINE.search(rest)
        rationale = (rest[:next_answer.start()] if next_answer else rest).strip().lstrip("*_").strip()
    if answer_match is None:
        return extract_short_answer(text), rationale or text.strip()
    answer = extract_short_answer(answer_match.group(1))
    if not answer and not is_placeholder(clean_line(answer_match.group(1))):
        following = text[answer_match.end():]  # "Answer:" alone on its line, the answer on the next one
        cut = _RATIONALE_LINE.search(following)
        answer = extract_short_answer(following[:cut.start()] if cut else following)
    if not rationale:
        rationale = (text[:answer_match.start()] + text[answer_match.end():]).strip()
    return answer, rationale


# ------------------------------------------------------------------------------------ verdicts
_FIRST_WORD = re.compile(r"[A-Za-z]+")
_LABELLED = re.compile(r"^[^\w\n]*(?:final\s+)?(?:answer|verdict|decision|judgement|judgment)\s*[:\-]\s*(\w+)",
                       re.IGNORECASE | re.MULTILINE)
_YES = {"yes", "true", "correct", "entailed", "sufficient"}
_NO = {"no", "false", "incorrect", "insufficient"}


def parse_yes_no(text: str) -> bool | None:
    """True / False when the text gives a yes/no verdict, None when it does not.

    Rules, in order: (1) the first word of the text (markdown and punctuation ignored) is a verdict
    word ("Yes", "No.", "**No**"); (2) a labelled line "Answer: yes" / "Verdict: No". Anything else —
    "I cannot say no", "Not sure", an empty reply — is None, for the caller's recorded default.
    """
    first = _FIRST_WORD.search(text)
    verdict = _verdict_word(first.group(0)) if first else None
    if verdict is None:
        match = _LABELLED.search(text)
        verdict = _verdict_word(match.group(1)) if match else None
    return verdict


def _verdict_word(word: str) -> bool | None:
    word = word.lower()
    return True if word in _YES else False if word in _NO else None


def labelled_fields(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """`Name: value` lines for the given field names (case-insensitive, markdown bold ignored)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        clean = line.strip().replace("**", "").lstrip("-*# ").strip()
        key, sep, value = clean.partition(":")
        key = key.strip().lower()
        if sep and key in names and key not in found:
            found[key] = value.strip()
    return found


# ----------------------------------------------------------------------------------------- JSON
def first_json_object(text: str) -> dict | None:
    """The first balanced {...} in the text that parses as a JSON object (code fences and prose
    around it ignored), or None. Linear time: braces are matched in one pass (strings respected),
    each outermost span is parsed once, and nested spans are tried only within a budget of
    characters proportional to the text; nesting too deep for the JSON parser is not an object."""
    budget = 2 * len(text) + 1024
    start = text.find("{")
    while start != -1 and budget > 0:
        spans, end, scanned = _brace_spans(text, start)
        budget -= scanned
        for s, e in spans:  # outer spans first, then nested ones, by start
            if budget <= 0:
                return None
            budget -= e - s
            value = _json_object(text[s:e + 1])
            if value is not None:
                return value
        # after a closed outermost span, go on after it; after an unterminated one (an open
        # string swallowed the rest), start again at the next brace
        start = text.find("{", end + 1 if end is not None else start + 1)
    return None


def _brace_spans(text: str, start: int) -> tuple[list[tuple[int, int]], int | None, int]:
    """Closed {...} spans met scanning from the brace at `start` until its match (sorted by start),
    the offset of that match (None when the text ends first), and the characters scanned."""
    stack: list[int] = []
    spans: list[tuple[int, int]] = []
    in_string = escaped = False
    for pos in range(start, len(text)):
        ch = text[pos]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            stack.append(pos)
        elif ch == "}":
            spans.append((stack.pop(), pos))
            if not stack:
                spans.sort()
                return spans, pos, pos - start + 1
    spans.sort()
    return spans, None, len(text) - start


def _json_object(candidate: str) -> dict | None:
    try:
        value = json.loads(candidate)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# -------------------------------------------------------------------- self-ask / IterDRAG steps
FINAL_ANSWER_PATTERN = re.compile(r"so\s+the\s+final\s+answer\s+is\s*:?", re.IGNORECASE)
# "Follow up:" anywhere, not inside a word; "Are follow up questions needed here:" is no label.
FOLLOW_UP_PATTERN = re.compile(r"(?<![A-Za-z])follow[-\s]?up(?:\s+question)?[*_\s]*:[*_\s]*", re.IGNORECASE)
STEP_KINDS = ("follow-up", "final", "final-prompt")

# Leading quotes, markdown, list numbers and labels ("Query:", "Sub-question 2:"), repeated, in one pass;
# possessive so that a label followed by a long run of spaces costs linear time.
_LEADING_LABELS = re.compile(
    r"(?:[*`\"'\s]|\d++[.)]\s++"
    r"|(?:next\s++)?(?:sub[-\s]?questions?|sub[-\s]?query|search\s++query|query|follow[-\s]?up)\s*+(?:\d++\s*+)?:\s*+)*",
    re.IGNORECASE)


def strip_label(text: str) -> str:
    """A query or sub-question as written, first line only, without leading labels ("Query:",
    "Sub-question 2:"), list numbers, quotes or markdown. Idempotent."""
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    previous = None
    while line != previous:
        previous = line
        line = line[_LEADING_LABELS.match(line).end():].rstrip("*`\"' ").strip()
    return line


def final_after(text: str) -> str:
    """The answer after the reply's first "So the final answer is:" label, cleaned; "" without one."""
    final = FINAL_ANSWER_PATTERN.search(text)
    return clean_answer(text[final.end():]) if final else ""


def parse_step(text: str) -> tuple[str, str, bool]:
    """(kind, text, unlabelled) of one self-ask / IterDRAG step reply, by fixed rules; kind is one of
    STEP_KINDS.

    Of the labels "Follow up:" and "So the final answer is:" (any case, anywhere), the first one
    written counts: models often write a follow-up and then guess the final answer in the same
    reply, and self-ask stops at the follow-up to retrieve for it.
    1. "Follow up: Q" first -> ("follow-up", Q), Q being the rest of its line (cut at a final-answer
       label on the same line);
    2. "So the final answer is: X" first, X not empty -> ("final", X cleaned);
    3. no label: the first non-empty line, label-stripped, is the follow-up -> ("follow-up", line, True);
    4. nothing readable, or a final-answer label with nothing after it -> ("final-prompt", ""): the
       caller asks for the final answer with the final prompt.
    """
    final = FINAL_ANSWER_PATTERN.search(text)
    follow = FOLLOW_UP_PATTERN.search(text)
    if follow and (final is None or follow.start() < final.start()):
        line = text[follow.end():].split("\n", 1)[0]
        cut = FINAL_ANSWER_PATTERN.search(line)
        query = strip_label(line[:cut.start()] if cut else line)
        if query:
            return "follow-up", query, False
    if final:
        answer = final_after(text)
        return ("final", answer, False) if answer else ("final-prompt", "", False)
    line = strip_label(text)
    if line:
        return "follow-up", line, True
    return "final-prompt", "", True


# --------------------------------------------------------------- Search-R1 tags (search agents)
_AGENT_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_AGENT_OPEN = re.compile(r"<(search|answer)>", re.IGNORECASE)
AGENT_ACTIONS = ("search", "answer", "invalid")


def read_agent_action(text: str) -> tuple[str, str, str]:
    """(action, content, why invalid) of one search-agent step, `text` being the reply with the
    closing tag its stop string cut restored (Search-R1's format: `<search> q </search>` or
    `<answer> a </answer>`, reasoning in `<think>` around them).

    The first complete `<search>…</search>` or `<answer>…</answer>` pair is the action (tags in any
    case), its content stripped. Invalid, with the reason: no complete pair ("no tag"); opening tags
    of both kinds ("both tags": the reply cannot be one action); an empty pair ("empty query",
    "empty answer"). Invalid actions come back as ("invalid", "", reason); valid ones with reason "".
    """
    found = _AGENT_TAG.search(text)
    if found is None:
        return "invalid", "", "no tag"
    if len({m.group(1).lower() for m in _AGENT_OPEN.finditer(text)}) > 1:
        return "invalid", "", "both tags"
    action, content = found.group(1).lower(), found.group(2).strip()
    if not content:
        return "invalid", "", f"empty {'query' if action == 'search' else 'answer'}"
    return action, content, ""


def agent_closing_tag(text: str) -> str | None:
    """The closing tag a reply cut at a stop string was cut before, when a back-end did not say
    which stop string fired: that of the last opening `<search>` / `<answer>` tag, None without one."""
    opened = list(_AGENT_OPEN.finditer(text))
    return f"</{opened[-1].group(1).lower()}>" if opened else None


# ---------------------------------------------------------------------------------- sentences
# DRAGIN's code splits with spaCy's parser, which the toolkit does not ship; this rule agrees with it
# on the short declarative sentences of CoT answers.
# Words a period follows without ending a sentence (lowercase, no period): titles, "St.", months ...
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "ft", "jr", "sr", "gen", "col", "lt", "sgt", "capt", "gov",
    "sen", "rep", "rev", "inc", "ltd", "co", "corp", "vs", "approx", "ca", "jan", "feb", "apr", "jun", "jul",
    "aug", "sep", "sept", "oct", "nov", "dec", "e.g", "i.e", "a.m", "p.m", "u.s", "u.k",
})
_INITIALS = re.compile(r"(?:[a-z]\.)*[a-z]")  # "J", "U.S", "J.R.R" before the final period
_STOP = r"[.!?]+[\"'”’)\]]*"  # a sentence's closing punctuation, closing quotes or brackets after it kept
_SENTENCE_BREAKS = {  # open_end -> where a sentence may end
    False: re.compile(_STOP + r"(?=\s|$)|\n"),
    True: re.compile(_STOP + r"(?=\s)|\n"),
}
_NON_SPACE = re.compile(r"\S")
_LOOKBACK = 32  # characters read back for the word before a period: abbreviations and list numbers are short


def sentence_spans(text: str, *, abbreviations: Collection[str] = _ABBREVIATIONS, min_chars: int = 0,
                   open_end: bool = False) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, in order, the whitespace around it excluded; empty
    sentences are skipped. The one sentence splitter of model output (IRCoT's and DRAGIN's replies,
    FLARE's look-ahead). Linear time.

    A sentence ends at ".", "!" or "?" (closing quotes or brackets after it kept) before whitespace or
    the text's end, and at a line break. A period does not end one after a word of `abbreviations`
    ("St.", "Dr.", "Jan."), an initial ("J.", "U.S.") or a list number opening the sentence ("1.").
    A sentence shorter than `min_chars` characters runs on into the next. `open_end`: the text may go
    on (a streamed look-ahead), so its end closes no sentence and the text after the last end is none.
    """
    spans: list[tuple[int, int]] = []
    start, first = 0, None  # the sentence's start and its first non-space character (found when needed)
    scanned, last = 0, -1  # the text read so far, and its last non-space character
    for match in _SENTENCE_BREAKS[open_end].finditer(text):
        if min_chars:  # the sentence's length without the whitespace around it, each character read once
            gap = text[scanned:match.start()].rstrip()
            last = match.end() - 1 if text[match.start()] != "\n" else scanned + len(gap) - 1 if gap else last
            scanned = match.end()
            if first is None:
                found = _NON_SPACE.search(text, start)
                first = found.start() if found else len(text)
            if last - first + 1 < min_chars:
                continue
        if text[match.start()] == ".":
            # the run of non-space characters just before the period (a regex `\S*$` over the window
            # retries at every position of it: quadratic in the window, 10 s on 120 KB of "Dr. ")
            window = text[max(start, match.start() - _LOOKBACK):match.start()]
            word = window.split()[-1] if window and not window[-1].isspace() else ""
            word_start = match.start() - len(word)
            word = word.lstrip("\"'“‘(").lower()
            if word.isdigit() and first is None:
                found = _NON_SPACE.search(text, start)
                first = found.start() if found else len(text)
            if word in abbreviations or _INITIALS.fullmatch(word) or (word.isdigit() and word_start == first):
                continue
        _add_span(text, start, match.end(), spans)
        start, first = match.end(), None
    if not open_end:
        _add_span(text, start, len(text), spans)
    return spans


def _add_span(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    piece = text[start:end]
    if piece.strip():
        lead = len(piece) - len(piece.lstrip())
        spans.append((start + lead, start + len(piece.rstrip())))
