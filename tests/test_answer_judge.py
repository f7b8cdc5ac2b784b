"""LLM-as-judge accuracy and avg@k / pass@k on the scripted model: the judge's verdicts kept in the run
folder and resumed, a changed judge judging anew, an unreadable reply recorded as unjudged; sampled
answers seeded per (question, sample), resumable per (question, sample), and pass@k computed from them."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from test_harness import config, reader

from metarag.cli import main
from metarag.errors import ConfigError
from metarag.evaluate.answer_judge import (
    judge_files,
    load_verdicts,
    summarize_judge,
    verdicts_for,
)
from metarag.evaluate.harness import Samples, evaluate, prepare, sample_seed
from metarag.evaluate.report import load_run, report_table
from metarag.evaluate.runs import RunStore, Shard
from metarag.evaluate.stats import cohen_kappa, pass_at_k
from metarag.judges.correctness import (
    AGENTIC_RAG_TASK,
    CORRECT,
    INCORRECT,
    UNJUDGED,
    AnswerJudge,
    read_verdict,
)
from metarag.llm.base import Decoding
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import request_seed

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin", "Austria": "Vienna",
            "Portugal": "Lisbon"}


def judge_says(verdicts: dict[str, str]):
    """A scripted judge: the reply for each predicted answer (by the prediction's text)."""
    def reply(prompt: str) -> str:
        predicted = prompt.split("Predicted answer: ", 1)[1].split("\n", 1)[0]
        return verdicts.get(predicted, "Verdict: No")
    return ScriptedLLM([("Predicted answer: ", reply)], name="judge")  # either prompt


def wrong_reader():
    """Answers Paris to every question: right on France only (EM 1 of 6)."""
    return ScriptedLLM([("Passages:", "Paris")], default="Paris")


# ------------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("reply, verdict", [
    ("Verdict: Yes", CORRECT), ("Verdict: No", INCORRECT), ("No.", INCORRECT), ("True", CORRECT),
    ("Incorrect: the gold answer is Rome.", INCORRECT), ("The answer is wrong. Verdict: Yes", CORRECT),
    ("I cannot tell.", UNJUDGED), ("", UNJUDGED),
])
def test_the_verdict_is_read_by_explicit_rules_and_an_unreadable_reply_is_unjudged(reply, verdict):
    got = read_verdict(reply)
    assert got.verdict == verdict
    assert (got.fallback is not None) == (verdict == UNJUDGED)


def test_the_prompt_holds_the_question_the_golds_and_the_prediction_and_is_a_named_setting():
    assert AnswerJudge(prompt="agentic-rag").task == AGENTIC_RAG_TASK and "{question}" in AGENTIC_RAG_TASK
    # the default is the prompt the embedded judge can give: gold answers and prediction only
    assert AnswerJudge().task == AnswerJudge(prompt="equivalence").task and "{question}" not in AnswerJudge().task
    with pytest.raises(ConfigError, match="prompt"):
        AnswerJudge(prompt="lenient")


def test_kappa_and_pass_at_k_by_hand():
    # 4 items, agreement 3/4; shares 1/2 and 1/4: p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2, kappa = (3/4 - 1/2) / (1/2)
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))  # one call throughout: undefined
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))  # 0.7
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)


# ----------------------------------------------------------------------------- the judge over a run
def test_the_judge_runs_after_eval_its_verdicts_kept_with_its_prompt_and_not_asked_again(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded", answer_judge=AnswerJudge(prompt="agentic-rag"))
    # the judge says Paris is right for France only, and also (wrongly) for Italy
    judge = judge_says({})
    judge.rules[0].responses = [lambda p: "Verdict: Yes" if ("France" in p or "Italy" in p) else "Verdict: No"]
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=judge)
    [path] = judge_files(store.path)
    saved = json.loads(path.with_suffix(".json").read_text())
    assert saved["prompt"] == AGENTIC_RAG_TASK and saved["judge_model"] == "scripted:judge"
    assert saved["judge"]["prompt"] == "agentic-rag"
    verdicts = load_verdicts(path)
    assert len(verdicts) == 6 and len(judge.prompts) == 6
    assert {v.question_id: v.verdict for v in verdicts}["q1"] == CORRECT  # Italy: Paris judged right
    assert "Predicted answer: Paris" in verdicts[0].trace.steps[0].prompt[0].content  # the prompt it was asked
    # a re-run (eval resumed, every question done) asks the judge nothing
    again = judge_says({})
    evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=again)
    assert again.prompts == [] and judge_files(store.path) == [path]
    # the report: judged accuracy 2 of 6; agreement with EM 5 of 6 (Italy differs)
    run = load_run(store.path)
    summary = summarize_judge(path, run.results)
    assert (summary.correct, summary.judged, summary.n, summary.em_table) == (2, 6, 6, (1, 1, 0, 4))
    assert summary.agree_em == pytest.approx(5 / 6)
    # EM and the judge: shares 1/6 and 2/6 -> p_e = 1/6 * 2/6 + 5/6 * 4/6 = 22/36; kappa = (30/36 - 22/36) / (14/36)
    assert summary.kappa_em == pytest.approx(8 / 14)
    table, rows = report_table([run], baseline=None)
    assert rows[0]["judge acc"] == pytest.approx(100 * 2 / 6) and "judge acc" in table and "kappa EM" in table


