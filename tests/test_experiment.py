"""Experiment files (`metarag experiment FILE`): every row of a paper's table on the same questions,
then one report per dataset against the reference row — here against a fake OpenAI-compatible server
(no model) — with the same run ids as the equivalent `metarag eval` commands, so that kept run folders
resume."""
import json
import shutil
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer

from metarag.cli import build_parser, eval_config_from_args, main
from metarag.errors import ConfigError
from metarag.evaluate.experiment import Row, eval_config, experiment_from_dict, load_experiment, with_overrides
from metarag.evaluate.harness import prepare

EXPERIMENTS = Path(__file__).parents[1] / "experiments"


def run(tmp_path, url, file, *args):
    return main(["experiment", str(file), "--runs-dir", str(tmp_path / "runs"), "--limit", "2", "--quiet",
                 "--llm", f"openai:fake@{url}", *args])


@pytest.fixture
def server():
    with FakeOpenAIServer(0, answer="Paris") as fake:
        yield fake


def test_rows_run_on_the_same_questions_and_are_reported_against_the_reference(tmp_path, server, capsys):
    rows = ["standard-rag", "metarag:similarity=token-f1,max_iter=1"]
    assert run(tmp_path, server.url, EXPERIMENTS / "study.toml", "--datasets", "demo", "--rows", *rows) == 0
    out = capsys.readouterr().out
    assert "## study table on demo (limit 2, seed 0)" in out
    table = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ") and " demo | 2 |" in line]
    assert table == ["| standard-rag", "| metarag"]  # the file's order
    assert "Against metarag-demo-openai-" in out
    assert "### metarag-demo-openai-" in out  # each run's breakdown
    assert (tmp_path / "runs" / "study-demo.csv").is_file()
    asked = server.requests
    assert run(tmp_path, server.url, EXPERIMENTS / "study.toml", "--datasets", "demo", "--rows", *rows) == 0
    assert server.requests == asked  # resumed: nothing asked again
    assert capsys.readouterr().out == out
    (metarag_run,) = (tmp_path / "runs").glob("metarag-demo-*")
    settings = json.loads((metarag_run / "settings.json").read_text())["method_settings"]
    assert settings["max_iter"] == 1 and settings["similarity"] == "token-f1"  # the row's settings went in


def test_running_one_row_keeps_the_finished_rows_in_the_report_and_csv(tmp_path, server, capsys):
    assert run(tmp_path, server.url, EXPERIMENTS / "study.toml", "--datasets", "demo", "--rows", "standard-rag") == 0
    asked = server.requests
    assert run(tmp_path, server.url, EXPERIMENTS / "study.toml", "--datasets", "demo", "--rows", "closed-book") == 0
    assert server.requests > asked
    csv = (tmp_path / "runs" / "study-demo.csv").read_text().splitlines()
    assert [line.split(",")[0].split("-demo-")[0] for line in csv[1:]] == ["closed-book", "standard-rag"]
    assert "## study table on demo" in capsys.readouterr().out


def test_a_cell_has_the_run_id_of_the_same_eval_command(tmp_path):
    """Same run folder as `metarag eval ... --set ...`, prefix chunk included."""
    experiment = experiment_from_dict({
        "name": "t", "datasets": ["demo"], "limit": 2, "seed": 3, "threads": 1, "prefix_chunk": 32,
        "rows": [{"method": "ircot", "settings": {"k": 5, "max_steps": 8}}]})
    args = build_parser().parse_args(["eval", "--method", "ircot", "--dataset", "demo", "--limit", "2", "--seed", "3",
                                      "--threads", "1", "--prefix-chunk", "32", "--set", "k=5", "--set", "max_steps=8",
                                      "--runs-dir", str(tmp_path)])
    cell = eval_config(experiment, experiment.rows[0], "demo", tmp_path)
    assert prepare(cell)[0].path == prepare(eval_config_from_args(args))[0].path


