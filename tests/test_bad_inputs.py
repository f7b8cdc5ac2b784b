"""Inputs that cannot finish a run, out-of-range settings and environment mistakes: each gets a
one-line error naming the thing at fault, before any model loads (issue 11, items 5, 6 and 8)."""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import socket
import typing

import pytest
from conftest import CITIES

from metarag.cli import build_parser, main
from metarag.data.datasets import load_dataset
from metarag.data.formats import UNANSWERABLE
from metarag.errors import BackendError, ConfigError, DataError
from metarag.methods.registry import METHODS, method_settings
from metarag.metrics import score_answer
from metarag.records import Passage
from metarag.settings import Range, check_ranges, override, setting

DEAD_LLM = ["--llm", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]


def error_line(capsys) -> str:
    """The CLI's stderr, checked to be one line."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------------------ settings ranges
@pytest.mark.parametrize("method, values, message", [
    ("standard-rag", {"k": "-1"}, "method 'standard-rag' setting 'k' must be >= 1, got -1"),
    ("standard-rag", {"k": "0"}, "setting 'k' must be >= 1, got 0"),
    ("standard-rag", {"max_tokens": "-1"}, "setting 'max_tokens' must be >= 1, got -1"),
    ("closed-book", {"max_tokens": "0"}, "setting 'max_tokens' must be >= 1"),
    ("cot", {"max_tokens": "-5"}, "setting 'max_tokens' must be >= 1"),
    ("metarag", {"threshold": "2"}, "method 'metarag' setting 'threshold' must be in [0, 1], got 2.0"),
    ("metarag", {"threshold": "nan"}, "setting 'threshold' must be in [0, 1], got nan"),
    ("metarag", {"entailment_threshold": "-0.1"}, "setting 'entailment_threshold' must be in [0, 1]"),
    ("metarag", {"max_iter": "-1"}, "setting 'max_iter' must be >= 0"),
    ("metarag", {"k": "0"}, "setting 'k' must be >= 1"),
    ("sim-rag", {"k": "-1"}, "setting 'k' must be >= 0"),
    ("sim-rag", {"accept_threshold": "1.5"}, "setting 'accept_threshold' must be in [0, 1]"),
    ("sim-rag", {"k_followup": "0"}, "setting 'k_followup' must be >= 1"),
    ("evoctx", {"tau_near": "0"}, "setting 'tau_near' must be > 0, got 0.0"),
    ("evoctx", {"tail_percentile": "inf"}, "setting 'tail_percentile' must be in [0, 100], got inf"),
    ("evoctx", {"T": "-1"}, "setting 'T' must be >= 0"),
    ("iterdrag", {"answer_max_tokens": "0"}, "setting 'answer_max_tokens' must be >= 1"),
])
def test_out_of_range_settings_name_the_setting_and_the_range(method, values, message):
    with pytest.raises(ConfigError) as caught:
        method_settings(method, values)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_in_range_edges_are_accepted():
    assert method_settings("sim-rag", {"k": "0"}).k == 0  # the official code's start from no passages
    assert method_settings("metarag", {"threshold": "0", "max_iter": "0"}).threshold == 0.0
    assert method_settings("metarag", {"threshold": "1"}).threshold == 1.0
    assert method_settings("evoctx", {"tail_percentile": "100", "T": "0"}).T == 0


def _numeric(tp) -> bool:
    """A scalar int or float field, optional or not (tuples of numbers are checked by their owner)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is not tuple else []
    return any(a in (int, float) for a in (args or [tp]))


def _settings_classes():
    from metarag.judges.boundary import BoundaryJudge
    from metarag.judges.critic import LLMCritic
    from metarag.judges.llm_judges import ExpertQA, YesNoJudge
    from metarag.judges.models import CrossEncoderEntailment
    from metarag.judges.similarity import AnswerSimilarity
    from metarag.rerank.listwise import ListwiseSettings
    from metarag.rerank.pointwise import CosineSettings, CrossEncoderSettings, LLMJudgeSettings
    from metarag.retrieve.bm25 import BM25Settings
    from metarag.retrieve.dense import DenseSettings

    methods = [getattr(importlib.import_module(module), cls) for module, _, cls in METHODS.values()]
    return [*methods, BM25Settings, DenseSettings, ListwiseSettings, LLMJudgeSettings, CrossEncoderSettings,
            CosineSettings, AnswerSimilarity, YesNoJudge, ExpertQA, LLMCritic, CrossEncoderEntailment, BoundaryJudge]


