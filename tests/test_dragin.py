"""DRAGIN and DRAGIN-entropy: RIND's trigger, QFS's query and the resumed generation, on scripted
models (golden traces), the refusal without attention weights, the attention signals on the tiny
transformers model, and one real-model run."""
import dataclasses
import importlib.util

import numpy as np
import pytest
from conftest import CORPUS
from test_evoctx import check_golden
from timing import growth, superlinear

from metarag.errors import ConfigError
from metarag.llm.base import Decoding, Internals
from metarag.llm.scripted import ScriptedLLM, ScriptedTokens
from metarag.methods.dragin import (
    DRAGIN,
    NEEDS_ATTENTION,
    STOPWORDS,
    DRAGINEntropy,
    DRAGINSettings,
    kept_tokens,
    output_words,
)
from metarag.methods.runner import Runtime, Sampling, run
from metarag.parsing import sentence_spans
from metarag.records import Decide, Generate, Question, Retrieve
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                 or importlib.util.find_spec("transformers") is None,
                                 reason="needs pip install 'metarag[hf]'")

# Scripted entropy is that of two outcomes (the token, everything else): at most ln 2 = 0.69 nats, so
# the scripted cases use θ = 0.5; " Lyon." at log-prob -0.7 has entropy 0.69, every other token 0.06.
THETA = 0.5
UNSURE = ScriptedTokens.of("The", " tower", " was", " built", " by", " Gustave", " Eiffel.", " He", " was", " born",
                           " in", (" Lyon.", -0.7), " So", " the", " answer", " is", " Lyon.")
SURE = "Gustave Eiffel was born in Dijon. So the answer is Dijon."
RESUMED = "He was born in Dijon. He built many bridges."
AFTER = "So the answer is Dijon."


class AttentiveLLM(ScriptedLLM):
    """The scripted LLM with one layer, one head of attention weights when a request asks: every
    position attends uniformly to itself and the positions before it, plus `boost` times as much to
    each earlier output token whose text holds one of the `focus` strings."""

    provides = ScriptedLLM.provides | {"attentions"}

    def __init__(self, *args, focus=(), boost=400.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.focus, self.boost = tuple(focus), boost

    def complete(self, prompt, decoding=Decoding()):
        out = super().complete(prompt, decoding)
        if not decoding.attentions:
            return out
        n = len(out.prompt_ids)
        ids = tuple(out.prompt_ids) + tuple(t.id for t in out.tokens)
        weight = np.ones(len(ids))
        for k, token in enumerate(out.tokens):
            if any(f in token.token for f in self.focus):
                weight[n + k] += self.boost
        causal = np.tril(np.ones((len(ids), len(ids)))) * weight
        attention = causal / causal.sum(axis=1, keepdims=True)
        return dataclasses.replace(out, internals=Internals(ids, n, (attention[None],)))


def script(first, scripted=ScriptedLLM, **kwargs):
    return scripted([("Context:", RESUMED), ("Gustave Eiffel. He was born in Dijon.$", AFTER),
                     ("Question: In which city", first)], **kwargs)


def run_dragin(method, llm):
    return run(method, Q, Runtime(llm, MemoryRetriever(list(CORPUS))))


CASES = {
    "dragin-entropy-no-trigger": lambda: (DRAGINEntropy(DRAGINSettings(threshold=THETA)), script(SURE)),
    "dragin-entropy-trigger": lambda: (DRAGINEntropy(DRAGINSettings(threshold=THETA)), script(UNSURE)),
    "dragin-no-trigger": lambda: (DRAGIN(DRAGINSettings(threshold=THETA)), script(SURE, AttentiveLLM)),
    "dragin-trigger": lambda: (DRAGIN(DRAGINSettings(threshold=THETA, query_words=2)),
                               script(UNSURE, AttentiveLLM, focus=("Gustave", "Eiffel"))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name):
    method, llm = CASES[name]()
    check_golden(name, run_dragin(method, llm))


@pytest.mark.parametrize("method", [DRAGINEntropy(DRAGINSettings(threshold=THETA)),
                                    DRAGIN(DRAGINSettings(threshold=THETA))])
def test_no_trigger_answers_from_one_generation(method):
    trace = run_dragin(method, script(SURE, AttentiveLLM))
    assert trace.answer == "Dijon" and trace.usage.retrieval_calls == 0
    assert [d.choice for d in trace.of_kind(Decide)] == ["none"]
    assert [g.purpose for g in trace.of_kind(Generate)] == ["generate"]


def test_a_trigger_retrieves_with_the_masked_sentence_and_resumes_before_it():
    llm = script(UNSURE)
    trace = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA)), llm)
    assert trace.error is None and trace.answer == "Dijon"
    decide = trace.of_kind(Decide)[0]
    assert decide.choice == "retrieve" and decide.signals["sentence"] == 1 and decide.signals["hits"] == 1
    (search,) = trace.of_kind(Retrieve)
    assert search.query == "He was born in" and search.k == 3  # "Lyon." masked
    resumed = [g for g in trace.of_kind(Generate) if g.purpose == "generate-with-passages"][0]
    # passages in, the answer cut before the triggering sentence and continued from there
    assert "Context:\n[1] Gustave Eiffel" in resumed.prompt[1].content
    assert resumed.prompt[-1].content == "Answer: The tower was built by Gustave Eiffel."
    # only the resumed output's first sentence joins; the next round continues the grown answer
    last = trace.of_kind(Generate)[-1]
    assert last.prompt[-1].content == "Answer: The tower was built by Gustave Eiffel. He was born in Dijon."
    assert "bridges" not in last.prompt[-1].content and "Context:" not in last.prompt[1].content


