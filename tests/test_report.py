"""The report's table: rows told apart by their settings, intervals, answer form, tests by metric type, Holm,
power."""
import pytest


def test_rows_of_one_method_name_the_settings_they_differ_in_an_older_run_reading_as_the_default():
    from types import SimpleNamespace

    from metarag.evaluate.report import tell_apart

    def run(method, **values):
        return SimpleNamespace(settings={"method": method, "method_settings": values})

    # the first run predates the thresholds: it ran at their default, 0.5
    runs = [run("metarag", k=5), run("metarag", k=5, internal_threshold=0.6, external_threshold=0.5),
            run("no-such-method", k=1), run("no-such-method", k=1, extra=2), run("standard-rag", k=5)]
    rows = [{"method": r.settings["method"]} for r in runs]
    tell_apart(rows, runs)
    assert [r["method"] for r in rows] == ["metarag (internal_threshold=0.5)", "metarag (internal_threshold=0.6)",
                                           "no-such-method (extra=–)", "no-such-method (extra=2)", "standard-rag"]


def test_adaptive_rag_rows_name_the_router_that_routed_them():
    from metarag.evaluate.report import method_label

    assert method_label({"method": "adaptive-rag", "method_settings": {"classifier": "llm", "route": "auto"}}) == \
        "adaptive-rag (LLM classifier)"
    assert method_label({"method": "adaptive-rag",
                         "method_settings": {"classifier": "/x/routers/hotpot", "route": "auto"}}) == \
        "adaptive-rag (router hotpot)"
    assert method_label({"method": "adaptive-rag", "method_settings": {"classifier": "llm", "route": "B"}}) == \
        "adaptive-rag (route B)"
    assert method_label({"method": "ircot", "method_settings": {"k": 6}}) == "ircot"


def test_rows_of_two_revisions_name_the_revision_and_the_older_ones_settings_are_not_read_as_todays():
    from types import SimpleNamespace

    from metarag.evaluate.report import tell_apart

    old = SimpleNamespace(settings={"method": "dragin", "method_settings": {"k": 3}})
    new = SimpleNamespace(settings={"method": "dragin", "method_settings": {"k": 3, "force_answer": True},
                                    "method_revision": 2})
    rows = [{"method": "dragin"}, {"method": "dragin"}]
    tell_apart(rows, [old, new])
    assert [r["method"] for r in rows] == ["dragin (force_answer=–, rev=1)", "dragin (force_answer=True, rev=2)"]


def test_the_answers_a_change_moved_are_counted_each_way():
    from types import SimpleNamespace

    from metarag.evaluate.report import answer_changes

    def result(qid, prediction, em, acc):
        return SimpleNamespace(question_id=qid, prediction=prediction, scores=SimpleNamespace(em=em, acc=acc))

    # gold "Rome" for b: "the answer is Rome" contains it (cover-EM 1) but is no exact match; "Rome" is both,
    # so b changed only in form. d: "x" was right, "y" is wrong on both.
    base = SimpleNamespace(name="old", results=(result("a", "Paris", 1.0, 1.0),
                                                result("b", "the answer is Rome", 0.0, 1.0),
                                                result("c", "Oslo", 0.0, 0.0), result("d", "x", 1.0, 1.0)))
    run = SimpleNamespace(name="new", results=(result("a", "Paris", 1.0, 1.0), result("b", "Rome", 1.0, 1.0),
                                               result("c", "Bergen", 0.0, 0.0), result("d", "y", 0.0, 0.0)))
    table = answer_changes([base, run])
    assert "| new | 4 | 3 | 1 | 1 | +0.00 | 1 | 0 | 0 | 1 |" in table


# ------------------------------------------------------------------ issue 50: intervals, form, tests by type
def _two_runs(tmp_path):
    from test_harness import config, reader

    from metarag.evaluate.harness import evaluate
    from metarag.evaluate.report import load_run
    from metarag.llm.scripted import ScriptedLLM

    good, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    # answers in sentence form: cover-EM right where the reader is, EM never
    wordy = ScriptedLLM([("Passages:", lambda p: "The answer is " + __import__("test_harness").answer_from_prompt(p))])
    bad, _ = evaluate(config(tmp_path, method="standard-rag", overrides={"k": "4"}), progress=False, llm=wordy)
    return load_run(good.path), load_run(bad.path)