@pytest.mark.parametrize("cls", _settings_classes(), ids=lambda c: c.__name__)
def test_every_numeric_setting_declares_its_range(cls):
    """A numeric field added without `setting(..., ge=...)` would take any value, NaN included."""
    hints = typing.get_type_hints(cls)
    unranged = [f.name for f in dataclasses.fields(cls)
                if _numeric(hints[f.name]) and not isinstance(f.metadata.get("range"), Range)]
    assert unranged == []


@pytest.mark.parametrize("cls", _settings_classes(), ids=lambda c: c.__name__)
def test_every_settings_class_checks_its_ranges_when_built(cls):
    """Each class calls check_ranges in __post_init__: a direct construction is checked too."""
    hints = typing.get_type_hints(cls)
    required = {"name": "n", "task": "t", "path": "/m"}
    for f in dataclasses.fields(cls):
        bounds = f.metadata.get("range")
        if bounds is None or not _numeric(hints[f.name]):
            continue
        low = bounds.ge if bounds.ge is not None else bounds.gt
        bad = (low - 1) if low is not None else float("nan")
        kwargs = {k: v for k, v in required.items() if k in {g.name for g in dataclasses.fields(cls)}}
        with pytest.raises(ConfigError, match=f"setting '{f.name}' must be"):
            cls(**kwargs, **{f.name: bad})


def test_the_range_mechanism():
    assert Range(ge=1).describe() == ">= 1"
    assert Range(gt=0).describe() == "> 0"
    assert Range(ge=0, le=1).describe() == "in [0, 1]"
    assert Range(gt=0, le=100).describe() == "in (0, 100]"
    assert Range(lt=5).describe() == "< 5"
    assert not Range().admits(math.nan) and Range().admits(math.inf) and not Range(le=1).admits(math.inf)

    @dataclasses.dataclass(frozen=True)
    class Toy:
        n: int = setting(3, ge=1)
        ratio: float = setting(0.5, gt=0, lt=1)
        free: float = 2.0

        def __post_init__(self) -> None:
            check_ranges(self)

    with pytest.raises(ConfigError, match=r"^Toy setting 'n' must be >= 1, got 0$"):
        Toy(n=0)
    with pytest.raises(ConfigError, match=r"toy setting 'ratio' must be in \(0, 1\), got 1.0"):
        override(Toy(), {"ratio": "1"}, owner="toy")
    with pytest.raises(ConfigError, match="setting 'free' must be a number, got nan"):
        override(Toy(), {"free": "nan"}, owner="toy")
    assert override(Toy(), {"n": "7", "free": "-3"}, owner="toy") == Toy(n=7, free=-3.0)


def test_reranker_and_retriever_settings_are_range_checked():
    from metarag.rerank.registry import check_reranker
    from metarag.retrieve.bm25 import BM25Settings

    with pytest.raises(ConfigError, match="reranker 'listwise' setting 'window' must be >= 2, got 1"):
        check_reranker("listwise", {"window": "1"})
    with pytest.raises(ConfigError, match="setting 'b' must be in \\[0, 1\\], got 1.5"):
        BM25Settings(b=1.5)


@pytest.mark.parametrize("setting_", ["k=-1", "k=0", "max_tokens=-1"])
def test_eval_refuses_a_bad_setting_before_any_model_or_dataset_loads(tmp_path, capsys, setting_):
    # the dataset file does not even exist: the settings are checked first, and no server is asked
    code = main(["eval", "--method", "standard-rag", "--dataset-file", str(tmp_path / "none.json"),
                 "--set", setting_, "--runs-dir", str(tmp_path / "runs"), "--quiet", *DEAD_LLM])
    assert code == 1
    assert f"setting '{setting_.split('=')[0]}' must be >= 1" in error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_ask_refuses_a_negative_k(capsys):
    assert main(["ask", "Where?", "--k", "-1", *DEAD_LLM]) == 1
    assert "method 'standard-rag' setting 'k' must be >= 1, got -1" in error_line(capsys)


