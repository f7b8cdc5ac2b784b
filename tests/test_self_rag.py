"""Self-RAG over a (scripted) Self-RAG checkpoint and the prompted variant: the retrieval decision,
per-passage segments scored by their reflection-token probabilities, the best segment kept."""
import importlib.util

import pytest
from conftest import CORPUS
from test_evoctx import check_golden

from metarag.llm.base import Decoding
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, run
from metarag.methods.self_rag import (
    SUPPORT,
    UTILITY,
    SelfRAG,
    SelfRAGPrompted,
    SelfRAGPromptedSettings,
    SelfRAGSettings,
    postprocess,
)
from metarag.records import Decide, Generate, Message, Question, Retrieve, Score
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
END = r"### Response:\n$"


def support(fully, partially, none):
    return dict(zip(SUPPORT, (fully, partially, none)))


def utility(*probs):
    return dict(zip(UTILITY, probs))


def checkpoint(p_retrieval=0.3, p_no_retrieval=0.7):
    """A scripted Self-RAG checkpoint: the top 3 passages for Q are p2 (Gustave Eiffel), p1 (Eiffel
    Tower), p3 (Dijon); the Dijon passage's segment is the best supported and most useful one."""
    segments = {  # title -> (segment the model writes, ISREL, ISSUP, ISUSE)
        "Gustave Eiffel": ("[Relevant]Dijon[Partially supported][Utility:4]", 0.9, support(0.2, 0.7, 0.1),
                           utility(0, 0, 0.1, 0.6, 0.3)),
        "Eiffel Tower": ("[Irrelevant]Paris[No support / Contradictory][Utility:2]", 0.2, support(0.1, 0.1, 0.8),
                         utility(0.2, 0.6, 0.2, 0, 0)),
        "Dijon": ("[Relevant]Dijon, France[Fully supported][Utility:5]", 0.8, support(0.9, 0.1, 0),
                  utility(0, 0, 0, 0.2, 0.8)),
    }
    rules, labels = [], [(END, {"[Retrieval]": p_retrieval, "[No Retrieval]": p_no_retrieval})]
    for title, (segment, rel, sup, use) in segments.items():
        at = r"<paragraph>" + title + r"\n[^<]*</paragraph>"
        rules.append((at + "$", segment))
        cut = min(segment.find(t) for t in SUPPORT if t in segment)
        labels += [(at + "$", {"[Relevant]": rel, "[Irrelevant]": 1 - rel}),
                   (at + _re(segment[:cut]) + "$", sup),
                   (at + _re(segment[:segment.index("[Utility")]) + "$", use)]
    rules.append((r"\[No Retrieval\]$", "Gustave Eiffel was born in Dijon."))
    return ScriptedLLM(rules, labels)


def _re(text):
    import re

    return re.escape(text)


def run_self_rag(method, llm):
    return run(method, Q, Runtime(llm, MemoryRetriever(list(CORPUS))))


def prompted(p_yes=0.6):
    """A scripted instruction model answering each reflection question by label probabilities."""
    labels = [(r"help you answer", {"Yes": p_yes, "No": 1 - p_yes}),
              (r"Gustave Eiffel\n.*Is the passage relevant", {"Relevant": 0.9, "Irrelevant": 0.1}),
              (r"Is the passage relevant", {"Relevant": 0.3, "Irrelevant": 0.7}),
              (r"Answer: Dijon\nIs the answer supported", {"Fully": 0.9, "Partially": 0.05, "No": 0.05}),
              (r"Is the answer supported", {"Fully": 0.1, "Partially": 0.1, "No": 0.8}),
              (r"Answer: Dijon\nRate", {"5": 0.7, "4": 0.3}),
              (r"Rate", {"2": 1.0})]
    rules = [(r"Gustave Eiffel\n.*Short answer:", "Dijon"), (r"Passage:.*Short answer:", "Paris"),
             (r"Short answer:", "Lyon")]
    return ScriptedLLM(rules, labels)


