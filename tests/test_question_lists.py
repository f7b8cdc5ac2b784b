"""Committed question lists (`--questions`): the headline tables' 200 ids per dataset load, match their
datasets and the seeded sample they were drawn as; a list selects exactly its questions and enters the
run id; experiment rows can be limited to some datasets."""
import json

import pytest
from conftest import SHARED_DATA
from test_harness import config, reader, write_hotpot

from metarag.data.datasets import named_question_lists, question_list, resolve_preset, sample, select
from metarag.errors import ConfigError, DataError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate, prepare

HEADLINE = ("hotpotqa-dev500", "2wiki-dev1000")


def test_the_headline_lists_are_shipped_for_both_datasets():
    lists = named_question_lists()
    assert sorted(lists["headline200"]) == sorted(HEADLINE)
    for name in HEADLINE:
        listed = question_list("headline200", name)
        assert len(listed.ids) == len(set(listed.ids)) == 200 and listed.dataset == name


@pytest.mark.parametrize("name", HEADLINE)
def test_the_headline_lists_match_their_datasets_and_the_seeded_draw(name):
    if not (SHARED_DATA / "hotpotqa").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    dataset = resolve_preset(name, SHARED_DATA)
    listed = question_list("headline200", name)
    raw = json.loads(open(listed.path).read())
    assert raw["dataset_sha256"] == dataset.sha256  # drawn from this very file
    assert list(listed.ids) == [q.id for q in sample(dataset, 200, 0).questions]  # --limit 200 --seed 0
    chosen = select(dataset, listed.ids)
    assert [q.id for q in chosen.questions] == list(listed.ids)
    if dataset.contexts is not None:  # HotpotQA's distractor pool shrinks to the 200 questions' paragraphs
        assert len(chosen.passages) == len({p for c in chosen.contexts for p in c})


def test_a_list_file_selects_its_questions_in_file_order_and_enters_the_run_id(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("q4\nq1\n")
    listed, _ = evaluate(EvalConfig(
        method="standard-rag", dataset=DatasetSpec(file=str(write_hotpot(tmp_path / "hotpot.json")),
                                                   questions=str(ids)),
        runs_dir=str(tmp_path / "runs")), progress=False, llm=reader())
    assert json.loads((listed.path / "questions.json").read_text()) == ["q1", "q4"]
    settings = json.loads((listed.path / "settings.json").read_text())
    assert settings["dataset"]["questions"] == str(ids) and len(settings["dataset"]["question_ids_sha256"]) == 64
    whole = prepare(config(tmp_path))[0]
    assert whole.path != listed.path and "questions" not in json.loads(json.dumps(prepare(config(tmp_path))[3]))[
        "dataset"]  # a run without a list keeps the id it always had
    ids.write_text("q4\nq2\n")  # other questions under the same path: another run
    assert prepare(EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(tmp_path / "hotpot.json"),
                                                                         questions=str(ids)),
                              runs_dir=str(tmp_path / "runs")))[0].path != listed.path


def test_bad_lists_fail_naming_the_list(tmp_path):
    data = str(write_hotpot(tmp_path / "hotpot.json"))
    with pytest.raises(ConfigError, match="no question list 'headline' for hotpotqa-dev500; lists: headline200"):
        question_list("headline", "hotpotqa-dev500")
    with pytest.raises(ConfigError, match="metarag ships none"):
        question_list("headline200", "bamboogle")
    stray = tmp_path / "ids.json"
    stray.write_text(json.dumps({"ids": ["q1", "nope"]}))
    with pytest.raises(DataError, match="1 of its 2 question ids are not in hotpot .first 'nope'"):
        evaluate(EvalConfig(method="standard-rag", dataset=DatasetSpec(file=data, questions=str(stray)),
                            runs_dir=str(tmp_path / "runs")), progress=False, llm=reader())
    stray.write_text(json.dumps(["q1", "q1"]))
    with pytest.raises(DataError, match="names question 'q1' twice"):
        prepare(EvalConfig(method="standard-rag", dataset=DatasetSpec(file=data, questions=str(stray))))
    with pytest.raises(ConfigError, match="no question list file"):
        prepare(EvalConfig(method="standard-rag", dataset=DatasetSpec(file=data, questions=str(tmp_path / "x.txt"))))


def test_experiment_rows_can_be_limited_to_some_datasets(tmp_path):
    from metarag.evaluate.experiment import experiment_from_dict

    experiment = experiment_from_dict({
        "name": "t", "datasets": ["demo", "hotpotqa-dev500"], "questions": "headline200",
        "rows": [{"method": "closed-book"}, {"method": "self-ask", "datasets": ["hotpotqa-dev500"]}]})
    assert experiment.questions == "headline200"
    assert [r.runs_on("demo") for r in experiment.rows] == [True, False]
    with pytest.raises(ConfigError, match="dataset 'nq-1000' is not among the table's datasets"):
        experiment_from_dict({"name": "t", "datasets": ["demo"],
                              "rows": [{"method": "cot", "datasets": ["nq-1000"]}]})
    for name in ("study", "evoctx", "agent"):
        from conftest import REPO

        from metarag.evaluate.experiment import load_experiment

        loaded = load_experiment(REPO / "experiments" / f"headline-{name}.toml")
        assert loaded.questions == "headline200" and set(loaded.datasets) == set(HEADLINE)