def test_the_default_table_and_csv_carry_intervals_and_answer_form(tmp_path):
    import csv

    from metarag.cli import main

    base, wordy = _two_runs(tmp_path)
    assert main(["report", str(base.path), str(wordy.path), "--csv", str(tmp_path / "r.csv"), "--power",
                 "--changes"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert rows[1]["EM"] == "0.0" and rows[1]["cover-EM"] == "100.0"
    assert float(rows[1]["words/answer"]) == 4.0 and float(rows[0]["words/answer"]) == 1.0
    assert float(rows[0]["EM lo"]) == pytest.approx(100 * 0.6097, abs=0.1)  # Wilson 6 of 6
    for column in ("EM", "cover-EM", "F1", "yes/no", "words/answer"):
        assert f"{column} lo" in rows[0] and f"{column} hi" in rows[0]
    assert rows[1]["p EM (McNemar)"] == rows[1]["p EM (Holm)"] == str(2 / 64)
    assert rows[1]["Δ F1 lo"] and rows[1]["p F1 (permutation)"]


def test_report_prints_the_columns_the_tests_and_what_the_sample_could_detect(tmp_path, capsys):
    from metarag.cli import main

    base, wordy = _two_runs(tmp_path)
    assert main(["report", str(base.path), str(wordy.path), "--power", "--changes"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| method"))
    for column in ("EM", "cover-EM", "F1", "words/answer", "yes/no", "p EM (McNemar)", "p EM (Holm)",
                   "p F1 (permutation)", "Δ F1"):
        assert f"| {column} |" in header
    assert "| 100.0 (61.0–100.0) |" in out and "| 0.0 (0.0–39.0)* |" in out  # Wilson, starred by Holm p
    assert "Power on EM against" in out and "| 6 | 6 (0 / 6) | -100.0 |" in out
    # the power table names each run as the table's rows do (its method, told apart), not by its folder
    power_row = next(line for line in out.splitlines() if "| 6 | 6 (0 / 6) |" in line)
    table_row = next(line for line in out.splitlines() if line.startswith("| ") and "0.0 (0.0–39.0)*" in line)
    assert power_row.split(" | ")[0] == table_row.split(" | ")[0] and wordy.path.name not in power_row
    # all six changed only in form: cover-EM unchanged, EM lost
    assert "| 6 | 6 | 0 | 6 | -100.00 | 0 | 6 | 0 | 0 |" in out
    assert not (tmp_path / "report.csv").exists()  # a CSV only when asked


def test_holm_marks_only_what_survives_the_correction(tmp_path):
    from types import SimpleNamespace

    from metarag.evaluate.report import compare

    def run(name, ems):
        results = tuple(SimpleNamespace(question_id=f"q{i}", scores=SimpleNamespace(em=e, acc=e, f1=e))
                        for i, e in enumerate(ems))
        return SimpleNamespace(name=name, question_ids=tuple(r.question_id for r in results), results=results,
                               complete=True)

    base = run("base", [0] * 12)
    # 6 of 12 gained: raw p = 2 / 64 = 0.03125 each; Holm over two comparisons: 0.0625 and 0.0625
    runs = [base, run("a", [1] * 6 + [0] * 6), run("b", [1] * 6 + [0] * 6)]
    rows = [{}, {}, {}]
    compare(rows, runs, 0, ("auto",))
    assert rows[1]["p EM (McNemar)"] == pytest.approx(0.03125)
    assert rows[1]["p EM (Holm)"] == pytest.approx(0.0625) and rows[1]["EM*"] == ""
    rows = [{}, {}]
    compare(rows, runs[:2], 0, ("auto",))  # alone, the same comparison survives
    assert rows[1]["EM*"] == "*"


def test_p_values_keep_two_significant_digits_and_never_round_onto_the_line():
    from metarag.evaluate.report import format_p

    assert [format_p(p) for p in (0.75, 0.1, 0.0078, 0.0625, 0.0469, 0.0499, 0.05, 1.0)] == \
        ["0.75", "0.10", "0.0078", "0.062", "0.047", "0.0499", "0.05", "1.00"]


def _scored_run(name: str, method: str, right: set[int], n: int = 100, done: int | None = None):
    """A run of `method` over questions q0..q{n-1}, right (EM 1) on the indices in `right`; `done`: only the
    first `done` questions finished."""
    from pathlib import Path

    from metarag.data.datasets import Question
    from metarag.evaluate.harness import score
    from metarag.evaluate.summary import LoadedRun
    from metarag.methods.runner import Answer, Trace, Usage

    ids = tuple(f"q{i}" for i in range(n))
    results = tuple(score(Question(q, f"{q}?", ("gold",)), Trace(q, f"{q}?", method, (Answer(Usage(), "x"),),
                                                                    answer="gold" if i in right else "other"))
                    for i, q in enumerate(ids[:done]))
    return LoadedRun(name, Path(name), {"method": method}, {}, ids, results)


def test_a_claims_verdict_follows_the_holm_adjusted_mcnemar_tests_of_the_table():
    from metarag.evaluate.paired import verdict
    from metarag.evaluate.report import report_table

    reference = _scored_run("ref", "metarag", set(range(60)))
    weaker = _scored_run("a", "standard-rag", set(range(30)))           # the reference alone right on 30
    level = _scored_run("b", "ircot", set(range(2, 62)))                 # 2 each way: no difference
    stronger = _scored_run("c", "self-ask", set(range(100)))            # the row alone right on 40
    runs = [weaker, reference, level, stronger]
    text = verdict(runs, 1, [0, 2], dataset="d")
    assert "**partly reproduced**" in text and "provisional" not in text
    assert ("- beats standard-rag: Δ EM +30.0 points on 100 questions (reference right alone on 30, the row alone "
            "on 0)") in text
    assert "- no significant difference from ircot: Δ EM +0.0" in text and "detectable at 80 % power: ±" in text
    # the Holm p of the verdict is the table's: one family, every comparison against the reference
    _, rows = report_table(runs, baseline=1, ci="none")
    assert f"Holm {rows[2]['p EM (Holm)']:.2f}" in text
    assert "**reproduced**" in verdict(runs, 1, [0])
    assert "**refuted**" in verdict(runs, 1, [0, 3]) and "- loses to self-ask: Δ EM -40.0" in verdict(runs, 1, [0, 3])
    assert "**inconclusive at this power**" in verdict(runs, 1, [2])
    running = [reference, _scored_run("a", "standard-rag", set(range(30)), done=50)]
    partial = verdict(running, 0, [1], missing=["self-ask"])
    assert "— provisional: still running: standard-rag; not run yet: self-ask" in partial
    assert "on 50 questions" in partial and "- self-ask: no run yet" in partial


def test_a_verdict_names_runs_of_one_method_as_it_is_told():
    from metarag.errors import ConfigError
    from metarag.evaluate.paired import verdict

    # a trained checkpoint against another and the untrained model: three runs of one method
    runs = [_scored_run("u", "belief-agent", set(range(20))), _scored_run("o", "belief-agent", set(range(30))),
            _scored_run("b", "belief-agent", set(range(60)))]
    text = verdict(runs, 2, [1], dataset="d", names=["untrained", "pool-outcome", "pool-belief"])
    assert "(EM; pool-belief against the rows" in text and "**reproduced**" in text
    assert "- beats pool-outcome: Δ EM +30.0 points on 100 questions" in text
    assert "Holm over the table's 2 comparisons" in text  # the untrained run is in the family, not claimed
    with pytest.raises(ConfigError, match="2 names for 3 runs"):
        verdict(runs, 2, [1], names=["a", "b"])


def test_rows_of_one_method_are_told_apart_by_model_then_by_run_folder():
    from metarag.evaluate.report import distinct_names

    rows = [{"method": "closed-book", "model": "q", "run": "r0"},
            {"method": "belief-agent", "model": "q", "run": "r1"},
            {"method": "belief-agent", "model": "q+lora:1d4c1030", "run": "r2"},
            {"method": "belief-agent", "model": "q+lora:1d4c1030", "run": "r3"}]
    assert distinct_names(rows) == ["closed-book", "belief-agent (q)", "belief-agent (q+lora:1d4c1030) [r2]",
                                    "belief-agent (q+lora:1d4c1030) [r3]"]


def test_a_llama_cpp_model_with_an_adapter_is_named_apart_from_its_base():
    from metarag.evaluate.cost import model_name, price_for

    base = "llama.cpp:qwen2.5-coder-1.5b-instruct:sha256=cc324af070c2ecbf"
    assert model_name(base) == "qwen2.5-coder-1.5b-instruct"
    assert model_name(base + ":lora=1d4c1030a4712f31") == "qwen2.5-coder-1.5b-instruct+lora:1d4c1030"
    assert price_for(base + ":lora=1d4c1030a4712f31").input_per_1m == 0.0  # still a local model


def test_an_experiment_prints_the_verdict_on_its_claim_and_refuses_a_claim_without_its_row():
    from metarag.errors import ConfigError
    from metarag.evaluate.experiment import experiment_from_dict

    rows = [{"method": "standard-rag"}, {"method": "metarag"}]
    good = experiment_from_dict({"name": "t", "datasets": ["d"], "reference": "metarag", "claim": ["standard-rag"],
                                 "rows": rows})
    assert good.claim == ("standard-rag",)
    for claim, message in ((["ircot"], "claim 'ircot' is none of the rows"), (["metarag"], "but the reference"),
                           ("standard-rag", "claim must be a list")):
        with pytest.raises(ConfigError, match=message):
            experiment_from_dict({"name": "t", "datasets": ["d"], "reference": "metarag", "claim": claim, "rows": rows})
    with pytest.raises(ConfigError, match="a claim is about the reference row"):
        experiment_from_dict({"name": "t", "datasets": ["d"], "claim": ["standard-rag"], "rows": rows})