def test_the_kept_table_runs_resume_under_their_experiment_files(tmp_path, monkeypatch, capsys):
    """The run folders kept in docs/table-runs are the cells of experiments/*.toml at --limit 30 (the
    rows whose method has not changed revision since they ran)."""
    from conftest import SHARED_DATA

    if not (SHARED_DATA / "hotpotqa").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    kept = Path(__file__).parents[1] / "docs" / "table-runs"
    for file, folder, dataset, rows in (
            ("evoctx.toml", "evoctx-table", "hotpotqa-dev500",
             ("standard-rag", "iterdrag", "kirag", "evoctx:confidence_probe=true")),
            ("evoctx.toml", "evoctx-table", "musique-train100", ("standard-rag", "evoctx:confidence_probe=true")),
            ("agent.toml", "agent-table", "hotpotqa-dev500",
             ("closed-book", "belief-agent", "belief-agent:probe=true"))):
        experiment = with_overrides(load_experiment(EXPERIMENTS / file), limit=30)
        for label in rows:
            path = prepare(eval_config(experiment, Row.parse(label), dataset, kept / folder))[0].path
            assert (path / "results.jsonl").is_file(), (file, label, dataset, path.name)
    # The wiki-corpus cells: their folders were named by a hash of the corpus's path as given then
    # (/work/main/../shared/data/...); a corpus is now hashed by its content, and those folders are found
    # by their settings, so they resume whatever the data folder's place (here a link elsewhere).
    moved = tmp_path / "moved-data"
    moved.symlink_to(SHARED_DATA)
    monkeypatch.setenv("METARAG_DATA_DIR", str(moved))
    experiment = with_overrides(load_experiment(EXPERIMENTS / "agent.toml"), limit=30)
    for dataset in ("nq-1000", "triviaqa-1000", "popqa-1000", "bamboogle"):
        for label in ("standard-rag", "belief-agent", "belief-agent:probe=true"):
            cell = eval_config(experiment, Row.parse(label), dataset, kept / "agent-table")
            assert cell.dataset.corpus.startswith(str(moved))
            path = prepare(cell)[0].path
            assert (path / "results.jsonl").is_file(), (label, dataset, path.name)
    # the headline tables' closed-book run, being written now, keeps its folder
    assert main(["eval", "--method", "closed-book", "--dataset", "hotpotqa-dev500", "--questions", "headline200",
                 "--runs-dir", str(kept / "headline"), "--print-run-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(kept / "headline" / "closed-book-hotpotqa-dev500-embedded-97d9994b54")


def test_the_headline_standard_rag_run_keeps_its_id_from_eval_and_from_its_experiment_file(capsys):
    """The headline tables' standard-rag run on HotpotQA, being written now, keeps its folder whichever
    front end names it: the plain eval command and the cell of experiments/headline-study.toml."""
    from conftest import SHARED_DATA

    from metarag.evaluate.resolve import resolve

    if not (SHARED_DATA / "hotpotqa").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    headline = Path(__file__).parents[1] / "docs" / "table-runs" / "headline"
    assert main(["eval", "--method", "standard-rag", "--dataset", "hotpotqa-dev500", "--questions", "headline200",
                 "--runs-dir", str(headline), "--print-run-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(headline / "standard-rag-hotpotqa-dev500-embedded-d81740abfb")
    cell = eval_config(load_experiment(EXPERIMENTS / "headline-study.toml"), Row("standard-rag"), "hotpotqa-dev500",
                       headline)
    assert resolve(cell).folder == headline / "standard-rag-hotpotqa-dev500-embedded-d81740abfb"


def test_a_kept_wiki_corpus_run_resumes_from_a_moved_data_folder_and_runs_nothing_again(tmp_path, monkeypatch):
    from conftest import SHARED_DATA

    from metarag.evaluate.harness import evaluate

    if not (SHARED_DATA / "wiki_sample").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    kept = Path(__file__).parents[1] / "docs" / "table-runs" / "agent-table"
    kept = kept / "standard-rag-nq-1000-embedded-7dca2c5aea"
    copy = tmp_path / "runs" / kept.name
    shutil.copytree(kept, copy, ignore=shutil.ignore_patterns("*.lock"))
    moved = tmp_path / "moved-data"
    moved.symlink_to(SHARED_DATA)
    monkeypatch.setenv("METARAG_DATA_DIR", str(moved))
    cell = eval_config(with_overrides(load_experiment(EXPERIMENTS / "agent.toml"), limit=30), Row("standard-rag"),
                       "nq-1000", tmp_path / "runs")

    class Unasked:
        """The model the run recorded, which must not be asked anything: every question is done."""
        identity = json.loads((kept / "manifest.json").read_text())["model_identity"]

        def complete(self, *args, **kwargs):
            raise AssertionError("a finished question was run again")

        chat = score_labels = complete

    before = (copy / "results.jsonl").read_bytes()
    store, results = evaluate(cell, progress=False, llm=Unasked())
    assert store.path == copy and len(results) == 30 and not any(r.failed for r in results)
    assert (copy / "results.jsonl").read_bytes() == before


def test_bad_files_are_refused_naming_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    head = 'name = "x"\ndatasets = ["demo"]\n'
    for text, message in ((head + 'rows = [{method = "cot"}]\nlimt = 3', "unknown field 'limt'"),
                          (head, "no 'rows'"),
                          (head + 'limit = "30"\nrows = [{method = "cot"}]', "limit must be a int"),
                          ('name = "x"\ndatasets = ["demo"]\nreference = "ircot"\nrows = [{method = "cot"}]',
                           "reference 'ircot' is none of the rows"),
                          (head + 'rows = [{method = "cot"}, {method = "cot"}]', "row 'cot' twice")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message) as err:
            load_experiment(bad)
        assert str(bad) in str(err.value)
    bad.write_text("name = [")
    with pytest.raises(Exception, match="unreadable experiment file"):
        load_experiment(bad)


def test_a_bad_row_is_refused_before_any_question_runs(tmp_path, server, capsys):
    file = tmp_path / "x.toml"
    file.write_text('name = "x"\ndatasets = ["demo"]\n[[rows]]\nmethod = "standard-rag"\n'
                    '[[rows]]\nmethod = "ircot"\nsettings = { k = -1 }\n')
    assert run(tmp_path, server.url, file) != 0
    assert "row 'ircot:k=-1': method 'ircot' setting 'k' must be >= 1" in capsys.readouterr().err
    assert server.requests == 0


def test_the_aligned_evoctx_table_runs_the_papers_budget_where_a_method_exposes_it(tmp_path, server):
    """EvoCtx §4.1 aligns its baselines to T = 8 rounds and k = 5 passages; rows whose own defaults
    already are that share their run with the evoctx table."""
    assert run(tmp_path, server.url, EXPERIMENTS / "evoctx-aligned.toml", "--datasets", "demo",
               "--rows", "ircot:k=5,max_steps=8", "kirag:k=5,T=8") == 0
    assert run(tmp_path, server.url, EXPERIMENTS / "evoctx.toml", "--datasets", "demo", "--rows", "ircot") == 0
    runs = {p.name.split("-demo-")[0] + ":" + json.dumps(
        {k: v for k, v in json.loads((p / "settings.json").read_text())["method_settings"].items()
         if k in ("k", "T", "max_steps")}, sort_keys=True) for p in (tmp_path / "runs").glob("*-demo-*")}
    assert runs == {'ircot:{"k": 5, "max_steps": 8}', 'ircot:{"k": 6, "max_steps": 10}', 'kirag:{"T": 8, "k": 5}'}
    assert (tmp_path / "runs" / "evoctx-aligned-demo.csv").is_file()


def test_the_agent_table_retrieves_from_the_wiki_corpus_where_a_benchmark_has_no_paragraphs(tmp_path, monkeypatch):
    from conftest import SHARED_DATA

    if not (SHARED_DATA / "bamboogle").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    monkeypatch.setenv("METARAG_DATA_DIR", str(SHARED_DATA))
    experiment = load_experiment(EXPERIMENTS / "agent.toml")
    cell = eval_config(experiment, Row("standard-rag"), "bamboogle", tmp_path)
    assert cell.dataset.corpus == f"{SHARED_DATA}/wiki_sample/wiki18_sample1000.jsonl"
    assert eval_config(experiment, Row("standard-rag"), "hotpotqa-dev500", tmp_path).dataset.corpus is None


def test_every_experiment_file_loads_and_a_judge_goes_to_every_cell(tmp_path):
    for file in EXPERIMENTS.glob("*.toml"):
        experiment = load_experiment(file)
        assert experiment.reference_row() is not None, file.name
    agentic = load_experiment(EXPERIMENTS / "agentic.toml")
    cell = eval_config(agentic, agentic.rows[0], "hotpotqa-dev500", tmp_path)
    assert cell.judge_llm == "embedded" and cell.answer_judge.prompt == "equivalence"
    asked = experiment_from_dict({"name": "j", "datasets": ["demo"], "judge_llm": "embedded",
                                  "judge_prompt": "agentic-rag", "rows": [{"method": "cot"}]})
    assert eval_config(asked, Row("cot"), "demo", tmp_path).answer_judge.prompt == "agentic-rag"
    with pytest.raises(ConfigError, match="prompt"):
        eval_config(experiment_from_dict({"name": "j", "datasets": ["demo"], "judge_prompt": "lenient",
                                          "rows": [{"method": "cot"}]}), Row("cot"), "demo", tmp_path)
    plain = eval_config(load_experiment(EXPERIMENTS / "study.toml"), Row("cot"), "demo", tmp_path)
    assert plain.judge_llm is None and plain.samples.k == 1
    sampled = experiment_from_dict({"name": "s", "datasets": ["demo"], "samples": 4, "rows": [{"method": "cot"}]})
    assert eval_config(sampled, Row("cot"), "demo", tmp_path).samples.k == 4


def test_the_headline_files_hold_the_rows_issue_50_lists_on_the_committed_question_lists():
    """The three papers' n = 200 tables: closed-book, standard-rag, ircot, metarag (the study); evoctx,
    iterdrag, dragin-entropy (EvoCtx); search-r1 and belief-agent (the belief-action paper), on both
    datasets; on HotpotQA only, self-ask and SIM-RAG with its trained critic (a folder, not the LLM)."""
    both = ("hotpotqa-dev500", "2wiki-dev1000")
    wanted = {"study": ["closed-book", "standard-rag", "ircot", "metarag"],
              "evoctx": ["evoctx", "iterdrag", "dragin-entropy"], "agent": ["search-r1", "belief-agent"]}
    references = {"study": "metarag", "evoctx": "evoctx", "agent": "belief-agent"}
    for paper, methods in wanted.items():
        experiment = load_experiment(EXPERIMENTS / f"headline-{paper}.toml")
        assert experiment.questions == "headline200" and experiment.datasets == both
        for dataset in both:
            on = [r.method for r in experiment.rows if r.runs_on(dataset)]
            assert all(m in on for m in methods), (paper, dataset, on)
        assert experiment.reference_row().method == references[paper]
    study = load_experiment(EXPERIMENTS / "headline-study.toml")
    hotpot_only = {r.method: r for r in study.rows if r.datasets == ("hotpotqa-dev500",)}
    assert set(hotpot_only) == {"self-ask", "sim-rag"}
    critic = dict(hotpot_only["sim-rag"].settings)["critic"]
    assert critic != "llm" and critic.startswith("docs/table-runs/headline/")


def test_every_experiment_files_columns_are_columns_the_report_has(tmp_path):
    """A file's `columns` are checked only when its table is reported, after hours of runs: here, against
    the columns of a Standard RAG run's row (and the judge and sample columns a run can add)."""
    from metarag import run
    from metarag.evaluate.summary import JUDGE_COLUMNS, SAMPLE_COLUMNS, load_run, summarize
    from metarag.llm.scripted import ScriptedLLM

    done = run("standard-rag", "demo", limit=1, runs_dir=tmp_path, llm_instance=ScriptedLLM([("", "Paris")]))
    known = set(summarize(load_run(done.path))) | set(JUDGE_COLUMNS) | set(SAMPLE_COLUMNS)
    for file in sorted(EXPERIMENTS.glob("*.toml")):
        experiment = load_experiment(file)
        wanted = [c.strip() for c in experiment.columns.split(",") if c.strip()]
        assert not [c for c in wanted if c not in known], file.name