# ------------------------------------------------------------------------------- question files
def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


CONTEXT = [["Eiffel Tower", ["The Eiffel Tower is in Paris.", "It is tall."]]]


def hotpot(qid, answer, **extra):
    return {"_id": qid, "question": f"Question {qid}?", "answer": answer, "context": CONTEXT,
            "supporting_facts": [["Eiffel Tower", 0]], **extra}


@pytest.mark.parametrize("records, where", [
    ([{"id": "a", "question": "Q?", "golden_answers": ["x"]}, {"id": "b", "question": "Q2?", "golden_answers": []}],
     ":2: question 'b' has no gold answer (read as flashrag)"),
    ([hotpot("a", "Paris", level="easy"), hotpot("b", "", level="easy")],
     ":2: question 'b' has no gold answer (read as hotpotqa)"),
    ([{"question_id": "i1", "question_text": "Q?", "answers_objects": [{"spans": ["x"]}], "contexts": []},
      {"question_id": "i2", "question_text": "Q2?", "answers_objects": [{"spans": []}], "contexts": []}],
     ":2: question 'i2' has no gold answer (read as ircot)"),
])
def test_a_question_without_gold_answer_is_refused_naming_file_and_record(tmp_path, records, where):
    path = write_jsonl(tmp_path / "qs.jsonl", records)
    with pytest.raises(DataError, match="--allow-unanswerable") as caught:
        load_dataset(path)
    assert str(caught.value).startswith(path + where)


def test_a_json_array_names_the_record(tmp_path):
    path = tmp_path / "qs.json"
    path.write_text(json.dumps([hotpot("a", "Paris"), hotpot("b", "  ")]))
    with pytest.raises(DataError, match=r"qs.json: record 1: question 'b' has no gold answer"):
        load_dataset(path)


def test_allow_unanswerable_scores_an_abstention_as_right(tmp_path):
    path = write_jsonl(tmp_path / "qs.jsonl", [{"id": "a", "question": "Q?", "golden_answers": ["x"]},
                                               {"id": "b", "question": "Q2?", "golden_answers": []}])
    dataset = load_dataset(path, allow_unanswerable=True)
    a, b = dataset.questions
    assert a.answers == ("x",) and b.answers == UNANSWERABLE and b.type == "unanswerable"
    assert score_answer("Unknown.", b.answers).em == 1.0
    assert score_answer("Paris", b.answers).em == 0.0


def test_the_unanswerable_option_reaches_the_run_id_only_when_set(tmp_path):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, prepare

    path = write_jsonl(tmp_path / "qs.jsonl", [{"id": "a", "question": "Q?", "golden_answers": ["x"]}])
    plain = prepare(EvalConfig("closed-book", DatasetSpec(file=path), runs_dir=str(tmp_path)))
    allowed = prepare(EvalConfig("closed-book", DatasetSpec(file=path, allow_unanswerable=True),
                                 runs_dir=str(tmp_path)))
    assert "allow_unanswerable" not in plain[3]["dataset"]
    assert allowed[3]["dataset"]["allow_unanswerable"] is True
    assert plain[0].path != allowed[0].path


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_question_text_is_refused_at_load(tmp_path, text):
    path = write_jsonl(tmp_path / "qs.jsonl", [{"id": "a", "question": "Q?", "golden_answers": ["x"]},
                                               {"id": "b", "question": text, "golden_answers": ["y"]}])
    with pytest.raises(DataError, match=r"qs.jsonl:2: the question text is empty"):
        load_dataset(path)


def test_format_is_detected_from_every_record(tmp_path):
    first = {"_id": "a", "question": "Where?", "answer": "Paris", "type": "compositional",
             "context": [["Eiffel Tower", ["The tower is in Paris.", "It is tall."]]],
             "supporting_facts": [["Eiffel Tower", 0]]}
    second = {**first, "_id": "b", "evidences": [["Eiffel Tower", "located in", "Paris"]]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([first, second]))
    dataset = load_dataset(path)
    assert dataset.format == "2wiki"
    # 2Wiki sentences carry no leading spaces: joined with " ", not glued as HotpotQA's are
    assert dataset.passages[0].text == "The tower is in Paris. It is tall."