def test_attention_picks_the_query_words_and_keeps_the_question():
    trace = run_dragin(DRAGIN(DRAGINSettings(threshold=THETA, query_words=2)),
                       script(UNSURE, AttentiveLLM, focus=("Gustave", "Eiffel")))
    (search,) = trace.of_kind(Retrieve)
    assert search.query == f"{Q.text} Gustave Eiffel"
    # without a focus every earlier word is paid the same: the first real words win the ties
    plain = run_dragin(DRAGIN(DRAGINSettings(threshold=THETA, query_words=2)), script(UNSURE, AttentiveLLM))
    assert plain.of_kind(Retrieve)[0].query == f"{Q.text} tower built"


def test_attention_can_silence_an_uncertain_word_that_entropy_alone_flags():
    # every later token attends to "born": "Lyon." gets little of the sentence's attention
    quiet = run_dragin(DRAGIN(DRAGINSettings(threshold=THETA)), script(UNSURE, AttentiveLLM, focus=("born",)))
    assert quiet.usage.retrieval_calls == 0 and quiet.answer == "Lyon"
    loud = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA)), script(UNSURE))
    assert loud.usage.retrieval_calls == 1


def test_a_stopword_never_triggers():
    tokens = ScriptedTokens.of("Gustave", " Eiffel", (" was", -0.7), " born", " in", " Dijon.", " So", " the",
                               " answer", " is", " Dijon.")
    trace = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA)), script(tokens))
    assert trace.usage.retrieval_calls == 0 and "was" in STOPWORDS


def test_dragin_refuses_a_back_end_without_attention_in_one_line():
    llm = script(SURE)
    llm.provides = None  # a back-end that declares nothing passes the start-up check: the policy's own check fires
    trace = run_dragin(DRAGIN(), llm)
    assert trace.error == f"ConfigError: {NEEDS_ATTENTION}" and "\n" not in trace.error
    assert "--llm hf" in trace.error and "dragin-entropy" in trace.error
    assert not trace.of_kind(Retrieve) and trace.answer is None


def test_the_length_budget_ends_the_answer():
    # no "the answer is": each round adds a confident sentence until 100 tokens pass (4 x 30 words)
    sentence = " ".join(["word"] * 29) + " end."
    llm = ScriptedLLM([("Question: In which city", sentence)])
    trace = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA, force_answer=False)), llm)
    assert len(trace.of_kind(Generate)) == 4 and trace.usage.retrieval_calls == 0


