"""The fixed-point rule (methods/fixed_point.py), the model-served / cache-served request counts and
the reasoner's budget settings (issue 18).

Golden traces: MetaRAG reaching a fixed point at iteration 2 (the scripted model gives the same answer
and verdicts every round), and the same run with the rule off going to max_iter; every existing
golden case with the rule on (only `max-iter` changes: it reaches a fixed point once the 5-passage
corpus runs out). Answers are the same with the rule on and off, on the scripted 20-question sample."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from test_evoctx import CASES as EVOCTX_CASES
from test_evoctx import ITERDRAG_CASES, StubEncoder, iterdrag_llm
from test_evoctx import run_case as evoctx_case
from test_harness import config, reader
from test_metarag import CASES as METARAG_CASES
from test_metarag import SETTINGS as FULL_LOOP
from test_metarag import Q, scripted
from test_methods import without_latency
from test_run_many import metarag_llm, pick

from metarag.display import format_trace
from metarag.errors import ConfigError
from metarag.evaluate.cost import served_usage
from metarag.evaluate.harness import evaluate, prepare, score
from metarag.evaluate.report import COLUMNS, LoadedRun, load_run, report_table, summarize
from metarag.evaluate.sweep import COST_COLUMNS
from metarag.llm.base import Decoding
from metarag.llm.cache import CachedLLM, ResponseCache
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.evoctx import EvoCtx, EvoCtxSettings
from metarag.methods.fixed_point import FixedPoint, LoopState, ends_as
from metarag.methods.iterdrag import IterDRAG, IterDRAGSettings
from metarag.methods.metarag import MetaRAG, MetaRAGSettings
from metarag.methods.registry import method_settings
from metarag.methods.runner import Runtime, Sampling, run, run_many
from metarag.policy.actions import Ask
from metarag.records import Answer, Decide, Generate, Message, Passage, Question, Retrieve, Trace, Usage
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
RULE_ON = dataclasses.replace(FULL_LOOP, stop_at_fixed_point=True)
# the same answer and the same verdicts every round: sufficient, sufficient, entailed -> "keep", and
# an expert whose reference ("Dijon") never accepts the answer ("Paris")
SAME_EVERY_ROUND = dict(internal=0.9, external=0.9, entailed=0.9, reasons=("Paris",), expert="Dijon")


def check_golden(name: str, trace: Trace) -> None:
    assert trace.error is None, trace.error
    got = without_latency(trace)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def fixed_points(trace: Trace) -> list[Decide]:
    return [s for s in trace.steps if isinstance(s, Decide) and s.name == "fixed-point"]


def choices(trace: Trace, name: str) -> list[str]:
    return [s.choice for s in trace.steps if isinstance(s, Decide) and s.name == name]


def metarag_run(settings, corpus, runtime_kw=None, **script):
    llm = scripted(**script)
    return run(MetaRAG(settings), Q, Runtime(llm, MemoryRetriever(corpus), **(runtime_kw or {}))), llm


# ------------------------------------------------------------------------------ MetaRAG goldens
def test_metarag_reaches_a_fixed_point_at_iteration_2(corpus):
    trace, llm = metarag_run(RULE_ON, corpus, **SAME_EVERY_ROUND)
    check_golden("metarag-fixed-point", trace)
    (stop,) = fixed_points(trace)
    assert stop.choice == "stop" and stop.signals == {"iteration": 2.0, "repeats": 1.0, "ends_as": 1.0, "last": 3.0}
    assert choices(trace, "iteration") == ["reason", "reason"] and choices(trace, "plan") == ["keep", "keep"]
    assert trace.answer == "Paris"
    # the stop comes right before the third reasoning request, which would repeat the second's prompt
    assert isinstance(trace.steps[-2], Decide) and trace.steps[-2].name == "fixed-point"
    reasons = [p for p in llm.prompts if "Think step by step" in p]
    assert len(reasons) == 2 and reasons[0] != reasons[1]


def test_metarag_with_the_rule_off_runs_to_max_iter(corpus):
    trace, llm = metarag_run(FULL_LOOP, corpus, **SAME_EVERY_ROUND)
    check_golden("metarag-fixed-point-off", trace)
    assert not fixed_points(trace)
    assert len(choices(trace, "ms-transition")) == FULL_LOOP.max_iter == 3
    assert len(choices(trace, "iteration")) == 4 and trace.answer == "Paris"
    reasons = [p for p in llm.prompts if "Think step by step" in p]
    assert len(set(reasons[1:])) == 1  # iterations 2 and 3 ask iteration 1's prompt again
    on, _ = metarag_run(RULE_ON, corpus, **SAME_EVERY_ROUND)
    assert on.usage.llm_requests < trace.usage.llm_requests and on.answer == trace.answer


# Exactly the golden cases whose trace the rule changes (all others: the full loop's trace, step for step).
CHANGED_BY_THE_RULE = {"max-iter"}


@pytest.mark.parametrize("name", sorted(METARAG_CASES))
def test_every_metarag_golden_case_with_the_rule_on(name, corpus):
    on, _ = metarag_run(RULE_ON, corpus, **METARAG_CASES[name])
    off, _ = metarag_run(FULL_LOOP, corpus, **METARAG_CASES[name])
    assert on.answer == off.answer
    if name in CHANGED_BY_THE_RULE:
        check_golden(f"metarag-{name}-fixed-point", on)
        assert without_latency(on) != without_latency(off)
    else:
        assert without_latency(on) == json.loads((GOLDEN / f"metarag-{name}.json").read_text())


def test_max_iter_case_stops_when_decompose_finds_no_new_passage(corpus):
    # k = 5 over the 5-passage corpus: the first decompose retrieves nothing new, so round 2 plans and
    # advises exactly as round 1 did, and iteration 2 would start from iteration 1's evidence and guidance
    on, _ = metarag_run(RULE_ON, corpus, **METARAG_CASES["max-iter"])
    (stop,) = fixed_points(on)
    assert (stop.signals["iteration"], stop.signals["repeats"]) == (2.0, 1.0)
    assert choices(on, "plan") == ["decompose", "decompose"] and on.answer == "Paris"


def test_a_state_that_differs_only_in_a_new_passage_does_not_stop_the_loop(corpus):
    # k = 1: every decompose adds one passage (same plan, same critic feedback, so the same guidance),
    # until the corpus has none left; only then does an iteration repeat an earlier one's state
    settings = dataclasses.replace(RULE_ON, k=1, max_iter=6)
    on, _ = metarag_run(settings, corpus, **METARAG_CASES["max-iter"])
    off, _ = metarag_run(dataclasses.replace(settings, stop_at_fixed_point=False), corpus, **METARAG_CASES["max-iter"])
    grown = [len(r.hits) for r in on.steps if isinstance(r, Retrieve)]
    assert grown[:2] == [1, 1]  # the second retrieval brought one new passage
    (stop,) = fixed_points(on)
    iteration = int(stop.signals["iteration"])
    # every iteration before the stop had a new passage, with the same guidance as the one before it
    new_passages = sum(1 for n in grown[1:] if n)
    assert iteration == new_passages + 1 and stop.signals["repeats"] == iteration - 1
    assert len(choices(on, "iteration")) == iteration and on.answer == off.answer
    # up to the stop, the rule-on trace is the full loop's
    assert [without_latency(Trace("q", "", "m", (s,)))["steps"] for s in on.steps[:-2]] == \
        [without_latency(Trace("q", "", "m", (s,)))["steps"] for s in off.steps[:len(on.steps) - 2]]


def test_sampled_decoding_never_stops_early(corpus):
    trace, _ = metarag_run(RULE_ON, corpus, runtime_kw={"sampling": Sampling(temperature=0.7, seed=3)},
                           **SAME_EVERY_ROUND)
    assert not fixed_points(trace) and len(choices(trace, "iteration")) == 4


class Loop:
    """A toy iterative method: its state cycles through `cycle` after `prefix`; each iteration asks
    the model about its state; the answer is the last iteration's reply."""

    name = "loop"

    def __init__(self, prefix, cycle, last, temperature=0.0, rule=True):
        self.states = list(prefix) + list(cycle) * (last + 1)
        self.last, self.temperature, self.rule = last, temperature, rule

    def policy(self, question):
        replies = []
        for i in range(self.last + 1):
            if self.rule:
                fixed = yield LoopState(self.states[i], i, self.last)
                if fixed is not None:
                    return replies[fixed.ends_as]
            out = yield Ask("step", (Message("user", f"state {self.states[i]}"),),
                            Decoding(max_tokens=4, temperature=self.temperature))
            replies.append(out.text)
        return replies[-1]