def test_a_mixed_file_is_refused_naming_the_first_record_that_disagrees(tmp_path):
    twowiki = {**hotpot("b", "Paris"), "evidences": [["Eiffel Tower", "located in", "Paris"]]}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps([hotpot("a", "Paris", level="easy"), hotpot("c", "Paris", level="hard"), twowiki]))
    with pytest.raises(DataError, match=r"mixed.json: record 2: its keys read as 2wiki, but record 0 reads as "
                                        r"hotpotqa: a file holds one format"):
        load_dataset(path)
    assert load_dataset(path, "hotpotqa").format == "hotpotqa"  # named, it is read as that format


def test_the_multihop_rag_hint_names_no_flag_that_does_not_exist(tmp_path):
    path = tmp_path / "my_queries.json"
    path.write_text(json.dumps([{"query": "Who?", "question_type": "inference_query"}]))
    with pytest.raises(DataError, match="my_ground_truth.json, ground_truth.json") as caught:
        load_dataset(path)
    assert "ground_truth=" not in str(caught.value) and "--ground-truth" not in str(caught.value)


def test_the_allow_any_hint_names_the_flag_train_critic_has():
    from metarag.data.datasets import Dataset
    from metarag.train.critic import check_training_split

    flags = build_parser()._subparsers._group_actions[0].choices["train-critic"]._option_string_actions
    with pytest.raises(ConfigError) as caught:
        check_training_split(Dataset("dev", (), None, "dev.json", "0", "flashrag"))
    named = {word.strip("(),`") for word in str(caught.value).split() if word.strip("(),`").startswith("--")}
    assert named and named <= set(flags)


# ------------------------------------------------------------------------------------- corpora
def test_a_corpus_without_an_indexable_word_is_a_data_error():
    from metarag.retrieve.bm25 import BM25Retriever

    with pytest.raises(DataError, match="none of the corpus's 3 passages has a word BM25 can index"):
        BM25Retriever.build([Passage("a", "", "!!!"), Passage("b", "", "the of and"), Passage("c", "", "...")])
    some = BM25Retriever.build([Passage("a", "", "!!!"), Passage("b", "", "Paris, France")])
    assert [h.passage.id for h in some.search("Paris", 2)] == ["b"]


def test_ask_over_an_empty_vocabulary_corpus_is_one_line(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "title": "", "text": "!!!"}])
    assert main(["ask", "Where?", "--corpus", corpus, *DEAD_LLM]) == 1
    assert "has a word BM25 can index" in capsys.readouterr().err.strip().splitlines()[-1]


