"""Golden traces: each method on a fixed script must produce exactly the stored trace.

Regenerate after an intended change with METARAG_UPDATE_GOLDEN=1 and review the diff.
"""
import dataclasses
import json
import os
from pathlib import Path

import pytest

from metarag.llm.scripted import ScriptedLLM
from metarag.methods.registry import METHODS, build_method, method_settings
from metarag.methods.runner import Runtime, run
from metarag.records import Question, Trace, Usage, to_plain
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
QUESTION = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))

SCRIPTS = {
    "closed-book": [("Eiffel Tower born", "Paris.")],
    "cot": [("Eiffel Tower born", "The tower was designed by Gustave Eiffel's company. Eiffel was born in "
                                  "Dijon.\nSo the answer is: Dijon.")],
    "standard-rag": [("Passages:.*Eiffel", " Dijon\n")],
}


def without_latency(trace: Trace) -> dict:
    """The trace with wall-clock latencies zeroed: the only part that varies between runs."""
    steps = tuple(dataclasses.replace(s, usage=dataclasses.replace(s.usage, latency_s=0.0))
                  for s in trace.steps)
    return to_plain(dataclasses.replace(trace, steps=steps))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_golden_trace(name, corpus):
    trace = run(build_method(name), QUESTION, Runtime(ScriptedLLM(SCRIPTS[name]), MemoryRetriever(corpus)))
    got = without_latency(trace)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


# Methods with several branches keep their golden traces in a test module of their own.
OWN_GOLDEN_TESTS = {"metarag": "test_metarag.py", "sim-rag": "test_sim_rag.py", "evoctx": "test_evoctx.py",
                    "iterdrag": "test_evoctx.py", "sim-rag-practice": "test_sim_rag.py",
                    "react": "test_react.py", "flare": "test_flare.py",
                    "reflexion": "test_reflexion.py", "search-r1": "test_search_agent.py",
                    "belief-agent": "test_search_agent.py", "kirag": "test_kirag.py",
                    "adaptive-rag": "test_adaptive_rag.py",
                    "self-ask": "test_self_ask.py", "ircot": "test_ircot.py",
                    "dragin": "test_dragin.py", "dragin-entropy": "test_dragin.py",
                    "self-rag": "test_self_rag.py", "self-rag-prompted": "test_self_rag.py",
                    "search-o1": "test_released_agents.py", "r1-searcher": "test_released_agents.py",
                    "autorefine": "test_released_agents.py"}


def test_every_method_has_a_golden_trace():
    assert set(METHODS) <= set(SCRIPTS) | set(OWN_GOLDEN_TESTS)
    for name in set(METHODS) & set(OWN_GOLDEN_TESTS):
        assert list(GOLDEN.glob(f"{name}-*.json")), f"no golden traces for {name}"


def test_standard_rag_retrieves_k_and_answers_from_the_passages(corpus):
    llm = ScriptedLLM(SCRIPTS["standard-rag"])
    trace = run(build_method("standard-rag", {"k": 3}), QUESTION, Runtime(llm, MemoryRetriever(corpus)))
    retrieve = trace.steps[0]
    assert len(retrieve.hits) == 3 and trace.answer == "Dijon"
    prompt = llm.prompts[0]
    # passages come before the question so a prefix cache can reuse them
    assert prompt.index(retrieve.hits[0].passage.text) < prompt.index("Question: In which city")


def test_cot_extracts_the_answer_by_the_fixed_rule(corpus):
    trace = run(build_method("cot"), QUESTION, Runtime(ScriptedLLM(SCRIPTS["cot"]), None))
    assert trace.answer == "Dijon"
    assert trace.usage.retrieval_calls == 0


def test_settings_overrides_are_typed_and_unknown_names_fail():
    from metarag.errors import ConfigError

    assert method_settings("standard-rag", {"k": "7"}).k == 7
    with pytest.raises(ConfigError, match="no setting 'kk'.*did you mean k"):
        method_settings("standard-rag", {"kk": "7"})
    with pytest.raises(ConfigError, match="expects int"):
        method_settings("standard-rag", {"k": "seven"})
    with pytest.raises(ConfigError, match="unknown method 'standard_rag'.*did you mean standard-rag"):
        build_method("standard_rag")


def test_usage_adds_field_by_field():
    total = Usage(1, 2, 3, 0.5, 1, 0, 0) + Usage(10, 20, 0, 0.25, 1, 2, 1)
    assert total == Usage(11, 22, 3, 0.75, 2, 2, 1)