def echo_llm():
    return ScriptedLLM([("state", lambda p: f"reply-{p.split('state ')[1].split()[0]}")])


@pytest.mark.parametrize("cycle", [("A",), ("A", "B"), ("A", "B", "C")])
@pytest.mark.parametrize("last", [2, 3, 4, 5, 6, 9])
def test_a_cycle_ends_with_the_full_loops_answer(cycle, last):
    q = Question("q", "?")
    on = run(Loop(("S",), cycle, last), q, Runtime(echo_llm()))
    off = run(Loop(("S",), cycle, last, rule=False), q, Runtime(echo_llm()))
    assert on.answer == off.answer
    stops = fixed_points(on)
    if last >= 1 + len(cycle):  # the loop gets to see its first state again
        (stop,) = stops
        assert stop.signals["iteration"] == 1 + len(cycle) and stop.signals["repeats"] == 1
        assert on.usage.llm_requests == 1 + len(cycle) < off.usage.llm_requests
    else:
        assert not stops and without_latency(on) == without_latency(off)


def test_ends_as_formula_and_bad_repeats():
    assert ends_as(2, 1, 5) == 1  # period 1: the last state's outcome
    assert [ends_as(3, 1, last) for last in (3, 4, 5, 6)] == [1, 2, 1, 2]  # period 2
    assert ends_as(4, 1, 2) == 1  # a state past the budget ends as the one it repeats would
    with pytest.raises(ConfigError, match="earlier iteration"):
        ends_as(2, 2, 5)