# --------------------------------------------------------------------------------- environment
def test_runs_dir_that_is_a_file_or_under_one(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    common = ["eval", "--method", "closed-book", "--dataset", "demo", "--limit", "1", "--quiet", *DEAD_LLM]
    assert main([*common, "--runs-dir", str(afile)]) == 1
    assert f"--runs-dir '{afile}' is a file, not a folder" in error_line(capsys)
    assert main([*common, "--runs-dir", str(afile / "runs")]) == 1
    assert f"cannot be created: '{afile}' is a file" in error_line(capsys)


def test_metarag_home_that_is_a_file(tmp_path, monkeypatch):
    from metarag.paths import metarag_home

    afile = tmp_path / "home"
    afile.write_text("x")
    monkeypatch.setenv("METARAG_HOME", str(afile))
    with pytest.raises(ConfigError, match="METARAG_HOME .* is not a folder"):
        metarag_home()
    monkeypatch.setenv("METARAG_HOME", str(afile / "below"))
    with pytest.raises(ConfigError, match="is not a folder"):
        metarag_home()


def test_a_corrupt_response_cache_is_named(tmp_path):
    from metarag.llm.cache import ResponseCache

    path = tmp_path / "responses.sqlite"
    path.write_text("not a database, only text " * 20)
    with pytest.raises(DataError, match=rf"^{path}: the response cache cannot be opened \(file is not a database\)"):
        ResponseCache(path)


def test_report_refuses_a_file_a_non_run_folder_and_a_csv_folder(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["report", str(afile)]) == 1
    assert "is not a run folder" in error_line(capsys)
    assert main(["report", str(tmp_path)]) == 1
    assert "is not a run folder" in error_line(capsys)
    run = tmp_path / "run"
    run.mkdir()
    (run / "settings.json").write_text("{}")
    assert main(["report", str(run), "--csv", str(tmp_path)]) == 1
    assert "--csv" in (line := error_line(capsys)) and "is a folder" in line
    assert main(["report", str(run), "--csv", str(afile / "r.csv")]) == 1
    assert "is a file, not a folder" in error_line(capsys)


# ------------------------------------------------------------------------------------- service
def test_serve_retriever_refuses_a_port_out_of_range(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["serve-retriever", "--index", "nowhere", "--port", "70000"])
    assert caught.value.code == 2 and "a port is 0..65535, got 70000" in capsys.readouterr().err


def test_serve_retriever_refuses_an_empty_host_before_loading_the_index(capsys):
    assert main(["serve-retriever", "--index", "nowhere", "--host", ""]) == 1
    assert "the host is empty" in error_line(capsys)


def test_listen_refuses_empty_host_and_bad_port_as_config_errors():
    from metarag.retrieve.service import listen as _listen

    with pytest.raises(ConfigError, match="the host is empty"):
        _listen("", 0)
    with pytest.raises(ConfigError, match="0..65535"):
        _listen("127.0.0.1", 70000)


def test_serving_is_announced_only_after_the_bind_succeeded():
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from metarag.retrieve.memory import MemoryRetriever
    from metarag.retrieve.service import serve

    announced: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BackendError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve(MemoryRetriever(CITIES), "127.0.0.1", port, on_listening=announced.append)
    assert announced == []


def test_a_deeply_nested_body_is_a_bad_request():
    from metarag.retrieve.service import parse_request

    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"queries": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        with pytest.raises(DataError, match="nested too deeply"):
            parse_request(body)


def test_a_deeply_nested_body_gets_400_from_the_service():
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    import urllib.error
    import urllib.request

    from metarag.retrieve.memory import MemoryRetriever
    from metarag.retrieve.service import BackgroundService

    with BackgroundService.start(MemoryRetriever(CITIES)) as service:
        request = urllib.request.Request(service.url + "/retrieve", data=b"[" * 100_000 + b"]" * 100_000,
                                         method="POST", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 400
        assert "nested too deeply" in json.loads(caught.value.read())["error"]


# ------------------------------------------------------------------------------------------ ask
def test_ask_prints_its_error_on_stderr(monkeypatch, capsys):
    import metarag.pipeline as pipeline
    from metarag.records import Trace

    def failing(text, method, **kwargs):
        return Trace(question_id="ask", question=text, method=method.name, steps=(), answer=None,
                     error="BackendError: the server is gone")

    monkeypatch.setattr(pipeline, "answer_question", failing)
    assert main(["ask", "Where?", "--method", "closed-book", *DEAD_LLM]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == "metarag: error: BackendError: the server is gone"


def test_unmapped_support_is_reported_and_kept_in_the_manifest(tmp_path, notes):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
    from metarag.llm.scripted import ScriptedLLM

    # the second supporting title names a paragraph the question does not carry: unmapped
    records = [{**hotpot("a", "Paris"), "supporting_facts": [["Eiffel Tower", 0], ["Louvre", 1]]}]
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(records))
    config = EvalConfig("closed-book", DatasetSpec(file=str(path)), runs_dir=str(tmp_path / "runs"))
    store, results = evaluate(config, progress=False, llm=ScriptedLLM([], default="Paris"))
    assert "dev: 1 supporting paragraphs have no passage in the pool" in notes()
    assert store.read_json("manifest.json")["unmapped_support"] == 1


@pytest.mark.parametrize("flag", ["--limit", "--workers", "--batch", "--threads", "--rerank-depth"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_counts_on_the_command_line_are_at_least_one(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--method", "standard-rag", "--dataset", "demo", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: must be at least 1, got {value}" in capsys.readouterr().err
