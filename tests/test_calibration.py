"""Judge threshold calibration on training questions (issue 13) and the breakdown's degenerate flag."""
import json

import pytest
from test_harness import CITIES, write_hotpot

from metarag.cli import main
from metarag.errors import ConfigError
from metarag.evaluate.calibration import (
    Sample,
    balanced_accuracy,
    calibrate,
    judge_samples,
)
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.evaluate.report import breakdown, load_run
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.metarag import MetaRAGSettings
from metarag.records import Hit, Judge, Passage, Question, Retrieve, Trace, Usage


def hit(pid: str) -> Hit:
    return Hit(Passage(pid, pid, "text"), 1.0, "bm25")


def trace(qid: str, retrieved: list[str], external: float, internal: float | None = None) -> Trace:
    steps = [Retrieve(Usage(), "q", 2, tuple(hit(p) for p in retrieved))]
    if internal is not None:
        steps.append(Judge(Usage(), "internal-sufficiency", "sufficient" if internal >= 0.5 else "insufficient",
                           internal))
    steps.append(Judge(Usage(), "external-sufficiency", "sufficient" if external >= 0.5 else "insufficient", external))
    return Trace(qid, "q", "metarag", tuple(steps), answer="a")


QUESTIONS = {f"q{i}": Question(f"q{i}", "?", ("a",), supporting_ids=(f"s{i}", f"t{i}")) for i in range(4)}


def test_external_target_is_every_supporting_passage_retrieved_before_the_check():
    traces = [trace("q0", ["s0", "t0"], 0.9), trace("q1", ["s1", "x"], 0.8),
              Trace("q2", "?", "metarag", (Judge(Usage(), "external-sufficiency", "sufficient", 0.7),
                                           Retrieve(Usage(), "q", 2, (hit("s2"), hit("t2"))))),
              Trace("q3", "?", "metarag", error="boom")]
    samples = judge_samples(traces, QUESTIONS)
    # q2's check came before its passages: the evidence it judged held no supporting passage
    assert samples == [Sample("external-sufficiency", 0.9, True), Sample("external-sufficiency", 0.8, False),
                       Sample("external-sufficiency", 0.7, False)]


def test_internal_target_needs_the_closed_book_run():
    traces = [trace("q0", ["s0"], 0.9, internal=0.95), trace("q1", ["s1"], 0.9, internal=0.6)]
    assert [s.judge for s in judge_samples(traces, QUESTIONS)] == ["external-sufficiency"] * 2
    samples = judge_samples(traces, QUESTIONS, {"q0": 1.0, "q1": 0.0})
    assert [(s.judge, s.target) for s in samples if s.judge == "internal-sufficiency"] == [
        ("internal-sufficiency", True), ("internal-sufficiency", False)]


def test_a_judge_that_always_says_yes_gets_a_threshold_that_separates_the_classes():
    # every P(Yes) >= 0.5 (all "sufficient" at the paper's rule), but the true cases score higher
    samples = [Sample("external-sufficiency", p, t) for p, t in
               [(0.97, True), (0.95, True), (0.93, False), (0.9, True), (0.8, False), (0.7, False)]]
    assert balanced_accuracy(samples, 0.5) == 0.5
    c = calibrate(samples, "external-sufficiency")
    assert c.yes_share_rule == 1.0 and c.balanced_rule == 0.5
    assert c.threshold == pytest.approx(0.85)  # midpoint of 0.8 and 0.9: recall 1 on yes, 2/3 on no
    assert c.balanced == pytest.approx((1 + 2 / 3) / 2)
    assert c.yes_share == pytest.approx(4 / 6)


def test_ties_keep_the_paper_rule_and_one_class_is_said_not_guessed():
    separable = [Sample("j", 0.9, True), Sample("j", 0.2, False)]
    assert calibrate(separable, "j").threshold == 0.5  # every threshold in (0.2, 0.9] ties: 0.5 is nearest
    one_class = [Sample("j", 0.9, True), Sample("j", 0.8, True)]
    c = calibrate(one_class, "j")
    assert c.threshold == 0.5 and "one target class" in c.note
    with pytest.raises(ConfigError, match="no internal-sufficiency checks"):
        calibrate([], "internal-sufficiency")


def test_evaluation_splits_are_refused_unless_forced(tmp_path, capsys):
    data = write_hotpot(tmp_path / "capitals_dev.json")
    cfg = EvalConfig(method="metarag", dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"),
                     overrides={"similarity": "token-f1", "max_iter": 1})
    store, _ = evaluate(cfg, progress=False, llm=scripted_metarag())
    assert main(["calibrate-judges", str(store.path)]) == 1
    assert "is not named as a training split" in capsys.readouterr().err
    assert main(["calibrate-judges", str(store.path), "--allow-any"]) == 0


def test_thresholds_are_metarag_settings_with_the_paper_rule_as_default():
    assert MetaRAGSettings().external_threshold == 0.5 and MetaRAGSettings().internal_threshold == 0.5
    with pytest.raises(ConfigError):
        MetaRAGSettings(external_threshold=1.5)


def scripted_metarag() -> ScriptedLLM:
    # the expert disagrees with the reasoner, so the monitor rejects and the judges run; they lean "Yes"
    def reason(prompt: str) -> str:
        for city in CITIES:
            if f"Its capital is {city}." in prompt:
                return f"It says so.\nAnswer: {city}"
        return "Unknown.\nAnswer: Paris"
    return ScriptedLLM([("Think step by step", reason), ("Copy the shortest span", "Nowhere")],
                       [("Its capital is.*contain all the information", {"Yes": 0.9, "No": 0.1}),
                        ("contain all the information", {"Yes": 0.6, "No": 0.4}),
                        ("own knowledge", {"Yes": 0.8, "No": 0.2}),
                        ("entail the claim", {"Yes": 0.9, "No": 0.1})], default="none")


def test_calibrate_judges_cli_on_a_training_run(tmp_path, capsys):
    data = write_hotpot(tmp_path / "capitals_train.json")
    cfg = EvalConfig(method="metarag", dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"),
                     overrides={"similarity": "token-f1", "max_iter": 1})
    store, results = evaluate(cfg, progress=False, llm=scripted_metarag())
    assert len(results) == 6
    out = tmp_path / "t.json"
    assert main(["calibrate-judges", str(store.path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| external-sufficiency |" in printed and "--set external_threshold=" in printed
    assert set(json.loads(out.read_text())) == {"external_threshold"}
    assert main(["calibrate-judges", str(tmp_path)]) == 1
    assert "is not a run folder" in capsys.readouterr().err
    text = breakdown(load_run(store.path))
    # every check said "sufficient" (P(Yes) >= 0.6): the breakdown flags the judge
    assert "| judge | external-sufficiency | sufficient | 6 | 100.0 | degenerate: one verdict >= 95 % |" in text