def test_a_chain_without_the_answer_is_forced_to_one_as_the_authors_evaluation_does():
    """src/eval.py's regenerate_answer: the chain, " So the answer is", 20 more tokens, no passages."""
    sentence = "The tower was built by the engineer Gustave Eiffel, who was born in Dijon."
    llm = ScriptedLLM([("So the answer is$", " Dijon.\nMore text"), ("Question: In which city", sentence)])
    trace = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA)), llm)
    asks = trace.of_kind(Generate)
    assert asks[-1].purpose == "force-answer" and asks[-1].prompt[-1].content.endswith("So the answer is")
    assert "Context:" not in asks[-1].prompt[1].content  # no passages, as the authors' prompt
    assert trace.answer == "Dijon"
    # off: the answer is read from the chain alone, a whole sentence (what the issue found scored EM 0)
    old = run_dragin(DRAGINEntropy(DRAGINSettings(threshold=THETA, force_answer=False)),
                     ScriptedLLM([("Question: In which city", sentence)]))
    assert old.answer != "Dijon" and not any(g.purpose == "force-answer" for g in old.of_kind(Generate))


def test_defaults_are_the_hotpotqa_config():
    s = DRAGINSettings()
    assert (s.threshold, s.k, s.query_words, s.generate_max_length) == (0.8, 3, 35, 100)


def test_words_own_the_tokens_that_start_in_them():
    out = ScriptedLLM([("x", "Gustave Eiffel. He")]).complete("x", Decoding(keep_tokens=True))
    words = output_words(out.text, kept_tokens(out))
    assert [(w.text, w.core, w.tokens) for w in words] == [("Gustave", "Gustave", (0,)), ("Eiffel.", "Eiffel", (1,)),
                                                          ("He", "He", (2,))]


@pytest.mark.parametrize("text, sentences", [
    ("Gustave Eiffel was born in Dijon. So the answer is no.", ["Gustave Eiffel was born in Dijon.",
                                                                "So the answer is no."]),
    ("J. R. R. Tolkien wrote it. Dr. Who? Yes!\nNext line", ["J. R. R. Tolkien wrote it.", "Dr. Who?", "Yes!",
                                                             "Next line"]),
    ("It cost 3.5 dollars in the U.S. in Jan. 1990.", ["It cost 3.5 dollars in the U.S. in Jan. 1990."]),
    ("1. First one. 2. Second", ["1. First one.", "2. Second"]),
    ("  \n ", []),
])
def test_sentence_spans(text, sentences):
    assert [text[a:b] for a, b in sentence_spans(text)] == sentences


