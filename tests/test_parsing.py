"""The readers of model output (metarag.parsing): the cases seen with real models, properties over
arbitrary text (never raises, cleaners idempotent, verdicts from their fixed set), linear time, and
the module's place below methods/ and judges/."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from timing import GIVE_UP_S, superlinear

from metarag import parsing
from metarag.judges.llm_judges import REASONING_ERRORS, parse_reasoning_check
from metarag.methods.evoctx import ACTIONS, parse_decision
from metarag.methods.sim_rag import parse_query
from metarag.parsing import (
    STEP_KINDS,
    clean_answer,
    clean_line,
    extract_short_answer,
    first_json_object,
    is_placeholder,
    labelled_fields,
    marked_answer,
    parse_answer_rationale,
    parse_step,
    parse_yes_no,
    strip_label,
)
from metarag.rerank.listwise import NO_IDS, parse_permutation

SRC = Path(parsing.__file__).parent


# ------------------------------------------------------------------------------ known cases
@pytest.mark.parametrize("text, answer", [
    ('"Paris".', "Paris"),
    ("*Paris*.", "Paris"),
    ("A: Answer: Paris", "Paris"),
    ("answer:\nParis", "Paris"),
    ("**Answer:** Paris", "Paris"),
    ("Answer:", ""),
    ("<unsure>", "unsure"),
    ('**"Paris".**', "Paris"),
    ("Paris.\nIt is the capital.", "Paris"),
    ("a name, a date, a number, a short phrase, or yes/no", ""),
    ("<short answer>\nParis", "Paris"),
    ("yes", "yes"),
    ("U.S.", "U.S"),
])
def test_clean_answer(text, answer):
    assert clean_answer(text) == answer


@pytest.mark.parametrize("text, answer", [
    ("Answer:", ""),
    ("answer:\nParis", "Paris"),
    ("A: Answer: Paris", "Paris"),
    # (a) an explicit answer line wins over a later "answer is" phrase (a MetaRAG reasoner reply)
    ("The Police's drummer was Stewart Copeland.\nAnswer: The band is the Police, with Stewart Copeland as the "
     "drummer.\nThis answer is correct and does not contain any errors.",
     "The band is the Police, with Stewart Copeland as the drummer"),
    ("Answer: the answer is Paris", "Paris"),  # a marker later on the answer line itself still counts
    ("At first I thought the answer is London. On reflection, the answer is Paris.", "Paris"),
    ("Answer: Lyon\nFinal answer: Paris", "Paris"),
    # (c) an echo of the format's placeholder is no answer
    ("Answer: a name, a date, a number, a short phrase, or yes/no", ""),
    ("Answer: <short answer>", ""),
    ("The answer is unsure.", "unsure"),
])
def test_extract_short_answer_cases(text, answer):
    assert extract_short_answer(text) == answer


def test_marked_answer_reads_the_metarag_reasoner_reply_of_the_issue():
    reply = ("The Police were formed in London in 1977.\nAnswer: The band is the Police, with Stewart Copeland as "
             "the drummer.\nThis answer is correct and does not contain any errors.")
    assert marked_answer(reply) == "The band is the Police, with Stewart Copeland as the drummer"


def test_marked_answer_is_none_without_a_marked_answer():
    assert marked_answer("Eiffel was born in") is None
    assert marked_answer("Answer: <the short answer: a name, a date, a number, a short phrase, or yes/no>") is None
    assert marked_answer("so Answer:\n\n") is None


@pytest.mark.parametrize("text, answer", [
    ("Answer: <the short answer: a name, a date, a number, a short phrase, or yes/no>\nRationale: <a brief "
     "multi-hop explanation, one or two sentences>", ""),
    ("Answer: a name, a date, a number, a short phrase, or yes/no\nRationale: Eiffel was born in Dijon.", ""),
    ("Answer: <unsure>\nRationale: <none>", "unsure"),
    ("Answer: Dijon\nRationale: This answer is correct and has no errors.", "Dijon"),
])
def test_sim_rag_answer_placeholder_is_no_answer(text, answer):
    assert parse_answer_rationale(text)[0] == answer


@pytest.mark.parametrize("text, error, feedback", [
    ("Error: <none>\nFeedback: <none>", "none", ""),  # (b) the format's placeholder brackets
    ("Error: <flawed logic>\nFeedback: Check the date.", "flawed logic", "Check the date."),
    ("Error: [misaligned]", "misaligned", ""),
    ("Error: <none | flawed logic | misaligned | redundant>\nFeedback: <one sentence>", None, "one sentence"),
    ("Error: none\nFeedback: none", "none", ""),
])
def test_reasoning_check_reads_placeholder_brackets(text, error, feedback):
    assert parse_reasoning_check(text) == (error, feedback)


def test_first_json_object_cases():
    assert first_json_object('{broken} then {"a": {"b": "}"}} tail') == {"a": {"b": "}"}}
    assert first_json_object('{"x": {"a": 1}') == {"a": 1}  # unterminated outer object: the inner one
    assert first_json_object('{"a: 1} {"b": 2}') == {"b": 2}  # an open string swallowed the first brace
    assert first_json_object("[1, 2] {") is None
    assert first_json_object("{" * 50_000 + "}" * 50_000) is None  # too deep for json: not an object


# ------------------------------------------------------------------------------- properties
# Text made of the pieces model replies are made of, so the properties reach the interesting rules.
PIECES = ["Answer:", "answer is", "Final answer:", "**", "*", '"', "'", "`", "<", ">", ".", ":", " ", "\n", "\r\n",
          "A:", "So the final answer is:", "Follow up:", "Action:", "RETRIEVE", "think", "Reasoning:", "Error:",
          "none", "Rationale:", "Yes", "No", "{", "}", '{"a": 1}', "[2]", "3 > 1", "Paris", "a name, a date",
          "short answer", "\u2028", "\x85", "é", "_", "-", "|", "1", "Query:"]
model_text = st.one_of(st.text(max_size=200),
                       st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=30).map("".join))
fast = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rationale_answer(text: str) -> str:
    return parse_answer_rationale(text)[0]


@fast
@given(model_text)
# the cases the property once missed: a label behind punctuation left in the answer ("-Answer:"), and a
# later "answer is" on the answer's line whose own answer lies on the next line
@example("So the final answer is:_-Answer:**A:")
@example("xshort answerSo the final answer is:**answer is**answer is\nxx")
def test_cleaners_are_idempotent_and_return_one_line(text):
    for clean in (clean_line, clean_answer, extract_short_answer, strip_label, rationale_answer):
        once = clean(text)
        assert isinstance(once, str)
        assert clean(once) == once, clean.__name__
        assert clean is clean_line or len(once.splitlines()) <= 1, clean.__name__


@pytest.mark.parametrize("reply, answer", [
    ("- Answer: Paris", "Paris"), ("### Answer -: Paris", "Paris"), ("-5 degrees", "-5 degrees"),
    ("(a) Paris", "(a) Paris"), ("... answer: 1990", "1990"),
])
def test_a_label_behind_punctuation_is_stripped_and_punctuation_alone_is_kept(reply, answer):
    assert clean_answer(reply) == answer and extract_short_answer(reply) == answer


@fast
@given(model_text)
def test_answer_readers_never_return_a_placeholder_or_a_bare_label(text):
    for answer in (clean_answer(text), extract_short_answer(text), parse_answer_rationale(text)[0]):
        assert not is_placeholder(answer) or answer == ""
        assert answer.strip().lower() not in ("answer:", "final answer:", "a:")
    marked = marked_answer(text)
    assert marked is None or (marked and not is_placeholder(marked))


@fast
@given(model_text)
def test_verdict_and_action_parsers_return_a_value_of_their_set(text):
    assert parse_yes_no(text) in (True, False, None)
    error, feedback = parse_reasoning_check(text)
    assert error in (*REASONING_ERRORS, None) and isinstance(feedback, str)
    kind, step, unlabelled = parse_step(text)
    assert kind in STEP_KINDS and isinstance(unlabelled, bool)
    assert (step != "") == (kind != "final-prompt")
    action, reasoning = parse_decision(text)
    assert action in (*ACTIONS, None) and isinstance(reasoning, str)
    assert parse_decision(text, ("A", "B"))[0] in ("A", "B", None)
    answer, rationale = parse_answer_rationale(text)
    assert isinstance(answer, str) and isinstance(rationale, str)
    assert isinstance(parse_query(text), str)
    assert set(labelled_fields(text, ("error", "feedback"))) <= {"error", "feedback"}


@fast
@given(model_text, st.integers(min_value=0, max_value=25))
def test_parse_permutation_always_returns_a_permutation(text, n):
    order, problems = parse_permutation(text, n)
    assert sorted(order) == list(range(n))
    assert all(isinstance(p, str) for p in problems)
    if NO_IDS in problems:  # nothing valid named: the original order
        assert order == list(range(n))


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=8)
prose = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=40)


@fast
@given(prose, st.dictionaries(st.text(max_size=6), json_values, max_size=4), prose)
def test_first_json_object_finds_an_object_in_prose(before, obj, after):
    assert first_json_object(before + json.dumps(obj) + after) == obj
    assert first_json_object(before + "```json\n" + json.dumps(obj, indent=1) + "\n```" + after) == obj


@fast
@given(model_text)
def test_first_json_object_never_raises(text):
    value = first_json_object(text)
    assert value is None or isinstance(value, dict)


# ------------------------------------------------------------------------------ linear time
ADVERSARIAL = ["{", '{"a": ', "{x", "answer:", "answer is ", "answer:\n", "answer ", "\n", " .", "'answer:'",
               "1", "1 ", "[", "<", '"', "Follow up:", "action:", "so the final answer is ", "Answer: x\n", "*",
               "Rationale:", "a", "\n \n", "Error: none|\n", " \n", "!\n",
               # [before, repeated, after]: one label or marker followed by a long run of spaces
               *([label, " ", "x"] for label in ("Query", "Sub-question 2", "answer", "Answer:", "so the final",
                                                 "Follow up", "Action", "Reasoning", "Error", "1", "[1", "{"))]
READERS = ["parsing.first_json_object", "parsing.parse_yes_no", "parsing.parse_answer_rationale",
           "parsing.extract_short_answer", "parsing.clean_answer", "parsing.parse_step", "parsing.strip_label",
           "methods.evoctx.parse_decision", "judges.llm_judges.parse_reasoning_check", "methods.sim_rag.parse_query",
           "rerank.listwise.parse_permutation"]
# Run in a child process, so that a reader gone quadratic fails within the timeout instead of hanging
# the suite: for each piece, the best of 3 timings on 12 KB and on 120 KB of it repeated, interleaved
# (tests/timing.py's `growth`; the large one skipped where the small one took GIVE_UP_S).
_TIMER = """
import importlib, json, sys, time
name, pieces, give_up = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
module, _, function = name.rpartition(".")
reader = getattr(importlib.import_module("metarag." + module), function)
if function == "parse_permutation":
    reader = lambda text, f=reader: f(text, 20)
