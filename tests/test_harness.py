"""The evaluation harness end to end on the scripted LLM: run folders, scoring, resumption after a
kill, failures in the denominator, significance in reports, sweeps and CLI errors."""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from metarag.cli import main
from metarag.errors import DataError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.evaluate.report import load_run, report_table, significance
from metarag.evaluate.runs import QuestionResult, RunStore
from metarag.evaluate.stats import paired_t_test
from metarag.evaluate.sweep import sweep
from metarag.llm.scripted import ScriptedLLM
from metarag.metrics import AnswerScores

CITIES = ["Paris", "Rome", "Madrid", "Berlin", "Vienna", "Lisbon"]
COUNTRIES = ["France", "Italy", "Spain", "Germany", "Austria", "Portugal"]


def write_hotpot(path: Path) -> Path:
    """A small official-format HotpotQA file: one supporting paragraph and one distractor each."""
    records = []
    for i, (city, country) in enumerate(zip(CITIES, COUNTRIES)):
        records.append({
            "_id": f"q{i}", "question": f"What is the capital of {country}?", "answer": city,
            "type": "bridge", "level": "easy",
            "supporting_facts": [[f"{country}", 0]],
            "context": [[country, [f"{country} is a country in Europe.", f" Its capital is {city}."]],
                        [f"{city} (song)", [f"{city} is also the title of a song."]]],
        })
    path.write_text(json.dumps(records))
    return path


def answer_from_prompt(prompt: str) -> str:
    """The scripted reader: finds 'Its capital is X' in the passages, else says Paris."""
    import re
    question = prompt.rsplit("Question:", 1)[1]
    country = re.search(r"capital of (\w+)", question).group(1)
    m = re.search(rf"{country} is a country in Europe\. Its capital is (\w+)\.", prompt)
    return m.group(1) if m else "Paris"


def config(tmp_path, method="standard-rag", **kw) -> EvalConfig:
    data = write_hotpot(tmp_path / "hotpot.json")
    return EvalConfig(method=method, dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"), **kw)


def reader():
    return ScriptedLLM([("Passages:", answer_from_prompt)], default="Paris")


def test_eval_writes_one_scored_result_per_question(tmp_path):
    store, results = evaluate(config(tmp_path), progress=False, llm=reader())
    assert [r.question_id for r in results] == [f"q{i}" for i in range(6)]
    assert all(r.scores.em == 1.0 for r in results)
    # every supporting passage is among the 5 retrieved from the 12-passage pool here
    assert all(r.support_recall == 1.0 for r in results)
    lines = store.results_path.read_text().splitlines()
    assert len(lines) == 6
    settings = json.loads(store.settings_path.read_text())
    assert settings["method_settings"] == {"k": 5, "max_tokens": 32}
    manifest = json.loads(store.manifest_path.read_text())
    assert manifest["model_identity"] == "scripted:scripted" and manifest["sessions"][0]["ended"]
    assert manifest["dataset_sha256"] == settings["dataset"]["sha256"]


def test_rerun_resumes_and_never_duplicates(tmp_path):
    cfg = config(tmp_path)
    evaluate(cfg, progress=False, llm=reader())
    llm = reader()
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert llm.prompts == []  # nothing was asked again
    assert len(store.results_path.read_text().splitlines()) == 6


def test_a_torn_last_line_is_dropped_and_that_question_rerun(tmp_path):
    cfg = config(tmp_path)
    store, _ = evaluate(cfg, progress=False, llm=reader())
    lines = store.results_path.read_text().splitlines(keepends=True)
    store.results_path.write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])  # killed mid-write
    llm = reader()
    _, results = evaluate(cfg, progress=False, llm=llm)
    assert len(llm.prompts) == 2  # questions 5 and 6 only
    ids = [json.loads(line)["question_id"] for line in store.results_path.read_text().splitlines()]
    assert sorted(ids) == [f"q{i}" for i in range(6)] and len(results) == 6


KILLED_RUN = """
import sys, time
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.llm.scripted import ScriptedLLM
def slow(prompt):
    time.sleep(0.3)
    return "Paris"
cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=sys.argv[1]), runs_dir=sys.argv[2])
evaluate(cfg, progress=False, llm=ScriptedLLM([("Passages:", slow)]))
"""