CASES = {
    "self-rag-no-retrieval": lambda: (SelfRAG(), checkpoint(0.1, 0.9)),
    "self-rag-retrieval": lambda: (SelfRAG(SelfRAGSettings(k=3)), checkpoint()),
    "self-rag-prompted-no-retrieval": lambda: (SelfRAGPrompted(), prompted(0.1)),
    "self-rag-prompted-retrieval": lambda: (SelfRAGPrompted(SelfRAGPromptedSettings(k=2)), prompted()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name):
    method, llm = CASES[name]()
    check_golden(name, run_self_rag(method, llm))


def test_no_retrieval_below_the_threshold_answers_after_the_no_retrieval_token():
    llm = checkpoint(0.1, 0.9)
    trace = run_self_rag(SelfRAG(), llm)
    assert trace.answer == "Gustave Eiffel was born in Dijon" and trace.usage.retrieval_calls == 0
    assert trace.of_kind(Decide)[0].choice == "no-retrieval"
    assert llm.prompts[-1].endswith("### Response:\n[No Retrieval]")


def test_the_decision_reads_the_normalized_retrieval_probability():
    # 0.15 / (0.15 + 0.5) = 0.23 > 0.2: retrieve, though [No Retrieval] is the likelier token
    trace = run_self_rag(SelfRAG(SelfRAGSettings(k=3)), checkpoint(0.15, 0.5))
    decide = trace.of_kind(Decide)[0]
    assert decide.choice == "retrieve" and decide.signals["p_retrieval"] == pytest.approx(0.15 / 0.65)
    # no mass on either token: 1/2 > δ, retrieve, and the fallback is recorded
    blank = run_self_rag(SelfRAG(SelfRAGSettings(k=3)), checkpoint(0.0, 0.0))
    assert blank.of_kind(Decide)[0].choice == "retrieve" and blank.of_kind(Decide)[0].signals["no_label_mass"] == 1


def test_retrieval_scores_every_passage_and_keeps_the_best_segment():
    trace = run_self_rag(SelfRAG(SelfRAGSettings(k=3)), checkpoint())
    assert trace.answer == "Dijon, France"  # the third passage's segment, not the first-ranked one's
    (search,) = trace.of_kind(Retrieve)
    assert [h.passage.title for h in search.hits] == ["Gustave Eiffel", "Eiffel Tower", "Dijon"]
    segments = {d.choice: d.signals for d in trace.of_kind(Decide) if d.name == "self-rag-segment"}
    first, third = segments["passage 1"], segments["passage 3"]
    assert first["relevance"] == pytest.approx(0.9) and first["support"] == pytest.approx(0.2 + 0.5 * 0.7)
    assert first["utility"] == pytest.approx(-0.0 * 0.1 + 0.5 * 0.6 + 1.0 * 0.3)
    seq = first["sequence"]  # every scripted token has log-prob -0.01
    assert first["score"] == pytest.approx(seq + 0.9 + 0.55 + 0.5 * 0.6)
    assert third["score"] > first["score"] > segments["passage 2"]["score"]
    assert [d.choice for d in trace.of_kind(Decide) if d.name == "self-rag-select"] == ["passage 3"]
    # each reflection is read where the checkpoint writes it: ISREL after </paragraph>, ISSUP after the answer
    probes = [s for s in trace.of_kind(Score)]
    assert [p.purpose for p in probes] == ["retrieve"] + ["isrel", "issup", "isuse"] * 3
    assert probes[2].prompt[0].content.endswith("</paragraph>[Relevant]Dijon")
    assert probes[3].prompt[0].content.endswith("[Relevant]Dijon[Partially supported]")


def test_weights_and_sequence_score_are_settings():
    plain = run_self_rag(SelfRAG(SelfRAGSettings(k=3, use_seqscore=False, w_sup=0.0, w_use=0.0)), checkpoint())
    # relevance alone: the Gustave Eiffel passage (0.9) beats the Dijon one (0.8)
    assert plain.answer == "Dijon"
    assert SelfRAGSettings().w_use == 0.5 and SelfRAGSettings().threshold == 0.2 and SelfRAGSettings().k == 5


def test_a_segment_without_critique_tokens_scores_zero_support_and_utility():
    llm = ScriptedLLM([(r"</paragraph>$", "[Relevant]Dijon")],
                      [(END, {"[Retrieval]": 1.0}), (r"</paragraph>$", {"[Relevant]": 1.0})])
    trace = run_self_rag(SelfRAG(SelfRAGSettings(k=1)), llm)
    (signals,) = [d.signals for d in trace.of_kind(Decide) if d.name == "self-rag-segment"]
    assert signals["support"] == 0 and signals["utility"] == 0 and trace.answer == "Dijon"
    assert [s.purpose for s in trace.of_kind(Score)] == ["retrieve", "isrel"]


def test_prompted_variant_asks_each_reflection_as_a_label_question():
    llm = prompted()
    trace = run_self_rag(SelfRAGPrompted(SelfRAGPromptedSettings(k=2)), llm)
    assert trace.answer == "Dijon"
    probes = trace.of_kind(Score)
    assert [(p.purpose, p.labels) for p in probes[:4]] == [
        ("retrieve", ("Yes", "No")), ("isrel", ("Relevant", "Irrelevant")),
        ("issup", ("Fully", "Partially", "No")), ("isuse", ("1", "2", "3", "4", "5"))]
    assert "Answer: Dijon" in probes[2].prompt[-1].content  # the support question judges the answer given
    assert [g.purpose for g in trace.of_kind(Generate)] == ["segment", "segment"]
    closed = run_self_rag(SelfRAGPrompted(), prompted(0.1))
    assert closed.answer == "Lyon" and closed.usage.retrieval_calls == 0


@pytest.mark.parametrize("raw, answer", [("[Relevant]Dijon[Fully supported][Utility:5]", "Dijon"),
                                         (": Paris.</s>", "Paris"), ("[No Retrieval]The\nanswer", "Theanswer")])
def test_postprocess_removes_the_reflection_tokens(raw, answer):
    assert postprocess(raw) == answer


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs llama-cpp-python and gguf")
def test_reflection_tokens_that_are_special_tokens_are_scored_and_read_through_llama_cpp(tmp_path):
    """Self-RAG's reflection tokens are added special tokens of its tokenizer: through a GGUF, a label
    must score as that one token and the output must spell it (revision 1 of the back-end tokenized
    labels as plain text and decoded without special tokens: near-zero label mass, empty text)."""
    import math

    from tiny_gguf import write_tiny_gguf

    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    path = tmp_path / "tiny-special.gguf"
    tokens = write_tiny_gguf(path, favour="[Relevant]", logit=0.2)
    llm = LlamaCppLLM(LlamaCppSettings(embedded=None, gguf=str(path), n_ctx=128, n_threads=1))
    favoured = math.exp(32 * 0.2) / (math.exp(32 * 0.2) + len(tokens) - 1)  # the one raised logit
    other = 1 / (math.exp(32 * 0.2) + len(tokens) - 1)
    prompt = (Message("raw", "Passage: Paris is in France."),)
    scores = llm.score_labels(prompt, ("[Relevant]", "[Irrelevant]"))
    assert scores.probs == pytest.approx((favoured, other), rel=1e-2)  # llama.cpp computes in part in f16
    out = llm.complete(prompt[0].content, Decoding(max_tokens=2))
    assert out.text == "[Relevant][Relevant]" and [t.token for t in out.tokens] == ["[Relevant]"] * 2
