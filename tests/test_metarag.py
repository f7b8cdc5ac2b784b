"""MetaRAG on the scripted LLM: a golden trace for acceptance at the monitor, for each branch of the
2×2 plan, and for reaching max_iter; plus the counts the harness reads (transitions, iterations)."""
import json
import os
from pathlib import Path

import pytest
from test_methods import without_latency

from metarag.llm.scripted import ScriptedLLM
from metarag.methods.metarag import MetaRAG, MetaRAGSettings, choose_plan
from metarag.methods.runner import Runtime, run
from metarag.records import Decide, Judge, Question, Retrieve
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
# The papers' full loop; tests/test_fixed_point.py runs every case with the fixed-point rule on.
SETTINGS = MetaRAGSettings(similarity="token-f1", max_iter=3, stop_at_fixed_point=False)


def scripted(internal: float, external: float, entailed: float, reasons=("Paris", "Dijon"), expert="Dijon"):
    rationale = "Gustave Eiffel built the tower."
    return ScriptedLLM(
        [("Think step by step in at most three", [f"{rationale}\nAnswer: {r}" for r in reasons]),
         ("Copy the shortest span", expert),
         ("Check the proposed answer", "Error: misaligned\nFeedback: Give the birthplace of Eiffel."),
         ("miss information needed", "Gustave Eiffel birthplace"),
         ("first simpler sub-question", "Who engineered the Eiffel Tower?")],
        [("from your own knowledge alone", {"Yes": internal, "No": 1 - internal}),
         ("contain all the information", {"Yes": external, "No": 1 - external}),
         ("entail the claim", {"Yes": entailed, "No": 1 - entailed})])


CASES = {
    "accept": dict(internal=0.9, external=0.9, entailed=0.9, reasons=("Dijon",)),
    "keep": dict(internal=0.9, external=0.9, entailed=0.9),
    "reason-hops": dict(internal=0.9, external=0.9, entailed=0.1),
    "rewrite": dict(internal=0.9, external=0.1, entailed=0.9),
    "strict-passages": dict(internal=0.1, external=0.9, entailed=0.9),
    "decompose": dict(internal=0.1, external=0.1, entailed=0.9),
    "max-iter": dict(internal=0.1, external=0.1, entailed=0.9, reasons=("Paris",), expert="Dijon"),
}


def run_case(name, corpus):
    llm = scripted(**CASES[name])
    return run(MetaRAG(SETTINGS), Q, Runtime(llm, MemoryRetriever(corpus))), llm


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"metarag-{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def decisions(trace, name):
    return [s.choice for s in trace.steps if isinstance(s, Decide) and s.name == name]


def test_acceptance_at_the_monitor_ends_without_evaluation(corpus):
    trace, _ = run_case("accept", corpus)
    assert trace.answer == "Dijon"
    assert decisions(trace, "ms-transition") == [] and decisions(trace, "iteration") == ["reason"]
    monitor = [s for s in trace.steps if isinstance(s, Judge) and s.name == "monitor-similarity"]
    assert [m.verdict for m in monitor] == ["accept"] and monitor[0].score == 1.0


@pytest.mark.parametrize("name, retrievals", [("keep", 1), ("reason-hops", 1), ("rewrite", 2),
                                              ("strict-passages", 1), ("decompose", 2)])
def test_each_plan_is_taken_and_the_second_answer_accepted(name, retrievals, corpus):
    trace, llm = run_case(name, corpus)
    assert decisions(trace, "plan") == [name]
    assert trace.answer == "Dijon" and len(decisions(trace, "ms-transition")) == 1
    assert len(decisions(trace, "iteration")) == 2 and trace.usage.retrieval_calls == retrievals
    judged = {s.name for s in trace.steps if isinstance(s, Judge)}
    assert ("entailment" in judged) == (name in ("keep", "reason-hops"))  # only when both are sufficient
    second_reason = [p for p in llm.prompts if "Think step by step in at most three" in p][1]
    assert "Give the birthplace of Eiffel." in second_reason  # the critic's feedback reaches the reasoner


def test_new_passages_are_appended_in_rank_order_without_duplicates(corpus):
    trace, llm = run_case("rewrite", corpus)
    first, second = [s for s in trace.steps if isinstance(s, Retrieve)]
    assert second.query == "Gustave Eiffel birthplace"
    assert not {h.passage.id for h in first.hits} & {h.passage.id for h in second.hits}


def test_max_iter_bounds_the_loop(corpus):
    trace, _ = run_case("max-iter", corpus)
    assert len(decisions(trace, "ms-transition")) == 3 == SETTINGS.max_iter
    assert len(decisions(trace, "iteration")) == 4 and trace.answer == "Paris"


def test_plan_table():
    assert choose_plan(True, True, True) == "keep"
    assert choose_plan(True, True, False) == "reason-hops"
    assert choose_plan(True, False, None) == "rewrite"
    assert choose_plan(False, True, None) == "strict-passages"
    assert choose_plan(False, False, None) == "decompose"


def test_reasoning_cut_off_before_its_answer_line_gets_a_finalize_call(corpus):
    llm = scripted(0.9, 0.9, 0.9)
    llm.rules[0].responses = ["Step 1: find the engineer.\nStep 2: find where he was"]  # no 'Answer:'
    llm.rules.insert(0, type(llm.rules[0])("Give only the final short answer", ["Dijon."]))
    trace = run(MetaRAG(SETTINGS), Q, Runtime(llm, MemoryRetriever(corpus)))
    purposes = [s.purpose for s in trace.steps if hasattr(s, "purpose")]
    assert purposes[:2] == ["reason", "finalize"] and trace.answer == "Dijon"
    finalize_prompt = llm.prompts[1]
    assert finalize_prompt.startswith(llm.prompts[0].rsplit("<assistant>", 1)[0])  # same prefix, KV reused