@pytest.mark.parametrize("piece", ["Dr. ", "1. ", "J. ", ". ", "\n", "a.", "x" * 40 + ". "])
def test_sentence_spans_take_linear_time(piece):
    # 12 KB and 120 KB of each ("Dr. " repeated: every period skipped, one sentence); a quadratic rule
    # takes minutes on the larger one
    small, large = growth(sentence_spans, piece * (12_000 // len(piece)), piece * (120_000 // len(piece)))
    assert not superlinear(small, large), f"{small:.4f} s on 12 KB, {large} s on 120 KB"


# ------------------------------------------------------------------------ transformers (tiny model)
@pytest.fixture(scope="module")
def tiny():
    from tiny_hf import tiny_llm

    return tiny_llm()


@needs_torch
def test_later_attention_is_the_max_over_later_output_tokens_then_the_head_mean(tiny):
    method = DRAGIN(DRAGINSettings(exemplars=0))
    out = tiny.chat(method.prompt("Who built the tower?", "", ()),
                    Decoding(max_tokens=8, attentions=True, temperature=1.0, seed=3))
    tokens = kept_tokens(out)
    first = out.internals.n_prompt
    assert out.internals.token_ids[first:first + len(tokens)] == tuple(t.id for t in tokens)
    got = method.later_attention(out, len(tokens))
    last = out.internals.attentions[-1]
    want = [np.mean([max((last[h, first + j, first + k] for j in range(k + 1, len(tokens))), default=0.0)
                     for h in range(last.shape[0])]) for k in range(len(tokens))]
    assert np.allclose(got, want) and got[-1] == 0 and got[:-1].max() > 0


@needs_torch
def test_dragin_on_the_tiny_transformers_model_triggers_and_resumes(tiny, corpus):
    # threshold 0: any real word triggers; sampled so the random model writes words, not one repeated piece
    method = DRAGIN(DRAGINSettings(threshold=0.0, generate_max_length=10, max_rounds=1, exemplars=0))
    trace = run(method, Q, Runtime(tiny, MemoryRetriever(corpus), sampling=Sampling(temperature=1.0, seed=1)))
    assert trace.error is None
    assert [d.choice for d in trace.of_kind(Decide)] == ["retrieve"]
    (search,) = trace.of_kind(Retrieve)
    assert search.query.startswith(Q.text) and len(search.hits) == 3
    assert [g.purpose for g in trace.of_kind(Generate)][:2] == ["generate", "generate-with-passages"]


# --------------------------------------------------------------------------------- real models
@pytest.mark.embedded
def test_dragin_entropy_and_self_rag_prompted_on_two_demo_questions_with_the_real_model():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs pip install 'metarag[embedded]'")
    from metarag.data.datasets import resolve_preset
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.methods.self_rag import SelfRAGPrompted, SelfRAGPromptedSettings
    from metarag.retrieve.index import open_bm25

    dataset = resolve_preset("demo")
    retriever = open_bm25(list(dataset.passages))
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))
    methods = (DRAGINEntropy(DRAGINSettings(generate_max_length=24, max_rounds=1, exemplars=1)),
               SelfRAGPrompted(SelfRAGPromptedSettings(k=1, max_tokens=8)))
    for method in methods:
        for question in dataset.questions[:2]:
            trace = run(method, question, Runtime(llm, retriever))
            assert trace.error is None and trace.answer, (method.name, trace.error)
            decisions = trace.of_kind(Decide)
            if method.name == "dragin-entropy":
                assert {d.choice for d in decisions} <= {"none", "retrieve"}
                assert trace.usage.retrieval_calls == sum(d.choice == "retrieve" for d in decisions)
                assert all(t.entropy is not None for g in trace.of_kind(Generate) if g.purpose != "force-answer"
                               for t in g.logprobs)
            else:
                assert decisions[0].name == "self-rag-retrieve"
                assert 0 <= decisions[0].signals["p_retrieval"] <= 1


def test_dragin_is_refused_before_the_first_question_on_a_back_end_without_attention(tmp_path):
    # the harness checks the method's needs against the back-end's `provides`: no question is asked
    from test_harness import write_hotpot

    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
    from metarag.methods.flare import FLARE
    from metarag.methods.runner import check_needs

    llm = ScriptedLLM(default="Paris")
    with pytest.raises(ConfigError, match=r"dragin needs attention weights.*dragin-entropy.*back-end: scripted"):
        check_needs(DRAGIN(), llm)
    check_needs(DRAGINEntropy(), llm)  # entropy alone: the scripted back-end has it
    server_like = type("Server", (), {"provides": frozenset({"token_logprobs"}), "identity": "openai:m@u"})()
    with pytest.raises(ConfigError, match="dragin-entropy needs each generated token's entropy"):
        check_needs(DRAGINEntropy(), server_like)
    check_needs(FLARE(), server_like)
    with pytest.raises(ConfigError, match="flare needs per-token probabilities"):
        check_needs(FLARE(), type("Bare", (), {"provides": frozenset(), "identity": "x"})())
    cfg = EvalConfig(method="dragin", dataset=DatasetSpec(file=str(write_hotpot(tmp_path / "h.json"))),
                     runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="dragin needs attention weights"):
        evaluate(cfg, progress=False, llm=llm)
    assert llm.prompts == []
