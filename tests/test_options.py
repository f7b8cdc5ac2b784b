"""One description of a run: every field of `EvalConfig` is set by one option of `evaluate.options.OPTIONS`,
and that option reaches the same field from the CLI's `eval` flags, `metarag.run`'s keywords and an
experiment file's fields; a run is resolved against every registry in one step, before anything loads."""
import dataclasses
import inspect
import json
import typing
from pathlib import Path

import pytest

import metarag
from metarag.cli import build_parser, eval_config_from_args, llm_spec_from_args, main
from metarag.errors import ConfigError
from metarag.evaluate.config import DatasetSpec, EvalConfig, Samples
from metarag.evaluate.experiment import (
    NOT_IN_FILES,
    ROW_OPTIONS,
    TABLE_OPTIONS,
    Row,
    eval_config,
    experiment_from_dict,
    run_experiment,
)
from metarag.evaluate.options import BY_NAME, OPTIONS
from metarag.evaluate.resolve import resolve
from metarag.evaluate.runs import Shard
from metarag.llm.registry import LLMSpec
from metarag.testing import FakeOpenAIServer

# A value for each option and the config field's value it must give (the option's companions, which it
# needs to be valid, beside it). A new option fails `test_every_option_reaches_...` until it has one.
SAMPLES = {
    "method": ("ircot", "ircot", {}),
    "dataset": ("hotpotqa-dev500", "hotpotqa-dev500", {}),
    "dataset_file": ("questions.json", "questions.json", {}),
    "format": ("hotpotqa", "hotpotqa", {}),
    "corpus": ("wiki.jsonl", "wiki.jsonl", {}),
    "limit": (7, 7, {}),
    "seed": (3, 3, {}),
    "questions": ("headline200", "headline200", {}),
    "types": (["comparison", "bridge"], ("comparison", "bridge"), {}),
    "allow_unanswerable": (True, True, {}),
    "workers": (2, 2, {}),
    "batch": (4, 4, {}),
    "retriever": ("hybrid", "hybrid", {}),
    "reranker": ("listwise", "listwise", {}),
    "rerank_depth": (10, 10, {}),
    "settings": ({"k": 3, "rewrite": True}, {"k": "3", "rewrite": "true"}, {}),
    "runs_dir": ("other-runs", "other-runs", {}),
    "retry_failed": (True, True, {}),
    "max_consecutive_failures": (0, 0, {}),
    "wait": (True, True, {}),
    "samples": (4, 4, {}),
    "temperature": (0.7, 0.7, {"samples": 2}),
    "top_p": (0.9, 0.9, {"samples": 2}),
    "samples_until": ("mixed", "mixed", {"samples": 2}),
    "judge_llm": ("openai:judge@http://127.0.0.1:9/v1", "openai:judge@http://127.0.0.1:9/v1", {}),
    "judge_prompt": ("agentic-rag", "agentic-rag", {"judge_llm": "embedded"}),
    "llm": ("openai:m@http://127.0.0.1:9/v1", "openai", {}),
    "gguf": ("/models/x.gguf", "/models/x.gguf", {"llm": "gguf"}),
    "base_url": ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", {"llm": "openai", "model": "m"}),
    "model": ("m", "m", {"llm": "openai"}),
    "api_key_env": ("MY_KEY", "MY_KEY", {}),
    "threads": (2, 2, {}),
    "n_ctx": (8192, 8192, {}),
    "prefix_chunk": (32, 32, {}),
    "lora": ("/adapters/a.gguf", "/adapters/a.gguf", {}),
    "response_cache": (False, False, {}),
    "shard": ("2/4", Shard(2, 4), {}),
}


def config_leaves() -> set[str]:
    """Every field a run is described by: the config's own, and those of its dataset, model and samples."""
    hints = typing.get_type_hints(EvalConfig)
    leaves = set()
    for field in dataclasses.fields(EvalConfig):
        kind = hints[field.name]
        if kind in (DatasetSpec, LLMSpec, Samples):
            leaves |= {f"{field.name}.{inner.name}" for inner in dataclasses.fields(kind)}
        else:
            leaves.add(field.name)  # a value of its own (a shard, the answer judge: its prompt is the option)
    return leaves


def leaf(config: EvalConfig, target: str):
    value = config
    for part in target.split("."):
        value = getattr(value, part)
    return value


def test_every_field_of_a_run_is_set_by_one_option():
    leaves = config_leaves()
    covered = [option.target if option.target in leaves else option.target.split(".")[0] for option in OPTIONS]
    assert sorted(leaves - set(covered)) == [], "config fields no option sets (add one to evaluate.options.OPTIONS)"
    assert not set(covered) - leaves, "options that set no config field"
    assert len(covered) == len(set(covered)), "two options set one field"