def timed(text):
    start = time.perf_counter(); reader(text); return time.perf_counter() - start
out = []
def text(piece, size):
    before, repeated, after = piece if isinstance(piece, list) else ("", piece, "")
    return before + repeated * (size // len(repeated)) + after
for piece in pieces:
    small, large = float("inf"), float("inf")
    for _ in range(3):
        small = min(small, timed(text(piece, 12_000)))
        if small > give_up:
            large = None
            break
        large = min(large, timed(text(piece, 120_000)))
    out.append((piece, small, large))
print(json.dumps(out))
"""


@pytest.mark.parametrize("name", READERS)
def test_readers_take_linear_time(name):
    """120 KB of a repeated adversarial piece against 12 KB of it, timed in the same run: a linear
    reader's time grows about 10x, a quadratic one's about 100x (the quadratic readers this replaced
    took 1-14 s on 12 KB already, 47 s and more on 120 KB). A ratio, not a bound in seconds, so a
    machine whose cores are busy elsewhere slows both timings alike (tests/timing.py)."""
    try:
        done = subprocess.run([sys.executable, "-c", _TIMER, name, json.dumps(ADVERSARIAL), str(GIVE_UP_S)],
                              capture_output=True, text=True, timeout=120, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not read {len(ADVERSARIAL)} adversarial texts of 120 KB within 120 s")
    slow = []
    for piece, small, large in json.loads(done.stdout):
        if superlinear(small, large):  # a millisecond's noise is below timing.FLOOR_S: never a failure
            slow.append((piece, small, large))
    assert not slow, f"{name} is superlinear on (piece, seconds on 12 KB, on 120 KB): {slow}"


# ------------------------------------------------------------------------------ the module's place
def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_parsing_imports_only_the_stdlib_records_and_errors():
    for name in _imports(SRC / "parsing.py"):
        top = name.split(".")[0]
        assert name in ("metarag.records", "metarag.errors", "__future__") or (
            top != "metarag" and top in sys.stdlib_module_names), name


def test_methods_import_nothing_from_evaluate():
    for path in sorted((SRC / "methods").glob("*.py")):
        bad = [n for n in _imports(path) if n == "metarag.evaluate" or n.startswith("metarag.evaluate.")]
        assert not bad, f"{path.name} imports {bad}"


def test_every_reader_in_parsing_is_read_by_more_than_one_module():
    # a reader one module alone uses lives in that module (ReAct's actions in methods/react.py ...);
    # parsing keeps the shared ones, and those its own readers are built from
    tree = ast.parse((SRC / "parsing.py").read_text(encoding="utf-8"))
    public = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    used_inside = {n.id for f in tree.body if isinstance(f, ast.FunctionDef)
                   for n in ast.walk(f) if isinstance(n, ast.Name) and n.id != f.name}
    readers: dict[str, set[str]] = {name: set() for name in public}
    for path in SRC.rglob("*.py"):
        if path.name == "parsing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "metarag.parsing":
                for alias in node.names:
                    readers.get(alias.name, set()).add(str(path.relative_to(SRC)))
    shared_contract = {"read_agent_action", "agent_closing_tag"}  # the search agents' step format (STYLE.md)
    lonely = {name: sorted(found) for name, found in readers.items()
              if len(found) < 2 and name not in used_inside | shared_contract}
    assert not lonely, f"readers one module uses, to move into it: {lonely}"