def test_a_killed_run_restarted_ends_with_exactly_one_record_per_question(tmp_path):
    data = write_hotpot(tmp_path / "hotpot.json")
    runs = tmp_path / "runs"
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(data), str(runs)], env=os.environ.copy())
    deadline = time.time() + 60
    results = None
    while time.time() < deadline:
        found = list(runs.glob("*/results.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            results = found[0]
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert results is not None, "the run never wrote two results"
    before = len(results.read_text().splitlines())
    assert 2 <= before < 6
    cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)), runs_dir=str(runs))
    llm = ScriptedLLM([("Passages:", "Paris")])
    evaluate(cfg, progress=False, llm=llm)
    ids = [json.loads(line)["question_id"] for line in results.read_text().splitlines()]
    assert sorted(ids) == sorted(set(ids)) == [f"q{i}" for i in range(6)]
    assert len(llm.prompts) == 6 - before


def test_a_failing_question_is_recorded_and_scores_zero(tmp_path):
    def flaky(prompt):
        if "Spain" in prompt.rsplit("Question:", 1)[1]:
            raise RuntimeError("model crashed")
        return answer_from_prompt(prompt)

    store, results = evaluate(config(tmp_path), progress=False, llm=ScriptedLLM([("Passages:", flaky)]))
    failed = [r for r in results if r.error]
    assert len(results) == 6 and len(failed) == 1
    assert failed[0].question_id == "q2" and "model crashed" in failed[0].error
    assert failed[0].scores.em == 0.0
    row = report_table([load_run(store.path)], baseline=None)[1][0]
    assert row["n"] == 6 and row["errors"] == row["failed"] == 1 and abs(row["EM"] - 100 * 5 / 6) < 1e-9
    assert not failed[0].retryable  # a bug, not a back-end down: a re-run does not ask it again


def test_report_marks_significance_with_a_paired_test_on_per_question_scores(tmp_path):
    good, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    bad, _ = evaluate(config(tmp_path, method="closed-book"), progress=False,
                      llm=ScriptedLLM(default="Paris"))
    base, other = load_run(bad.path), load_run(good.path)
    # by default a 0/1 score gets the exact McNemar test: 5 discordant questions, all one way, p = 2 / 32
    table, rows = report_table([base, other], baseline=0)
    assert rows[1]["p EM (McNemar)"] == pytest.approx(0.0625)
    assert rows[1]["p EM (Holm)"] == pytest.approx(0.0625) and rows[1]["EM*"] == ""
    assert "| p EM (McNemar) |" in table and "100.0 (61.0–100.0) |" in table
    # the study's paired t-test, a named option, calls the same answers significant
    table, rows = report_table([base, other], baseline=0, tests=("t-test",))
    expected = paired_t_test([1.0] * 6, [1.0] + [0.0] * 5).p_value
    assert rows[1]["p EM (t-test)"] == pytest.approx(expected)
    assert expected < 0.05 and "100.0 (61.0–100.0)*" in table
    assert significance(base, other, "em", "randomization").p_value < 0.1


def test_report_refuses_runs_over_different_questions(tmp_path):
    a, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(tmp_path / "hotpot.json"), limit=3),
                     runs_dir=str(tmp_path / "runs"))
    b, _ = evaluate(cfg, progress=False, llm=reader())
    with pytest.raises(DataError, match="different question sets"):
        report_table([load_run(a.path), load_run(b.path)])


def test_sweep_runs_each_value_and_tabulates(tmp_path, monkeypatch):
    import metarag.evaluate.sweep as sweep_module

    real = sweep_module.evaluate
    monkeypatch.setattr(sweep_module, "evaluate", lambda cfg, progress: real(cfg, progress=False, llm=reader()))
    table, rows = sweep(config(tmp_path), {"k": ["1", "2"]}, progress=False)
    assert [row["k"] for row in rows] == ["1", "2"]
    assert [row["passages/q"] for row in rows] == [1.0, 2.0]
    assert table.splitlines()[0].startswith("| k | n | failed | EM | F1")
    assert [row["failed"] for row in rows] == [0, 0]