def test_run_takes_every_option_as_a_keyword_with_the_configs_default():
    parameters = inspect.signature(metarag.run).parameters
    takes_a_file_too = {"dataset_file"}  # run(method, dataset): a preset name or a question file
    missing = [o.name for o in OPTIONS if o.name not in parameters and o.name not in takes_a_file_too]
    assert missing == [], "options metarag.run does not take"
    for name, parameter in parameters.items():
        if name in BY_NAME and parameter.default is not inspect.Parameter.empty and parameter.default is not None:
            default = BY_NAME[name].default
            assert parameter.default == default or tuple(parameter.default) == default, name


def test_every_option_is_an_experiment_field_or_says_why_not():
    fields = set(TABLE_OPTIONS) | set(ROW_OPTIONS)
    assert sorted(o.name for o in OPTIONS if o.name not in fields and o.name not in NOT_IN_FILES) == []
    assert set(NOT_IN_FILES) <= set(BY_NAME) and not set(NOT_IN_FILES) & fields


def cli_config(values: dict) -> EvalConfig:
    argv = ["eval"]
    for name, value in values.items():
        flag = BY_NAME[name].flag_names[0]
        if BY_NAME[name].kind is bool:
            argv += [flag] if value != BY_NAME[name].default else []
        elif isinstance(value, dict):
            argv += [x for k, v in value.items() for x in (flag, f"{k}={str(v).lower()}")]
        elif isinstance(value, list):
            argv += [flag, ",".join(value)]
        else:
            argv += [flag, str(value)]
    return eval_config_from_args(build_parser().parse_args(argv))


def run_config(values: dict, monkeypatch) -> EvalConfig:
    """The config `metarag.run` builds from `values` (its evaluation stopped before anything runs)."""
    from metarag.evaluate import harness

    class Built(Exception):
        pass

    def stop(config, **_):
        raise Built(config)

    monkeypatch.setattr(harness, "evaluate", stop)
    values = dict(values)
    dataset = values.pop("dataset_file", None) or values.pop("dataset")
    with pytest.raises(Built) as built:
        metarag.run(values.pop("method"), dataset, **values)
    return built.value.args[0]


def file_config(values: dict, name: str) -> EvalConfig | None:
    """The config of the cell an experiment file with `values` gives; None where a file does not set `name`."""
    if name in NOT_IN_FILES and name != "dataset":  # a file's cell is on one of its datasets
        return None
    row = {name: values[name] for name in ROW_OPTIONS if name in values}
    table = {name: value for name, value in values.items() if name in TABLE_OPTIONS and name not in row}
    experiment = experiment_from_dict({"name": "t", "datasets": [values["dataset"]], "rows": [row], **table})
    return eval_config(experiment, experiment.rows[0], values["dataset"], values["runs_dir"])


@pytest.mark.parametrize("name", [o.name for o in OPTIONS])
def test_every_option_reaches_the_same_field_from_the_cli_run_and_a_file(name, tmp_path, monkeypatch):
    assert name in SAMPLES, f"option {name!r} has no sample value in tests/test_options.py"
    value, expected, companions = SAMPLES[name]
    monkeypatch.chdir(tmp_path)
    values = {"method": "standard-rag", "dataset": "demo", "runs_dir": str(tmp_path), **companions, name: value}
    if name == "dataset_file":
        del values["dataset"]
    built = cli_config(values)
    assert leaf(built, BY_NAME[name].target) == expected
    assert run_config(values, monkeypatch) == built
    in_file = file_config(values, name)
    assert in_file is None or in_file == built, name
    if name in ("retriever", "reranker", "rerank_depth"):  # a row's own, and the file's for every row
        table = experiment_from_dict({"name": "t", "datasets": ["demo"], name: value, **companions,
                                      "rows": [{"method": "standard-rag"}]})
        assert eval_config(table, table.rows[0], "demo", str(tmp_path)) == built


def test_the_model_flags_of_every_command_leave_an_unset_option_to_the_spec():
    """`train-agent --n-ctx` overrides the recipe's window only when given; `ask` reads its retriever and
    reranker itself, so they hold the config's defaults."""
    parser = build_parser()
    agent = parser.parse_args(["train-agent", "--out", "x"])
    assert agent.n_ctx is None and agent.llm == "hf-0.5b"
    ask = parser.parse_args(["ask", "Where?"])
    assert (ask.retriever, ask.reranker, ask.rerank_depth) == ("bm25", "none", 20)
    assert llm_spec_from_args(ask) == LLMSpec()
    assert llm_spec_from_args(parser.parse_args(["ask", "Where?", "--no-cache", "--threads", "2"])) == LLMSpec(
        n_threads=2, response_cache=False)


def test_a_row_label_names_its_retriever_and_reranker_and_parses_back():
    row = Row("standard-rag", (("k", "3"),), retriever="hybrid", reranker="listwise", rerank_depth=10)
    assert row.label == "standard-rag:retriever=hybrid,reranker=listwise,rerank_depth=10,k=3"
    assert Row.parse(row.label) == row
    with pytest.raises(ConfigError, match="rerank_depth must be a whole number"):
        Row.parse("standard-rag:rerank_depth=many")
    with pytest.raises(ConfigError, match="rows\\[0\\]: reranker must be a str"):
        experiment_from_dict({"name": "t", "datasets": ["demo"], "rows": [{"method": "cot", "reranker": 3}]})