def test_a_changed_judge_prompt_or_model_judges_anew_into_a_file_of_its_own(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded", answer_judge=AnswerJudge(prompt="agentic-rag"))
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=judge_says({"Paris": "Verdict: Yes"}))
    other = ScriptedLLM([("Decide whether the predicted answer means", "Verdict: No")], name="judge")
    evaluate(replace(cfg, answer_judge=AnswerJudge()), progress=False, llm=wrong_reader(),  # the default prompt
             judge_llm=other)
    assert len(other.prompts) == 6 and len(judge_files(store.path)) == 2
    renamed = judge_says({"Paris": "Verdict: Yes"})
    renamed.identity = "scripted:another-judge"
    evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=renamed)
    assert len(renamed.prompts) == 6 and len(judge_files(store.path)) == 3
    # the table's judge columns read the default prompt's verdicts (all No), not the newest judge's (all
    # Yes), whatever order the files were written in: a re-judged run stays comparable with its table
    [row] = report_table([load_run(store.path)], baseline=None)[1]
    assert row["judge acc"] == 0.0 and row["judge"] == "scripted:judge (equivalence)"


def test_an_unreadable_reply_is_recorded_unjudged_and_a_failed_request_is_asked_again(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded")
    # every request fails (no rule matches): recorded, never raised
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=ScriptedLLM([], name="judge"))
    [path] = judge_files(store.path)
    assert all(v.verdict == UNJUDGED and v.trace.error for v in load_verdicts(path))
    babbling = judge_says({"Paris": "Hard to say."})
    evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=babbling)
    assert len(babbling.prompts) == 6  # the failed ones asked again
    run = load_run(store.path)
    assert verdicts_for(path, run.results) == [None] * 6
    summary = summarize_judge(path, run.results)
    assert (summary.correct, summary.judged, summary.unjudged) == (0, 0, 6) and math.isnan(summary.kappa_em)
    # an unreadable reply stays: greedy decoding would give it again
    silent = judge_says({})
    evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=silent)
    assert silent.prompts == []


def test_a_killed_judge_keeps_its_verdicts_and_resumes_the_rest(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded")
    store, _ = evaluate(cfg, progress=False, llm=reader(), judge_llm=judge_says({}))
    [path] = judge_files(store.path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:40])  # killed while writing the 4th verdict
    judge = judge_says({})
    evaluate(cfg, progress=False, llm=reader(), judge_llm=judge)
    assert len(judge.prompts) == 3
    assert sorted(v.question_id for v in load_verdicts(path)) == [f"q{i}" for i in range(6)]


def test_the_judge_is_not_asked_about_a_failed_question_which_scores_not_correct(tmp_path):
    cfg = replace(config(tmp_path), judge_llm="embedded")
    failing = ScriptedLLM([("capital of France", "Paris")])  # the other questions fail: no rule
    store, _ = evaluate(replace(cfg, max_consecutive_failures=0), progress=False, llm=failing,
                        judge_llm=(judge := judge_says({"Paris": "Verdict: Yes"})))
    assert len(judge.prompts) == 1
    run = load_run(store.path)
    summary = summarize_judge(judge_files(store.path)[0], run.results)
    assert (summary.correct, summary.n, summary.no_answer) == (1, 6, 5)


def test_eval_judge_llm_refuses_an_unknown_model_a_prompt_alone_and_a_shard_before_any_question(tmp_path, capsys):
    data = config(tmp_path).dataset.file
    assert main(["eval", "--method", "standard-rag", "--dataset-file", data, "--judge-llm", "nonsense",
                 "--runs-dir", str(tmp_path / "runs")]) == 1
    assert "unknown LLM back-end 'nonsense'" in capsys.readouterr().err
    assert main(["eval", "--method", "standard-rag", "--dataset-file", data, "--judge-prompt", "equivalence",
                 "--runs-dir", str(tmp_path / "runs")]) == 1
    assert "--judge-prompt sets the prompt of --judge-llm" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="not one shard"):
        prepare(replace(config(tmp_path), judge_llm="embedded", shard=Shard(1, 2)))