def test_a_sampled_request_switches_the_rule_off_for_its_question():
    q = Question("q", "?")
    greedy = run(Loop((), ("A",), 4), q, Runtime(echo_llm()))
    assert fixed_points(greedy) and greedy.usage.llm_requests == 1
    sampled = run(Loop((), ("A",), 4, temperature=0.5), q, Runtime(echo_llm()))
    assert not fixed_points(sampled) and sampled.usage.llm_requests == 5
    run_level = run(Loop((), ("A",), 4), q, Runtime(echo_llm(), sampling=Sampling(temperature=0.0)))
    assert not fixed_points(run_level) and run_level.usage.llm_requests == 5


def test_an_unhashable_state_fails_its_question_with_a_message():
    class Bad:
        name = "bad"

        def policy(self, question):
            yield LoopState(["a", "list"], 0, 2)
            return ""

    trace = run(Bad(), Question("q", "?"), Runtime(echo_llm()))
    assert trace.error and "loop state must be hashable" in trace.error


def test_fixed_point_reply_type():
    assert FixedPoint(2, 1, 1).ends_as == 1


# ------------------------------------------------------------------------ EvoCtx and IterDRAG
@pytest.mark.parametrize("name", sorted(EVOCTX_CASES))
def test_evoctx_golden_cases_are_the_same_with_the_rule_off(name, corpus):
    # the goldens run with the rule on (the default); none of them reaches a fixed point
    values, decisions, bare = EVOCTX_CASES[name]
    on, _ = evoctx_case(name, corpus)
    from test_evoctx import scripted as evoctx_llm
    off = run(EvoCtx(EvoCtxSettings(**values, stop_at_fixed_point=False), encoder=StubEncoder()), Q,
              Runtime(evoctx_llm(decisions, bare or ("RETRIEVE",)), MemoryRetriever(corpus)))
    assert not fixed_points(on) and without_latency(on) == without_latency(off)


def test_evoctx_stops_when_think_adds_no_new_sub_query(corpus):
    # THINK every round, and the sub-query model repeats itself: round 3 starts where round 2 did
    from test_evoctx import scripted as evoctx_llm
    near_think = "Reasoning: Gustave Eiffel engineered the tower and was born in Dijon.\nAction: THINK"
    values = dict(k=2, T=6, ablation="no-boundary")
    on = run(EvoCtx(EvoCtxSettings(**values), encoder=StubEncoder()), Q,
             Runtime(evoctx_llm([near_think]), MemoryRetriever(corpus)))
    off = run(EvoCtx(EvoCtxSettings(**values, stop_at_fixed_point=False), encoder=StubEncoder()), Q,
              Runtime(evoctx_llm([near_think]), MemoryRetriever(corpus)))
    (stop,) = fixed_points(on)
    assert (stop.signals["iteration"], stop.signals["repeats"], stop.signals["last"]) == (4.0, 3.0, 7.0)
    assert on.answer == off.answer == "Dijon"
    assert len(choices(off, "evoctx-decision")) == 6 and len(choices(on, "evoctx-decision")) == 3
    assert on.usage.llm_requests < off.usage.llm_requests
    # the final answer is asked from the same state as the full loop's
    assert [s for s in on.steps if isinstance(s, Generate)][-1].prompt == \
        [s for s in off.steps if isinstance(s, Generate)][-1].prompt


