"""The judges' verdict parsers on adversarial model output, and the LLM judges on scripted probabilities."""
import pytest

from metarag.judges.llm_judges import ExpertQA, ReasoningCheck, external_sufficiency, parse_reasoning_check
from metarag.judges.models import make_entailment, make_expert
from metarag.judges.similarity import AnswerSimilarity
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, drive
from metarag.parsing import first_json_object, parse_yes_no
from metarag.records import Generate, Score


@pytest.mark.parametrize("text, expected", [
    ("Yes", True), ("No.", False), ("**No**, the passages do not say.", False), ("yes - it is", True),
    ("I cannot say no", None), ("Not sure", None), ("", None), ("Maybe yes", None),
    ("Answer: No", False), ("Verdict: yes", True), ("The answer is not known; no idea", None),
    ("Nope", None), ("Yesterday it rained", None), ("noanswer", None),
])
def test_parse_yes_no_reads_only_a_verdict_in_its_place(text, expected):
    assert parse_yes_no(text) is expected


@pytest.mark.parametrize("text, error, feedback", [
    ("Error: none\nFeedback: none", "none", ""),
    ("Error: flawed logic\nFeedback: Dijon is not in Paris.", "flawed logic", "Dijon is not in Paris."),
    ("**Error:** Misaligned.\n**Feedback:** Give the year.", "misaligned", "Give the year."),
    ('Sure! Here is my check: {"error": "redundant", "feedback": "Drop the title."} Hope it helps {',
     "redundant", "Drop the title."),
    ('```json\n{"Error": "flawed_logic", "Feedback": "x"}\n```', "flawed logic", "x"),
    ("The answer looks fine to me.", None, ""),
    ("Error: the model is wrong\nFeedback: hmm", None, "hmm"),
    ("Error: No error", "none", ""),
])
def test_reasoning_check_parser_is_tolerant_but_not_credulous(text, error, feedback):
    assert parse_reasoning_check(text) == (error, feedback)


def test_first_json_object_skips_broken_braces():
    assert first_json_object('{broken} then {"a": {"b": "}"}} tail') == {"a": {"b": "}"}}
    assert first_json_object("no json here") is None


def test_unparseable_reasoning_check_falls_back_and_says_so():
    llm = ScriptedLLM([("Check the proposed answer", "I think it's probably fine?")])
    verdict, trace = drive(ReasoningCheck().judge({"question": "Q?", "passages": "[1] T\nx", "answer": "A"}),
                           Runtime(llm))
    assert verdict.verdict == "none" and verdict.fallback and "unparseable" in verdict.fallback
    [step] = trace.of_kind(Generate)  # the judge's one request is a step of the trace, named for the judge
    assert step.purpose == "reasoning-check" and step.text == "I think it's probably fine?"
    assert trace.usage.llm_requests == 1


def test_yes_no_judges_use_label_probabilities_not_text():
    llm = ScriptedLLM(label_rules=[("contain all the information", {"Yes": 0.2, "No": 0.6})])
    verdict, trace = drive(external_sufficiency().judge({"question": "Q?", "passages": "[1] T\nx"}), Runtime(llm))
    assert verdict.verdict == "insufficient" and verdict.score == pytest.approx(0.25)
    [step] = trace.of_kind(Score)
    assert step.purpose == "external-sufficiency" and step.labels == ("Yes", "No")
    assert "contain all the information" in step.prompt[-1].content


def test_yes_no_judge_with_no_label_mass_says_no_and_records_the_fallback():
    llm = ScriptedLLM(label_rules=[("contain all the information", {"Yes": 0.0, "No": 0.0})])
    verdict, _ = drive(external_sufficiency().judge({"question": "Q?", "passages": "[1] T\nx"}), Runtime(llm))
    assert verdict.verdict == "insufficient" and verdict.score is None  # never a silent "sufficient"
    assert "no probability mass" in verdict.fallback


def test_similarity_thresholds_inclusive_and_token_f1():
    judge = AnswerSimilarity(threshold=0.5, method="token-f1")
    assert judge.judge({"answer": "Paris France", "reference": "Paris"}).verdict == "accept"  # F1 2/3
    assert judge.judge({"answer": "Lyon", "reference": "Paris"}).verdict == "evaluate"
    assert judge.judge({"answer": "", "reference": "Paris"}).score == 0.0


def test_expert_reads_a_span_and_flags_an_empty_one():
    llm = ScriptedLLM([("Copy the shortest span", ["Dijon.", "   "])])
    inputs = {"question": "Where?", "passages": "[1] T\nDijon"}
    assert drive(ExpertQA().judge(inputs), Runtime(llm))[0].verdict == "Dijon"
    assert drive(ExpertQA().judge(inputs), Runtime(llm))[0].fallback == "empty expert answer"


def test_model_judges_by_path_refuse_a_folder_that_is_not_a_model(tmp_path):
    from metarag.errors import ConfigError, MetaRAGError

    with pytest.raises(MetaRAGError, match=str(tmp_path)):
        make_entailment(f"cross-encoder:{tmp_path}")
    with pytest.raises(ConfigError, match="not a model directory"):
        make_expert(f"qa:{tmp_path / 'missing'}")
    with pytest.raises(ConfigError, match="valid: llm"):
        make_entailment("t5-xxl")