# ------------------------------------------------------------------------------------------ samples
class SeededReader(ScriptedLLM):
    """Right when the request's seed is even, else "Nowhere"; records each request's decoding."""

    def __init__(self):
        super().__init__([("Passages:", "x")], default="x", name="seeded")
        self.decodings: list[Decoding] = []

    def complete(self, prompt, decoding: Decoding = Decoding()):
        self.decodings.append(decoding)
        capital = next(city for country, city in CAPITALS.items() if f"capital of {country}" in str(prompt))
        self.rules[0].responses = [capital if decoding.seed % 2 == 0 else "Nowhere"]
        return super().complete(prompt, decoding)


def expected_right(qid: str, sample: int, seed: int = 0) -> bool:
    """Standard RAG asks once: its request seed is the first of the sample's rollout seed."""
    return request_seed(sample_seed(seed, qid, sample), 0) % 2 == 0


def test_samples_are_seeded_sampled_and_pass_at_k_comes_from_them(tmp_path):
    cfg = replace(config(tmp_path), samples=Samples(k=4))
    llm = SeededReader()
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert [r.sample for r in results] == [0] * 6  # what evaluate returns: sample 0's
    assert len(llm.decodings) == 24
    assert {(d.temperature, d.top_p) for d in llm.decodings} == {(0.6, 0.95)}
    answers = store.load_samples()
    assert sorted(answers) == [(f"q{i}", s) for i in range(6) for s in range(4)]
    for (qid, sample), r in answers.items():
        assert r.scores.em == float(expected_right(qid, sample))
    right = {q: [expected_right(q, s) for s in range(4)] for q in (f"q{i}" for i in range(6))}
    assert 0 < sum(map(sum, right.values())) < 24  # the seeds do differ across samples here
    _, rows = report_table([load_run(store.path)], baseline=None)
    assert rows[0]["k"] == 4
    assert rows[0]["avg@k EM"] == pytest.approx(100 * sum(sum(v) / 4 for v in right.values()) / 6)
    assert rows[0]["pass@k EM"] == pytest.approx(100 * sum(any(v) for v in right.values()) / 6)
    assert rows[0]["EM"] == pytest.approx(100 * sum(v[0] for v in right.values()) / 6)
    # a sampled run is a run of its own; one greedy answer per question keeps its run id
    greedy, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    assert greedy.path != store.path
    assert "sampling" in json.loads(store.settings_path.read_text())
    assert "sampling" not in json.loads(greedy.settings_path.read_text())


def test_samples_resume_per_question_and_sample_with_the_same_seeds(tmp_path):
    cfg = replace(config(tmp_path), samples=Samples(k=3))
    store, _ = evaluate(cfg, progress=False, llm=SeededReader())
    first = {(r.question_id, r.sample): r.prediction for r in store.load_samples().values()}
    lines = store.results_path.read_text().splitlines(keepends=True)
    dropped = [(json.loads(line)["question_id"], json.loads(line).get("sample", 0)) for line in lines[-4:]]
    store.results_path.write_text("".join(lines[:-4]))
    llm = SeededReader()
    evaluate(cfg, progress=False, llm=llm)
    assert len(llm.decodings) == 4  # only the dropped (question, sample) pairs
    assert {(r.question_id, r.sample): r.prediction for r in store.load_samples().values()} == first
    assert len(dropped) == 4
    # more samples later add only the new ones, into the same run folder
    more = SeededReader()
    again, _ = evaluate(replace(cfg, samples=Samples(k=5)), progress=False, llm=more)
    assert again.path == store.path and len(more.decodings) == 12
    assert load_run(store.path).samples[-1].sample == 4


def test_sampled_answers_are_judged_each_and_avg_and_pass_at_k_of_the_judge_reported(tmp_path):
    cfg = replace(config(tmp_path), samples=Samples(k=2), judge_llm="embedded")
    judge = judge_says({city: "Verdict: Yes" for city in CAPITALS.values()})  # Nowhere: No
    store, _ = evaluate(cfg, progress=False, llm=SeededReader(), judge_llm=judge)
    assert len(judge.prompts) == 12
    run = load_run(store.path)
    _, rows = report_table([run], baseline=None)
    assert rows[0]["avg@k judge"] == pytest.approx(rows[0]["avg@k EM"])  # this judge agrees with EM
    assert rows[0]["pass@k judge"] == pytest.approx(rows[0]["pass@k EM"])