def test_evoctx_passages_excluded_from_the_next_search_are_part_of_its_state():
    # a RETRIEVE that finds only a copy of a context passage (another id, the same text) leaves the
    # context and sub-queries as they were, but the next Search excludes the copy and finds new evidence
    corpus = [Passage("a", "Eiffel Tower", "The Eiffel Tower is a tower in Paris."),
              Passage("b", "Eiffel Tower", "The Eiffel Tower is a tower in Paris."),
              Passage("c", "Gustave Eiffel", "Gustave Eiffel built the tower and was born in Dijon.")]

    def llm():
        return ScriptedLLM([("Decide the next step", "Reasoning: more evidence is needed.\nAction: RETRIEVE"),
                            ("Write one search query", "Eiffel Tower"),
                            ("Short answer:", lambda p: "Dijon" if "born in Dijon" in p else "Paris")])

    values = dict(k=1, T=3, ablation="no-boundary", confidence_probe=False, encoder="bag-of-words")
    question = Question("q", "Which tower is in Paris?", ("Dijon",))
    on = run(EvoCtx(EvoCtxSettings(**values)), question, Runtime(llm(), MemoryRetriever(corpus)))
    off = run(EvoCtx(EvoCtxSettings(**values, stop_at_fixed_point=False)), question,
              Runtime(llm(), MemoryRetriever(corpus)))
    assert on.error is None and off.error is None
    assert [[h.passage.id for h in s.hits] for s in off.steps if isinstance(s, Retrieve)] == [["a"], ["b"], ["c"], []]
    assert off.answer == "Dijon" and on.answer == off.answer
    assert not fixed_points(on)  # every round's Search excluded more passages: no state repeated


def test_a_closed_context_takes_no_passage_whatever_is_retrieved():
    from metarag.methods.evoctx import context_is_closed, extend_context, passage_tokens
    from metarag.records import Hit

    def hit(i, title, words):
        return Hit(Passage(f"p{i}", title, " ".join(f"w{i}x{j}" for j in range(words))), 1.0 / (i + 1), "bm25")

    candidates = [hit(90, "", 1), hit(91, "T", 1), hit(92, "", 40), hit(93, "A long title here", 3)]
    for budget in range(1, 60):
        for first in ([hit(0, "Some title", 30)], [hit(0, "A very long title of many words", 1)], []):
            context = extend_context([], first, budget, "first")
            grown = [extend_context(context, [c], budget, "first") for c in candidates]
            closed = context_is_closed(context, budget, "first")
            assert closed == all(g == context for g in grown), (budget, context)
            if closed:
                assert sum(passage_tokens(h.passage) for h in context) <= budget
    full = extend_context([], [hit(0, "Some title", 30)], 20, "first")
    assert context_is_closed(full, 20, "first")  # a passage cut at the budget closes it
    assert not context_is_closed(full, 20, "recent") and not context_is_closed(full, 0, "first")