def test_sweep_cli_exits_non_zero_when_a_point_has_failed_questions(tmp_path, monkeypatch, capsys):
    from metarag.evaluate import harness

    def flaky(prompt):  # with k=1 the reader sees too little, and fails on Spain
        if "Spain" in prompt.rsplit("Question:", 1)[1] and "[2]" not in prompt:
            raise RuntimeError("reader crashed")
        return answer_from_prompt(prompt)

    monkeypatch.setattr(harness, "make_llm", lambda spec, **_: ScriptedLLM([("Passages:", flaky)]))
    data = write_hotpot(tmp_path / "hotpot.json")
    assert main(["sweep", "--method", "standard-rag", "--dataset-file", str(data), "--vary", "k=1,2",
                 "--runs-dir", str(tmp_path / "runs"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    rows = out.splitlines()[2:4]
    assert rows[0].startswith("| 1 | 6 | 1 |") and rows[1].startswith("| 2 | 6 | 0 |")
    errors = [line for line in err.splitlines() if line.startswith("metarag: error:")]
    assert len(errors) == 1 and "1 of 6 questions have no successful result" in errors[0]
    assert "first: q2: RuntimeError: reader crashed" in errors[0]


@pytest.mark.parametrize("argv, message", [
    (["eval", "--method", "metarag-x", "--dataset", "demo"], "unknown method 'metarag-x'"),
    (["eval", "--method", "standard-rag", "--dataset", "hotpot-dev500"], "unknown dataset preset"),
    (["eval", "--method", "standard-rag", "--dataset", "demo", "--limit", "1000"], "only 100"),
    (["eval", "--method", "standard-rag", "--dataset", "demo", "--set", "kk=3"], "no setting 'kk'"),
    (["eval", "--method", "standard-rag"], "exactly one of --dataset"),
    (["ask", "  "], "question is empty"),
    (["ask", "Who?", "--method", "rag"], "unknown method 'rag'"),
    (["ask", "Who?", "--llm", "gpt"], "unknown LLM back-end 'gpt'"),
])
def test_cli_user_mistakes_get_one_line_errors_and_leave_no_run(argv, message, capsys, tmp_path):
    assert main([*argv, *(["--runs-dir", str(tmp_path / "runs")] if argv[0] == "eval" else [])]) == 1
    err = capsys.readouterr().err
    assert message in err and err.startswith("metarag: error:") and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_cli_ask_names_the_bad_line_of_a_malformed_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "title": "A", "text": "a"}\n{"id": "2", "title": \n')
    assert main(["ask", "Who?", "--corpus", str(corpus)]) == 1
    assert f"{corpus}:2" in capsys.readouterr().err


def test_cli_ask_refuses_an_empty_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    assert main(["ask", "Who?", "--corpus", str(corpus)]) == 1
    assert "no passages" in capsys.readouterr().err


def test_concurrent_workers_write_each_question_once_and_score_the_same(tmp_path):
    store, results = evaluate(config(tmp_path, workers=3), progress=False, llm=reader())
    ids = [json.loads(line)["question_id"] for line in store.results_path.read_text().splitlines()]
    assert sorted(ids) == [f"q{i}" for i in range(6)]
    assert [r.question_id for r in results] == [f"q{i}" for i in range(6)]  # reported in dataset order
    assert all(r.scores.em == 1.0 for r in results)


def test_report_cli_prints_table_writes_csv_and_plot(tmp_path, capsys):
    store, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    csv_path, png = tmp_path / "r.csv", tmp_path / "r.png"
    assert main(["report", str(store.path), "--csv", str(csv_path), "--plot", str(png), "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "| standard-rag | bm25 | scripted |" in out
    header = csv_path.read_text().splitlines()[0].split(",")
    assert {"EM", "F1", "req/q", "tok/req", "USD"} <= set(header)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(store.path), "--csv", "", "--columns", "method,reranker,EM,passages/q,tok/q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| method | reranker | EM | passages/q | tok/q |"
    assert lines[2].startswith("| standard-rag | – | ") and lines[2].split(" | ")[3] == "5.00"
    assert main(["report", str(store.path), "--csv", "", "--columns", "method,set:k"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| standard-rag | 5 |"
    assert main(["report", str(store.path), "--columns", "EM,nonsense"]) == 1
    assert "unknown report column(s) 'nonsense'" in capsys.readouterr().err
    # a judge column is known before any run is judged (an experiment's --report-only mid-way)
    assert main(["report", str(store.path), "--csv", "", "--columns", "method,judge acc"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| standard-rag | – |"


def test_eval_with_a_reranker_records_rerank_steps_and_saves_its_settings(tmp_path):
    llm = ScriptedLLM([("Passages:", answer_from_prompt)], label_rules=[(".", {"Yes": 0.5, "No": 0.5})])
    cfg = config(tmp_path, reranker="llm", rerank_depth=8)
    store, results = evaluate(cfg, progress=False, llm=llm)
    from metarag.records import Rerank, Retrieve

    steps = results[0].trace.steps
    n = len(steps[0].hits)  # the LLM judge probes each candidate, then the Rerank step keeps 5
    assert isinstance(steps[0], Retrieve) and steps[0].k == 8 and isinstance(steps[n + 1], Rerank)
    assert [s.kind for s in steps[1:n + 1]] == ["score"] * n
    assert len(steps[n + 1].hits) == 5
    settings = json.loads(store.settings_path.read_text())
    assert settings["reranker"]["spec"] == "llm" and settings["reranker"]["depth"] == 8
    plain, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    assert plain.path != store.path  # a reranked run is a run of its own


def test_a_model_named_by_path_is_hashed_by_content_into_the_run_id(tmp_path, monkeypatch):
    from metarag.evaluate import harness
    from metarag.evaluate.harness import prepare

    monkeypatch.setattr(harness, "build_method", lambda name, overrides: None)  # no critic is loaded

    critic = tmp_path / "critic"
    critic.mkdir()
    (critic / "critic.joblib").write_bytes(b"first training")
    first, *_, resolved = prepare(config(tmp_path, method="sim-rag", overrides={"critic": str(critic)}))
    assert set(resolved["artifacts"]) == {"method_settings.critic"}
    again = prepare(config(tmp_path, method="sim-rag", overrides={"critic": str(critic)}))[0]
    assert again.path == first.path  # same content, same run
    (critic / "critic.joblib").write_bytes(b"retrained critic")
    retrained = prepare(config(tmp_path, method="sim-rag", overrides={"critic": str(critic)}))[0]
    assert retrained.path != first.path
    plain = prepare(config(tmp_path, method="sim-rag"))[3]
    assert "artifacts" not in plain  # the LLM critic names no file: run ids of such runs are unchanged


def test_exact_prefix_reuse_is_a_run_of_its_own_and_off_leaves_run_ids_alone(tmp_path):
    from metarag.errors import ConfigError
    from metarag.evaluate.harness import prepare
    from metarag.llm.registry import LLMSpec, parse_llm_spec

    plain = prepare(config(tmp_path))
    assert "prefix_chunk" not in plain[3]["llm"]  # off: the run ids of earlier runs stay put
    exact = prepare(config(tmp_path, llm=LLMSpec(prefix_chunk=32)))
    assert exact[3]["llm"]["prefix_chunk"] == 32 and exact[0].path != plain[0].path
    with pytest.raises(ConfigError, match="llama.cpp setting"):
        parse_llm_spec("hf-0.5b", prefix_chunk=32)


def test_a_method_revision_above_one_is_hashed_into_the_run_id(tmp_path, monkeypatch):
    from metarag.evaluate import resolve
    from metarag.evaluate.harness import prepare
    from metarag.methods.iterdrag import IterDRAG

    cfg = config(tmp_path, method="iterdrag")
    current = prepare(cfg)
    assert current[3]["method_revision"] == IterDRAG.revision >= 2
    monkeypatch.setattr(resolve, "method_revision", lambda name: 1)
    first = prepare(cfg)
    assert "method_revision" not in first[3] and first[0].path != current[0].path
    standard = prepare(config(tmp_path))[3]
    assert "method_revision" not in standard  # revision 1: run ids of unchanged methods stay put


def test_a_new_revision_of_a_method_run_inside_another_changes_the_composite_run_id(tmp_path, monkeypatch):
    from metarag.evaluate.harness import prepare
    from metarag.methods.ircot import IRCoT
    from metarag.methods.react import ReAct

    cfg = config(tmp_path, method="adaptive-rag", overrides={"route": "C"})
    before = prepare(cfg)
    assert before[3]["component_revisions"] == {"ircot": IRCoT.revision}  # revisions above 1 are hashed
    reflexion = prepare(config(tmp_path, method="reflexion"))
    monkeypatch.setattr(IRCoT, "revision", IRCoT.revision + 1)
    after = prepare(cfg)
    assert after[3]["component_revisions"] == {"ircot": IRCoT.revision} and after[0].path != before[0].path
    assert prepare(config(tmp_path, method="reflexion"))[0].path == reflexion[0].path  # it runs no IRCoT
    monkeypatch.setattr(ReAct, "revision", ReAct.revision + 1)
    assert prepare(config(tmp_path, method="reflexion"))[3]["component_revisions"] == {"react": ReAct.revision}
    monkeypatch.setattr(IRCoT, "revision", 1)  # at revision 1 a component leaves the id as it was
    assert "component_revisions" not in prepare(cfg)[3]


def test_passages_per_question_counts_each_passage_once(tmp_path):
    from metarag.records import Hit, Passage, Retrieve, Trace, Usage

    def hits(*ids):
        return tuple(Hit(Passage(i, i, "text"), 1.0, "bm25") for i in ids)

    trace = Trace("q0", "Q?", "iterdrag", (Retrieve(Usage(retrieval_calls=1), "Q?", 2, hits("a", "b")),
                                           Retrieve(Usage(retrieval_calls=1), "again", 2, hits("b", "c"))),
                  answer="x")
    store = RunStore(tmp_path / "run")
    store.write_json("settings.json", {"method": "iterdrag"})
    store.write_json("questions.json", ["q0"])
    with store.open_for_append() as handle:
        store.append(QuestionResult("q0", ("x",), "x", AnswerScores(1, 1, 1, 1, 1), None, None, trace), handle)
    _, rows = report_table([load_run(store.path)])
    assert rows[0]["passages/q"] == 3.0 and rows[0]["retr/q"] == 2.0


def test_report_by_type_reads_the_types_from_the_runs_dataset(tmp_path, capsys):
    data = write_hotpot(tmp_path / "hotpot.json")
    records = json.loads(data.read_text())
    for record in records[:2]:
        record["type"] = "comparison"
    data.write_text(json.dumps(records))
    cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"))
    store, _ = evaluate(cfg, progress=False, llm=ScriptedLLM([], default="Paris"))  # right on q0 only
    assert main(["report", str(store.path), "--csv", "", "--columns", "method,EM", "--by-type"]) == 0
    out = capsys.readouterr().out
    assert "| method | bridge (4) | comparison (2) | all (6) |" in out
    assert "| standard-rag | 0.00 | 50.00 | 16.67 |" in out
    # two runs of one method: named by the setting they differ in, as in the main table
    other, _ = evaluate(replace(cfg, overrides={"k": "1"}), progress=False, llm=ScriptedLLM([], default="Paris"))
    assert main(["report", str(store.path), str(other.path), "--csv", "", "--by-type"]) == 0
    out = capsys.readouterr().out
    assert "| standard-rag (k=5) | 0.00 | 50.00 | 16.67 |" in out and "| standard-rag (k=1) | 0.00 | 50.00 |" in out
    data.unlink()  # the dataset gone: one line naming it
    assert main(["report", str(store.path), "--csv", "", "--by-type"]) == 1
    assert "hotpot.json" in capsys.readouterr().err


def test_types_evaluate_only_those_questions_and_join_the_run_id(tmp_path):
    from metarag.errors import ConfigError
    from metarag.evaluate.harness import load_questions, prepare

    data = write_hotpot(tmp_path / "hotpot.json")
    records = json.loads(data.read_text())
    for record in records[::2]:
        record["type"] = "comparison"
    data.write_text(json.dumps(records))
    spec = DatasetSpec(file=str(data), types=("comparison",))
    assert [q.id for q in load_questions(spec).questions] == ["q0", "q2", "q4"]
    for seed in range(4):  # sampled after the slice
        assert {q.id for q in load_questions(replace(spec, limit=2, seed=seed)).questions} < {"q0", "q2", "q4"}
    store, results = evaluate(EvalConfig(method="standard-rag", dataset=spec, runs_dir=str(tmp_path / "runs")),
                              progress=False, llm=reader())
    assert [r.question_id for r in results] == ["q0", "q2", "q4"]
    assert main(["report", str(store.path), "--csv", "", "--breakdown"]) == 0  # re-reads the run's slice
    from metarag import run

    same = run("standard-rag", data, types=["comparison"], runs_dir=tmp_path / "runs", llm_instance=reader())
    assert same.path == store.path  # the Python front end names the same run
    whole = prepare(EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)),
                               runs_dir=str(tmp_path / "runs")))[0]
    assert whole.path != store.path  # another slice, another run
    with pytest.raises(ConfigError, match="no question of .* is of type compare"):
        load_questions(replace(spec, types=("compare",)))
    untyped = tmp_path / "untyped.json"
    untyped.write_text(json.dumps([{k: v for k, v in r.items() if k != "type"} for r in records]))
    with pytest.raises(ConfigError, match="gives no question types"):
        load_questions(DatasetSpec(file=str(untyped), types=("comparison",)))
    # the CLI flag reaches the run's dataset
    from metarag.cli import build_parser, eval_config_from_args

    args = build_parser().parse_args(["eval", "--method", "closed-book", "--dataset-file", str(data),
                                      "--types", "comparison, bridge", "--runs-dir", str(tmp_path / "cli")])
    assert eval_config_from_args(args).dataset.types == ("comparison", "bridge")