def test_sampling_settings_are_checked_and_need_samples_on_the_command_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="temperature"):
        Samples(k=2, temperature=0)
    data = config(tmp_path).dataset.file
    assert main(["eval", "--method", "standard-rag", "--dataset-file", data, "--sample-temperature", "0.9",
                 "--runs-dir", str(tmp_path / "runs")]) == 1
    assert "give K > 1" in capsys.readouterr().err


def test_report_prints_the_judges_below_the_table(tmp_path, capsys, monkeypatch):
    cfg = replace(config(tmp_path), judge_llm="embedded")
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader(), judge_llm=judge_says({"Paris": "Verdict: Yes"}))
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "### LLM-as-judge accuracy" in out and "scripted:judge" in out and "equivalence" in out
    assert RunStore(store.path).load_results()  # the results file is untouched by the judge


def test_a_batched_or_threaded_sampled_run_gives_each_answer_the_same_seed_as_one_at_a_time(tmp_path):
    one, _ = evaluate(replace(config(tmp_path), samples=Samples(k=3)), progress=False, llm=SeededReader())
    batched, _ = evaluate(replace(config(tmp_path), samples=Samples(k=3), batch=4, runs_dir=str(tmp_path / "b")),
                          progress=False, llm=SeededReader())
    threads, _ = evaluate(replace(config(tmp_path), samples=Samples(k=3), workers=3, runs_dir=str(tmp_path / "c")),
                          progress=False, llm=SeededReader())
    answers = lambda store: {key: r.prediction for key, r in store.load_samples().items()}  # noqa: E731
    assert answers(one) == answers(batched) == answers(threads) and len(answers(one)) == 18


def test_the_api_samples_and_judges_and_a_run_can_be_judged_afterwards(tmp_path):
    import metarag

    data = config(tmp_path).dataset.file
    run = metarag.run("standard-rag", data, runs_dir=tmp_path / "runs", samples=2, llm_instance=SeededReader())
    assert len(run.sampled) == 12 and "pass@k EM" in run.table()
    judged = run.judge(llm_instance=judge_says({city: "Verdict: Yes" for city in CAPITALS.values()}))
    assert "judge acc" in judged.table() and "pass@k judge" in judged.table()
    again = metarag.run("standard-rag", data, runs_dir=tmp_path / "runs", samples=2, llm_instance=SeededReader(),
                        judge_llm="embedded", judge_llm_instance=(silent := judge_says({})))
    assert silent.prompts == [] and again.path == run.path  # the verdicts above are this judge's: nothing to ask


def test_other_weights_behind_the_same_judge_spec_are_refused_not_mixed(tmp_path, monkeypatch):
    import metarag.methods.runner as runner

    cfg = replace(config(tmp_path), judge_llm="embedded")
    monkeypatch.setattr(runner, "build_named_llm", lambda spec, **_: judge_says({}))
    store, _ = evaluate(cfg, progress=False, llm=wrong_reader())
    [path] = judge_files(store.path)
    assert json.loads(path.with_suffix(".json").read_text())["model_identity"] == "scripted:judge"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # one answer left to judge
    retrained = judge_says({})
    retrained.identity = "scripted:retrained"
    monkeypatch.setattr(runner, "build_named_llm", lambda spec, **_: retrained)
    with pytest.raises(ConfigError, match="verdicts in .* came from scripted:judge"):
        evaluate(cfg, progress=False, llm=wrong_reader())


def test_sample_signal_reads_the_groups_of_a_sampled_run(tmp_path):
    from metarag.errors import DataError
    from metarag.train.agent import sample_signal

    store, _ = evaluate(replace(config(tmp_path), samples=Samples(k=4)), progress=False, llm=SeededReader())
    right = {f"q{i}": [expected_right(f"q{i}", s) for s in range(3)] for i in range(6)}
    got = sample_signal(store.path, group=3, example_answer="Nowhere")
    assert got.groups == 6 and got.incomplete == 0
    assert got.outcome_fraction == pytest.approx(sum(0 < sum(v) < 3 for v in right.values()) / 6)
    assert got.mean_outcome == pytest.approx(sum(map(sum, right.values())) / 18)
    assert got.example_answers == pytest.approx(1 - got.mean_outcome)  # every wrong answer is "Nowhere"
    assert got.first_actions == {} and got.invalid_per_rollout == 0  # Standard RAG: no agent steps
    with pytest.raises(DataError, match="no question has 5 sampled answers"):
        sample_signal(store.path, group=5)
    with pytest.raises(DataError, match="no run folder"):
        sample_signal(tmp_path / "nowhere")
