"""How the agentic papers score and judge answers (issue 52): R1-Searcher's ACC_R and Search-o1's
substring accuracy as pure functions on hand-made examples, their report columns, R1-Searcher's judge
prompt, the judge table's flag on a model judging its own answers, and the report's row naming a
setting that departs from a method's authors."""
from __future__ import annotations

from dataclasses import replace

import pytest
from test_answer_judge import wrong_reader
from test_harness import config

from metarag.evaluate.answer_judge import format_answer_judges
from metarag.evaluate.harness import evaluate
from metarag.evaluate.report import load_run, method_label, report_table
from metarag.judges.correctness import PROMPTS, R1_SEARCHER_TASK, AnswerJudge, correctness_prompt, read_verdict
from metarag.llm.scripted import ScriptedLLM
from metarag.metrics import r1_normalize, r1_searcher_accuracy, search_o1_accuracy


# ------------------------------------------------------------------------------ R1-Searcher's ACC_R
@pytest.mark.parametrize("prediction, golds, expected", [
    ("Gustave Eiffel", ["Gustave Eiffel"], 1.0),
    ("Eiffel, Gustave", ["Gustave Eiffel"], 1.0),        # any order
    ("Gustave Alexandre Eiffel", ["Gustave Eiffel"], 1.0),  # not necessarily together
    ("Eiffel", ["Gustave Eiffel"], 0.0),                  # every gold token is needed
    ("1990s", ["1990"], 0.0),                             # tokens, not characters
    ("rock-n-roll", ["rock n roll"], 1.0),                # punctuation becomes a space (SQuAD would drop it)
    ("Jean_Paul", ["Jean-Paul"], 1.0),                    # so do underscores
    ("True", ["yes"], 1.0),                               # their bool_mapping
    ("the Louvre", ["Louvre"], 1.0),                      # articles dropped
    ("Lyon", ["Paris", "Lyon"], 1.0),                     # the best gold alias
    ("", ["Paris"], 0.0),
    ("I don't know.", ["no"], 0.0),                       # "know" holds "no" as characters, not as a token
])
def test_r1_searcher_accuracy_by_hand(prediction, golds, expected):
    assert r1_searcher_accuracy(prediction, golds) == expected


def test_r1_normalize_by_hand():
    assert r1_normalize("‘An’ Apple_pie!") == "apple pie" and r1_normalize("False") == "no"
    assert r1_normalize("Don't") == "don t"  # the apostrophe a space, not dropped


# ----------------------------------------------------------------------------- Search-o1's accuracy
@pytest.mark.parametrize("prediction, golds, expected", [
    ("Gustave Eiffel", ["Gustave Eiffel"], 1.0),
    ("It was Gustave Eiffel.", ["Gustave Eiffel"], 1.0),   # contained
    ("Eiffel, Gustave", ["Gustave Eiffel"], 0.0),          # in order: a substring
    ("the New Yorker", ["New York"], 1.0),                 # characters: "new york" is in "new yorker"
    ("Parisian", ["Paris"], 0.0),                          # ... but a gold sharing no token is skipped
    ("rock-n-roll", ["rock n roll"], 0.0),                 # SQuAD's normalization: "rocknroll"
    ("Lyon", ["Paris", "Lyon"], 1.0),
    ("", ["Paris"], 0.0),
])
def test_search_o1_accuracy_by_hand(prediction, golds, expected):
    assert search_o1_accuracy(prediction, golds) == expected


def test_both_refuse_missing_golds():
    for metric in (r1_searcher_accuracy, search_o1_accuracy):
        with pytest.raises(ValueError):
            metric("Paris", [])
        with pytest.raises(TypeError):
            metric("Paris", "Paris")


def test_the_papers_accuracies_are_report_columns_computed_from_the_stored_answers(tmp_path):
    # the scripted reader answers "Paris" to every question: right on France only
    store, results = evaluate(config(tmp_path), progress=False, llm=wrong_reader())
    run = load_run(store.path)
    table, rows = report_table([run], columns=["method", "EM", "Acc (R1-Searcher)", "Acc (Search-o1)"])
    expected_r1 = 100 * sum(r1_searcher_accuracy(r.prediction, r.golds) for r in results) / len(results)
    expected_o1 = 100 * sum(search_o1_accuracy(r.prediction, r.golds) for r in results) / len(results)
    assert rows[0]["Acc (R1-Searcher)"] == pytest.approx(expected_r1) and 0 < expected_r1 < 100
    assert rows[0]["Acc (Search-o1)"] == pytest.approx(expected_o1)
    assert "Acc (R1-Searcher) lo" in rows[0] and "| Acc (R1-Searcher) |" in table
    default, _ = report_table([run])
    assert "Acc (R1-Searcher)" not in default  # the default table stays narrow


# ------------------------------------------------------------------------------------------- judge
def test_the_r1_searcher_judge_prompt_has_its_structure_and_reads_true_or_false():
    assert AnswerJudge(prompt="r1-searcher").task == R1_SEARCHER_TASK == PROMPTS["r1-searcher"]
    (message,) = correctness_prompt("r1-searcher", {"question": "Where was Eiffel born?", "golds": "Dijon",
                                                    "prediction": "Lyon"})
    text = message.content
    # instruction first, then question, golden answer and prediction, in that order, each on its own line
    assert text.index("True") < text.index("Question: Where was Eiffel born?\n") \
        < text.index("Golden Answer: Dijon\n") < text.index("Predicted Answer: Lyon")
    assert text.endswith("Predicted Answer: Lyon")
    assert read_verdict("True").verdict == "correct" and read_verdict("False").verdict == "incorrect"
    assert read_verdict("False. Dijon is the birthplace.").verdict == "incorrect"


def test_the_judge_table_says_which_model_judged_and_flags_a_model_judging_its_own_answers(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded", answer_judge=AnswerJudge(prompt="r1-searcher"))
    own = ScriptedLLM([("Predicted Answer: ", "True")], name="scripted")  # the reader's identity
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=own)
    table = format_answer_judges([load_run(store.path)])
    assert "| scripted:scripted (self) | r1-searcher |" in table and "judging its own answers" in table
    (tmp_path / "other").mkdir()
    other = replace(config(tmp_path / "other"), judge_llm="embedded", answer_judge=AnswerJudge(prompt="r1-searcher"))
    store, _ = evaluate(other, progress=False, llm=wrong_reader(),
                        judge_llm=ScriptedLLM([("Predicted Answer: ", "False")], name="judge"))
    table = format_answer_judges([load_run(store.path)])
    assert "| scripted:judge | r1-searcher |" in table and "(self)" not in table


# ------------------------------------------------------------------------------- departures named
@pytest.mark.parametrize("method, own, label", [
    ("search-o1", {"force_answer": True, "greedy": True}, "search-o1 (greedy, forced answer)"),
    ("search-o1", {"force_answer": False, "greedy": False}, "search-o1"),
    ("r1-searcher", {"force_answer": True}, "r1-searcher (forced answer)"),
    ("autorefine", {"force_answer": False, "clean_answer": True}, "autorefine (cleaned answer)"),
    ("autorefine", {}, "autorefine"),  # a record without the setting says nothing about it
    ("dragin", {"force_answer": True}, "dragin"),  # metarag's own method: no authors' code to depart from
])
def test_a_setting_that_departs_from_the_authors_names_the_row(method, own, label):
    assert method_label({"method": method, "method_settings": own}) == label