@pytest.mark.parametrize("name", sorted(ITERDRAG_CASES))
def test_iterdrag_never_repeats_a_state(name, corpus):
    # every step that goes on adds a follow-up to the chain, so the rule cannot fire
    values, steps = ITERDRAG_CASES[name]
    on = run(IterDRAG(IterDRAGSettings(**values)), Q, Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    off = run(IterDRAG(IterDRAGSettings(**values, stop_at_fixed_point=False)), Q,
              Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    assert not fixed_points(on) and without_latency(on) == without_latency(off)


# --------------------------------------------------------------- the scripted 20-question sample
def metarag_sample_llm() -> ScriptedLLM:
    """test_run_many's MetaRAG script (every answer a function of the prompt), with judges whose
    verdicts vary by question, so that all four plans occur (that script's plans are all "decompose")."""
    llm = metarag_llm()
    llm.label_rules = [(re.compile(p, re.S), probs) for p, probs in [
        (r"^(?=.*from your own knowledge alone)(?=.*Question: [A-M])", {"Yes": 0.9, "No": 0.1}),
        ("from your own knowledge alone", {"Yes": 0.2, "No": 0.8}),
        (r"^(?=.*contain all the information)(?=.*Question: \S+ \S+ [a-m])", {"Yes": 0.8, "No": 0.2}),
        ("contain all the information", {"Yes": 0.3, "No": 0.7}),
        (r"^(?=.*entail the claim)(?=.*Question: \S*[aeiou]{2})", {"Yes": 0.7, "No": 0.3}),
        ("entail the claim", {"Yes": 0.4, "No": 0.6})]]
    return llm


def test_metarag_answers_are_identical_with_the_rule_on_and_off(sample20):
    questions, retriever = sample20
    settings = MetaRAGSettings(similarity="token-f1", max_iter=5)
    on = run_many(MetaRAG(settings), questions, Runtime(metarag_sample_llm(), retriever))
    off = run_many(MetaRAG(dataclasses.replace(settings, stop_at_fixed_point=False)), questions,
                   Runtime(metarag_sample_llm(), retriever))
    plans = {c for t in off for c in choices(t, "plan")}
    assert len(plans) >= 3, plans
    assert all(t.error is None for t in on + off)
    assert [t.answer for t in on] == [t.answer for t in off]
    stopped = [t for t in on if fixed_points(t)]
    assert len(stopped) >= 5  # the rule really fired, on several questions
    assert sum(t.usage.llm_requests for t in on) < sum(t.usage.llm_requests for t in off)
    for a, b in zip(on, off):  # a question that never reached a fixed point has the full loop's trace
        if not fixed_points(a):
            assert without_latency(a) == without_latency(b)


def evoctx_sample_llm():
    """EvoCtx prompts answered as a function of the prompt: decisions, queries and sub-queries drawn
    from small sets, so sub-queries repeat and some rounds start where an earlier one did."""
    def decide(p):
        action = pick(p, "act")
        kind = "RETRIEVE" if action in ("Paris", "Dijon") else "ANSWER" if action == "1832" else "THINK"
        return f"Reasoning: {pick(p, 'why')} is still needed.\nAction: {kind}"
    return ScriptedLLM(
        [("Decide the next step", decide),
         ("Write one search query", lambda p: f"{pick(p, 'q')} history"),
         ("Write the next sub-question", lambda p: f"Who is {pick(p, 'sub')[:4]}?"),
         ("Short answer:", lambda p: pick(p, "answer"))],
        [("sufficient to answer", {"Yes": 0.4, "No": 0.6})])


def test_evoctx_answers_are_identical_with_the_rule_on_and_off(sample20):
    questions, retriever = sample20
    values = dict(T=8, encoder="bag-of-words")
    on = run_many(EvoCtx(EvoCtxSettings(**values)), questions, Runtime(evoctx_sample_llm(), retriever))
    off = run_many(EvoCtx(EvoCtxSettings(**values, stop_at_fixed_point=False)), questions,
                   Runtime(evoctx_sample_llm(), retriever))
    assert all(t.error is None for t in on + off)
    assert [t.answer for t in on] == [t.answer for t in off]
    assert sum(bool(fixed_points(t)) for t in on) >= 15  # all 20, on hotpotqa-dev500's sample and on the demo
    assert sum(t.usage.llm_requests for t in on) < sum(t.usage.llm_requests for t in off)


# --------------------------------------------------------------------------- settings and ids
def test_the_rule_and_the_budget_are_settings_and_change_the_run_id(tmp_path):
    ids = {}
    for method, values in [("metarag", {}), ("metarag", {"stop_at_fixed_point": "false"}),
                           ("metarag", {"reason_max_tokens": "64"}),
                           ("metarag", {"reason_length": "one short sentence"}),
                           ("evoctx", {}), ("evoctx", {"stop_at_fixed_point": "false"}),
                           ("evoctx", {"decision_max_tokens": "64"}),
                           ("iterdrag", {}), ("iterdrag", {"stop_at_fixed_point": "false"})]:
        store, *_ = prepare(config(tmp_path, method=method, overrides=values))
        ids[(method, tuple(values.items()))] = store.path.name
    assert len(set(ids.values())) == len(ids)
    assert method_settings("metarag", {"reason_max_tokens": "64"}).reason_max_tokens == 64
    with pytest.raises(ConfigError, match="reason_length"):
        MetaRAGSettings(reason_length="  ")


def test_reason_length_and_budget_are_what_the_reasoner_gets(corpus):
    llm = scripted(0.9, 0.9, 0.9, reasons=("Dijon",))
    llm.rules[0].pattern = "Think step by step in one short sentence"
    budgets = []
    complete = llm.complete
    llm.complete = lambda prompt, decoding=Decoding(): budgets.append(decoding.max_tokens) or complete(prompt, decoding)
    settings = dataclasses.replace(RULE_ON, reason_length="one short sentence", reason_max_tokens=64)
    trace = run(MetaRAG(settings), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.error is None and trace.answer == "Dijon"
    reason = next(s for s in trace.steps if isinstance(s, Generate) and s.purpose == "reason")
    assert "in one short sentence, then give the final answer" in reason.prompt[-1].content
    assert budgets[0] == 64


# ------------------------------------------------------------------- served and cached requests
def step(usage: Usage) -> Generate:
    return Generate(usage, "answer", (), "x")


def known_run(tmp_path) -> LoadedRun:
    """Two questions: q1 three requests, one of them from the response cache; q2 one request from
    the cache. Latencies and tokens chosen so every figure is checkable by hand."""
    served = Usage(prompt_tokens=100, completion_tokens=20, latency_s=2.0, llm_requests=1)
    cached = Usage(prompt_tokens=100, completion_tokens=20, latency_s=0.01, llm_requests=1, cache_hits=1)
    retrieval = Usage(latency_s=0.5, retrieval_calls=1)
    traces = [Trace("q1", "Q1?", "m", (Retrieve(retrieval, "Q1?", 5, ()), step(served), step(served),
                                       step(cached), Answer(Usage(), "a")), answer="a"),
              Trace("q2", "Q2?", "m", (Retrieve(retrieval, "Q2?", 5, ()), step(cached), Answer(Usage(), "b")),
                    answer="b")]
    results = tuple(score(Question(t.question_id, t.question, ("a",)), t) for t in traces)
    return LoadedRun("known", tmp_path, {"method": "m"}, {}, ("q1", "q2"), results)


def test_report_counts_served_and_cached_requests_apart(tmp_path):
    row = summarize(known_run(tmp_path))
    assert row["req/q"] == 2.0 and row["served req/q"] == 1.0 and row["cached req/q"] == 1.0
    assert row["tok/q"] == 240.0 and row["served tok/q"] == 120.0
    assert row["served prompt tok/q"] == 100.0 and row["served completion tok/q"] == 20.0
    assert row["lat/q"] == pytest.approx((0.5 + 4.01 + 0.5 + 0.01) / 2)
    assert row["served lat/q"] == pytest.approx((0.5 + 4.0 + 0.5) / 2)
    assert row["lat/req"] == pytest.approx(2.0) and row["steps/q"] == 4.0
    table, _ = report_table([known_run(tmp_path)])
    header = table.splitlines()[0]
    assert "| req/q | served req/q | cached req/q |" in header and "served lat/q" in header
    assert "| 2.00 | 1.00 | 1.00 |" in table.splitlines()[2]
    table, _ = report_table([known_run(tmp_path)], columns=["EM", "served req/q", "served completion tok/q"])
    assert table.splitlines()[0] == "| EM | served req/q | served completion tok/q |"
    assert {"served req/q", "cached req/q", "served tok/q", "served lat/q"} <= set(COLUMNS)


def test_a_partly_cached_step_counts_its_served_share():
    u = served_usage([step(Usage(prompt_tokens=400, completion_tokens=40, latency_s=4.0, llm_requests=4,
                                 cache_hits=1))])
    assert (u.llm_requests, u.prompt_tokens, u.completion_tokens, u.cache_hits) == (3, 300, 30, 0)
    assert u.latency_s == pytest.approx(3.0)


def test_a_rerun_from_a_full_cache_is_all_cache_served(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    first, _ = evaluate(config(tmp_path), progress=False, llm=CachedLLM(reader(), cache))
    again, _ = evaluate(dataclasses.replace(config(tmp_path), runs_dir=str(tmp_path / "again")), progress=False,
                        llm=CachedLLM(reader(), cache))
    a, b = summarize(load_run(first.path)), summarize(load_run(again.path))
    assert (a["req/q"], a["served req/q"], a["cached req/q"]) == (1.0, 1.0, 0.0)
    assert (b["req/q"], b["served req/q"], b["cached req/q"]) == (1.0, 0.0, 1.0)
    assert b["tok/q"] == a["tok/q"] > 0 and b["served tok/q"] == 0.0 and a["served tok/q"] == a["tok/q"]
    assert b["lat/req"] is None


def test_metarag_repeats_are_cache_served_without_the_rule(tmp_path, corpus):
    # the rule off: iterations 2 and 3 repeat iteration 1's requests, which the cache answers
    llm = CachedLLM(scripted(**SAME_EVERY_ROUND), ResponseCache(tmp_path / "cache.sqlite"))
    off = run(MetaRAG(FULL_LOOP), Q, Runtime(llm, MemoryRetriever(corpus)))
    served = served_usage(off.steps)
    assert off.usage.cache_hits > 0 and served.llm_requests == off.usage.llm_requests - off.usage.cache_hits
    llm = CachedLLM(scripted(**SAME_EVERY_ROUND), ResponseCache(tmp_path / "other.sqlite"))
    on = run(MetaRAG(RULE_ON), Q, Runtime(llm, MemoryRetriever(corpus)))
    # the rule leaves out only requests the cache would have answered: the model serves the same ones
    assert served_usage(on.steps).llm_requests == served.llm_requests
    assert on.usage.llm_requests < off.usage.llm_requests


def test_ask_totals_show_served_and_cached_requests():
    cached = Usage(prompt_tokens=100, completion_tokens=20, latency_s=0.01, llm_requests=1, cache_hits=1)
    served = Usage(prompt_tokens=50, completion_tokens=5, latency_s=1.5, llm_requests=1)
    trace = Trace("q", "Q?", "m", (step(served), step(cached), Answer(Usage(), "a")), answer="a")
    total = format_trace(trace, header_only=True).splitlines()
    assert total[1].startswith("Total: 1.51 s, 2 LLM requests, 150 prompt + 25 completion tokens")
    assert total[2] == ("Served by the model: 1 of the 2 requests (1 from the response cache), "
                        "50 prompt + 5 completion tokens, 1.50 s")
    plain = format_trace(Trace("q", "Q?", "m", (step(served), Answer(Usage(), "a")), answer="a"), header_only=True)
    assert "Served by the model" not in plain  # nothing cached: the totals are the served counts


def test_sweep_table_has_the_served_cost_columns():
    assert COST_COLUMNS[:5] == ("req/q", "served req/q", "cached req/q", "served tok/q", "served lat/q")


def test_a_sweep_over_the_reasoners_budget_tabulates_quality_against_served_cost(tmp_path, monkeypatch):
    import metarag.evaluate.sweep as sweep_module
    from metarag.evaluate.sweep import sweep
    from metarag.llm.scripted import Rule

    def llm():
        script = metarag_sample_llm()
        script.rules.insert(0, Rule("Give only the final short answer", [lambda p: pick(p, "final")]))
        return script

    real = sweep_module.evaluate
    monkeypatch.setattr(sweep_module, "evaluate", lambda cfg, progress: real(cfg, progress=False, llm=llm()))
    cfg = config(tmp_path, method="metarag", overrides={"similarity": "token-f1", "max_iter": "2"})
    table, rows = sweep(cfg, {"reason_max_tokens": ["4", "160"]}, progress=False)
    header = table.splitlines()[0]
    assert header.startswith("| reason_max_tokens | n | failed | EM | F1 | req/q | served req/q | cached req/q | "
                             "served tok/q | served lat/q | retr/q |")
    short, full = rows
    assert short["served completion tok/q"] < full["served completion tok/q"]
    # 4 tokens cut the reasoning before its 'Answer:' line: each reasoning then asks for the answer alone
    finalize = [s for r in load_run(tmp_path / "runs" / short["run"]).results for s in r.trace.steps
                if isinstance(s, Generate) and s.purpose == "finalize"]
    assert finalize and not [s for r in load_run(tmp_path / "runs" / full["run"]).results for s in r.trace.steps
                             if isinstance(s, Generate) and s.purpose == "finalize"]
    assert short["set:reason_max_tokens"] == 4 and full["set:reason_max_tokens"] == 160


def test_the_viewer_cell_counts_served_and_cached_requests(tmp_path):
    from metarag.view.loading import question_cell

    first, second = known_run(tmp_path).results
    assert (question_cell(first)["requests"], question_cell(first)["served_requests"],
            question_cell(first)["cached_requests"]) == (3, 2, 1)
    assert (question_cell(second)["served_requests"], question_cell(second)["cached_requests"]) == (0, 1)