def test_bm25_against_bm25_with_a_listwise_reranker_is_one_table_with_the_eval_commands_run_ids(tmp_path, capsys):
    """An experiment row with its own retriever and reranker runs (a scripted model), in the same table as a
    plain row, and each cell's run folder is the one the same `metarag eval` command names."""
    with FakeOpenAIServer(0, answer="Paris") as server:
        llm = f"openai:fake@{server.url}"
        experiment = experiment_from_dict({
            "name": "rerank", "datasets": ["demo"], "limit": 2, "llm": llm, "reference": "standard-rag",
            "columns": "method,retriever,reranker,n,failed,EM",
            "rows": [{"method": "standard-rag"},
                     {"method": "standard-rag", "retriever": "bm25", "reranker": "listwise", "rerank_depth": 5}]})
        reports = run_experiment(experiment, tmp_path / "runs", progress=False, log=lambda line: None)
        assert server.requests > 0
    (report,) = reports
    rows = [line for line in report.splitlines() if line.startswith("| standard-rag")]
    assert [row.split(" | ")[2] for row in rows] == ["–", "listwise"]
    for row, extra in zip(experiment.rows, ([], ["--reranker", "listwise", "--rerank-depth", "5"])):
        assert main(["eval", "--method", "standard-rag", "--dataset", "demo", "--limit", "2", "--llm", llm,
                     "--runs-dir", str(tmp_path / "runs"), *extra, "--print-run-dir"]) == 0
        folder = capsys.readouterr().out.strip()
        assert str(resolve(eval_config(experiment, row, "demo", tmp_path / "runs")).folder) == folder
        settings = json.loads((Path(folder) / "settings.json").read_text())
        assert settings.get("reranker", {}).get("depth") == (5 if extra else None)


@pytest.mark.embedded
def test_bm25_against_hybrid_with_a_listwise_reranker_is_one_table(tmp_path):
    """The comparison the row fields are for: BM25 against hybrid retrieval (MiniLM + BM25, fused) reranked
    listwise, one experiment, one report with both rows and a paired test between them."""
    with FakeOpenAIServer(0, answer="Paris") as server:
        experiment = experiment_from_dict({
            "name": "hybrid", "datasets": ["demo"], "limit": 2, "llm": f"openai:fake@{server.url}",
            "reference": "standard-rag", "rows": [{"method": "standard-rag"},
                                                  {"method": "standard-rag", "retriever": "hybrid",
                                                   "reranker": "listwise"}]})
        (report,) = run_experiment(experiment, tmp_path / "runs", progress=False, log=lambda line: None)
    header = next(line for line in report.splitlines() if line.startswith("| method"))
    assert header.startswith("| method | retriever | reranker |")  # the reranker beside the retriever, unasked
    cells = [line.split(" | ")[1:3] for line in report.splitlines() if line.startswith("| standard-rag")]
    assert cells == [["bm25", "–"], ["hybrid", "listwise"]]
    assert "Against standard-rag-demo-" in report


def test_a_run_is_resolved_against_every_registry_before_anything_loads(tmp_path):
    def config(**given):
        return EvalConfig(**{"method": "standard-rag", "dataset": DatasetSpec(preset="demo"),
                             "runs_dir": str(tmp_path), **given})

    for given, message in (({"method": "standard-rgx"}, "unknown method"),
                           ({"llm": LLMSpec(backend="gguf")}, "needs a model path"),
                           ({"judge_llm": "embeded"}, "unknown LLM back-end 'embeded'"),
                           ({"retriever": "bm52"}, "unknown retriever 'bm52'"),
                           ({"reranker": "listwize"}, "unknown reranker 'listwize'"),
                           ({"overrides": {"k": "0"}}, "'k' must be >= 1"),
                           ({"dataset": DatasetSpec(preset="hotpotqa-dev5000")}, "hotpotqa-dev5000")):
        with pytest.raises(ConfigError, match=message) as caught:
            resolve(config(**given))
        assert "\n" not in str(caught.value)
    run = resolve(config(reranker="listwise", rerank_depth=5))
    assert run.reranker_settings is not None and run.settings["reranker"]["depth"] == 5
    assert run.folder.parent == tmp_path and not run.folder.exists()
    with pytest.raises(ConfigError, match="unknown retriever 'bm52'"):  # metarag.run checks it too
        metarag.run("standard-rag", "demo", retriever="bm52", runs_dir=tmp_path)


def test_metarag_evaluate_is_the_package_and_calling_it_names_run():
    with pytest.raises(TypeError, match=r"metarag\.run\(method, dataset"):
        metarag.evaluate("standard-rag", "demo")
    from metarag import evaluate
    from metarag.evaluate import harness

    assert evaluate.harness is harness
