"""Nothing silent, nothing unbounded (issue 55): a run folder takes one model; a dead or failing judge
fails the eval; counts are bounded by what the run can have; method names stay inside the runs folder
and registrations are checked; a server that never completes opens a circuit breaker; a retrieval service
over another corpus and a format the file contradicts are refused; run ids hash a corpus by its content;
`view` refuses a folder that is not there."""
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_openai import FakeOpenAIServer
from servers import free_port
from test_harness import config, reader, write_hotpot

import metarag
from metarag.cli import main
from metarag.errors import BackendError, ConfigError, DataError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, Samples, evaluate, prepare
from metarag.evaluate.runs import RunStore, Shard
from metarag.llm.scripted import ScriptedLLM
from metarag.settings import settings_hash

METARAG = str(Path(sys.executable).parent / "metarag")


# ------------------------------------------------------------------------- 1. one model per run
def test_a_run_made_with_a_scripted_model_is_not_read_as_the_embedded_models(tmp_path, capsys):
    """The probe's case: `metarag.run(..., llm_instance=ScriptedLLM)` wrote the folder a plain eval names;
    that eval refused it, naming both models, instead of printing the scripted answers as its own."""
    scripted = metarag.run("standard-rag", "demo", limit=2, seed=316, runs_dir=tmp_path,
                           llm_instance=ScriptedLLM(default="Nobody"))
    argv = ["eval", "--method", "standard-rag", "--dataset", "demo", "--limit", "2", "--seed", "316",
            "--runs-dir", str(tmp_path), "--quiet"]
    assert main([*argv, "--print-run-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(scripted.path)  # the same folder: the run id is kept
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert (f"run folder {scripted.path} holds the answers of scripted:scripted, not of "
            "llama.cpp:qwen2.5-coder-1.5b-instruct:sha256=") in err


def test_a_model_passed_in_cannot_resume_or_take_over_another_models_run(tmp_path):
    cfg = config(tmp_path)
    evaluate(replace(cfg, dataset=replace(cfg.dataset, limit=3)), progress=False, llm=reader())
    other = ScriptedLLM([("Passages:", "Rome")], name="other")
    with pytest.raises(ConfigError, match="holds the answers of scripted:scripted, not of scripted:other"):
        evaluate(replace(cfg, dataset=replace(cfg.dataset, limit=3)), progress=False, llm=other)  # all done
    assert other.prompts == []
    store, _ = evaluate(cfg, progress=False, llm=reader())  # the same model finishes the run
    with FakeOpenAIServer(free_port(), answer="Paris") as server:
        served = metarag.run("standard-rag", str(tmp_path / "hotpot.json"), runs_dir=tmp_path / "served",
                             llm=f"openai:fake@{server.url}", limit=2)
        results = served.path / "results.jsonl"
        results.write_text(results.read_text().splitlines(keepends=True)[0])  # killed before its last question
        with pytest.raises(ConfigError, match=f"holds the answers of openai:fake@{server.url}, not of scripted"):
            metarag.run("standard-rag", str(tmp_path / "hotpot.json"), runs_dir=tmp_path / "served",
                        llm=f"openai:fake@{server.url}", limit=2, llm_instance=reader())
        assert len(results.read_text().splitlines()) == 1  # nothing written into it
        metarag.run("standard-rag", str(tmp_path / "hotpot.json"), runs_dir=tmp_path / "served",
                    llm=f"openai:fake@{server.url}", limit=2)  # its own model finishes it
    assert len(results.read_text().splitlines()) == 2


# ------------------------------------------------------------------------------------ 3. judge
def test_a_dead_judge_fails_before_the_first_question(tmp_path, capsys):
    with FakeOpenAIServer(free_port(), answer="Paris") as server:
        code = main(["eval", "--method", "closed-book", "--dataset", "demo", "--limit", "2", "--llm",
                     f"openai:fake@{server.url}", "--judge-llm", "openai:x@http://127.0.0.1:9/v1",
                     "--runs-dir", str(tmp_path), "--quiet", "--no-cache"])
        assert code == 1 and server.received == 0
    err = capsys.readouterr().err
    assert err.startswith("metarag: error: judge LLM health check failed before the first question: LLM server "
                          "at http://127.0.0.1:9/v1 is not reachable")


def test_failed_judge_requests_are_marked_in_the_main_table_and_fail_the_eval(tmp_path, capsys, monkeypatch):
    import metarag.errors

    monkeypatch.setattr(metarag.errors, "time", SimpleNamespace(sleep=lambda s: None))  # no backoff waits
    with FakeOpenAIServer(free_port(), answer="Paris") as model, \
            FakeOpenAIServer(free_port(), mode="error-completions") as judge:
        code = main(["eval", "--method", "closed-book", "--dataset", "demo", "--limit", "2", "--llm",
                     f"openai:fake@{model.url}", "--judge-llm", f"openai:judge@{judge.url}",
                     "--runs-dir", str(tmp_path), "--quiet", "--no-cache"])
    out, err = capsys.readouterr()
    assert code == 1
    header, _, row = out.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["judge acc"] == "0.00 !" and cells["failed"] == "0"
    assert "judge acc: the judge's requests failed on 2 of 2 answers" in out
    assert "metarag: error: 2 answer-judge request(s) failed" in err


# ---------------------------------------------------------------------------------- 4. bounds
def test_samples_and_shards_are_bounded_by_what_a_run_can_have(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--samples 99999999999999999999: at most 1024 answers per question"):
        Samples(99999999999999999999)
    cfg = config(tmp_path)  # six questions
    huge = Shard.parse("99999999999999999999/99999999999999999999")
    with pytest.raises(ConfigError, match="6 questions cannot be split 99999999999999999999 ways; give N at most 6"):
        evaluate(replace(cfg, shard=huge), progress=False, llm=reader())
    with pytest.raises(ConfigError, match="6 questions cannot be split 7 ways"):
        evaluate(replace(cfg, shard=Shard(1, 7)), progress=False, llm=reader())
    assert not list((tmp_path / "runs").glob("*/shards.json"))  # nothing written for a count it cannot have
    store, results = evaluate(replace(cfg, shard=Shard(1, 2)), progress=False, llm=reader())
    assert len(results) == 3 and json.loads(store.shards_path.read_text()) == {"count": 2}
    store.shards_path.write_text(json.dumps({"count": 99999999999999999999}))  # as an older version wrote
    with pytest.raises(DataError, match="splits the run 99999999999999999999 ways, more than its 6 questions"):
        store.missing_shards(json.loads(store.questions_path.read_text()), {})
    base = ["eval", "--method", "closed-book", "--dataset", "demo", "--runs-dir", str(tmp_path / "cli")]
    assert main([*base, "--shard="]) == 1
    assert "--shard '': give I/N" in capsys.readouterr().err
    assert main([*base, "--samples", "99999999999999999999"]) == 1
    assert "at most 1024 answers per question" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 5. method names
@dataclass(frozen=True)
class _Settings:
    k: int = 1


class _Method:
    settings_class = _Settings

    def __init__(self, settings):
        self.settings, self.name = settings, "mine"

    def policy(self, question):
        yield from ()


@pytest.mark.parametrize("name", ["../../escape", "", 123, "Upper", "a/b", ".hidden", "-dash"])
def test_a_method_name_that_is_no_plain_name_is_refused(name):
    from metarag.methods.registry import method_names

    with pytest.raises(ConfigError, match="use lowercase letters, digits"):
        metarag.register_method(name, _Method)
    assert name not in method_names()


def test_registration_checks_the_class_and_its_settings_class():
    @dataclass
    class Loose:
        k: int = 1

    @dataclass(frozen=True)
    class Required:
        k: int

    for method, settings, message in ((object(), _Settings, "give the method's class, not object instance"),
                                      (_Method, _Settings(), "give its settings dataclass, the class itself"),
                                      (_Method, Loose, "must be a frozen dataclass"),
                                      (_Method, Required, "cannot be made with its defaults")):
        with pytest.raises(ConfigError, match=message):
            metarag.register_method("checked", method, settings)


def test_a_plugin_named_like_a_builtin_method_is_warned_about(tmp_path, monkeypatch, caplog):
    import metarag.methods.registry as registry

    info = tmp_path / "shadow_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[metarag.methods]\nircot = shadow_pkg:Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    caplog.set_level(logging.WARNING, logger="metarag")
    registry.method_names()
    assert "the method 'ircot' of package shadow-pkg (shadow_pkg:Mine) has the name of one of metarag's own " \
           "methods" in caplog.text
    assert registry.method_classes("ircot")[0].__module__ == "metarag.methods.ircot"


# -------------------------------------------------------------------------- 6. circuit breaker
def test_a_server_that_never_completes_opens_the_circuit_and_stops_the_run(tmp_path):
    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

    with FakeOpenAIServer(free_port(), mode="hang-completions") as server:
        llm = OpenAICompatLLM(OpenAISettings(base_url=server.url, model="fake", timeout_s=0.3, backoff_s=0.01))
        start = time.monotonic()
        with pytest.raises(BackendError, match=rf"stopped: LLM health check failed after q0 failed: LLM server at "
                                               rf"{server.url}: 2 requests in a row got no answer within 0.3 s"):
            evaluate(config(tmp_path), progress=False, llm=llm)
        assert server.received == 2 and time.monotonic() - start < 3  # two timeouts, not 5 per question
        with pytest.raises(BackendError, match="so no more are sent") as err:
            llm.complete("Question: anything?")
        assert err.value.retryable and server.received == 2  # refused at once, nothing sent
    results = RunStore(next((tmp_path / "runs").iterdir())).load_results()
    assert list(results) == ["q0"] and results["q0"].retryable  # a re-run tries it again


def test_ask_checks_a_served_model_before_it_asks(capsys):
    start = time.monotonic()
    assert main(["ask", "Where?", "--method", "closed-book", "--llm", "openai:fake@http://127.0.0.1:9/v1",
                 "--no-cache"]) == 1
    assert time.monotonic() - start < 10  # not five tries with backoff
    assert capsys.readouterr().err.startswith("metarag: error: LLM server at http://127.0.0.1:9/v1 is not reachable")


# ---------------------------------------------------------------------------- 7. mismatches
def test_a_retrieval_service_over_another_corpus_is_refused(tmp_path):
    pytest.importorskip("fastapi")
    from conftest import CITIES

    from metarag.data.datasets import load_dataset
    from metarag.retrieve.memory import MemoryRetriever
    from metarag.retrieve.remote import RemoteRetriever
    from metarag.retrieve.service import BackgroundService

    cfg = config(tmp_path)
    with BackgroundService.start(MemoryRetriever(CITIES)) as service:
        with pytest.raises(ConfigError, match=rf"the retrieval service at {service.url} serves another corpus "
                                              r"\(fingerprint \w{12}\) than hotpot's \(12 passages"):
            evaluate(cfg, progress=False, llm=reader(), retriever=RemoteRetriever(service.url))
    assert not list((tmp_path / "runs").glob("*/results.jsonl"))
    own = MemoryRetriever(list(load_dataset(tmp_path / "hotpot.json").passages))
    with BackgroundService.start(own) as service:
        _, results = evaluate(cfg, progress=False, llm=reader(), retriever=RemoteRetriever(service.url))
    assert len(results) == 6 and all(r.scores.em == 1.0 for r in results)


def test_a_format_the_files_content_contradicts_is_refused(tmp_path):
    from metarag.data.datasets import load_dataset

    record = {"_id": "w1", "question": "Who directed Up?", "answer": "Pete Docter", "type": "compositional",
              "context": [["Up", ["Up is a film by Pete Docter."]]], "supporting_facts": [["Up", 0]],
              "evidences": [["Up", "director", "Pete Docter"]]}
    path = tmp_path / "2wiki.json"
    path.write_text(json.dumps([record]))
    assert load_dataset(path).format == "2wiki"
    with pytest.raises(DataError, match=r"2wiki.json: record 0: the format 'hotpotqa' contradicts the file's content: "
                                        r"its records read as 2wiki"):
        load_dataset(path, "hotpotqa")
    del record["evidences"]  # a context without 2Wiki's evidences or HotpotQA's level: either format
    path.write_text(json.dumps([record]))
    assert load_dataset(path, "2wiki").format == "2wiki" and load_dataset(path, "hotpotqa").format == "hotpotqa"
    with pytest.raises(DataError, match="the format 'musique' contradicts"):
        load_dataset(write_hotpot(tmp_path / "h.json"), "musique")


# ------------------------------------------------------------------------- 8. corpus by content
def _corpus_config(tmp_path: Path, corpus: Path, method: str = "standard-rag") -> EvalConfig:
    return EvalConfig(method=method, dataset=DatasetSpec(file=str(tmp_path / "hotpot.json"), corpus=str(corpus)),
                      runs_dir=str(tmp_path / "runs"))


def _write_corpus(path: Path, extra: str = "") -> Path:
    from metarag.data.datasets import load_dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    passages = load_dataset(path.parents[1] / "hotpot.json").passages
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text + extra}) + "\n"
                            for p in passages))
    return path


def test_a_corpus_is_hashed_into_the_run_id_by_content_not_by_path(tmp_path):
    write_hotpot(tmp_path / "hotpot.json")
    first = _write_corpus(tmp_path / "a" / "corpus.jsonl")
    moved = tmp_path / "b" / "corpus.jsonl"
    moved.parent.mkdir()
    shutil.copy(first, moved)
    store, method, _, resolved = prepare(_corpus_config(tmp_path, first))
    assert prepare(_corpus_config(tmp_path, moved))[0].path == store.path  # a moved data folder keeps its runs
    assert resolved["dataset"]["corpus"] == str(first)  # settings.json keeps the path, for the reader
    _write_corpus(moved.parent.parent / "b" / "corpus.jsonl", extra=" Changed.")
    assert prepare(_corpus_config(tmp_path, moved))[0].path != store.path  # other content, other run
    # a closed-book run has no fingerprint: its id still hashes the path, so kept closed-book runs stay put
    closed = prepare(_corpus_config(tmp_path, first, "closed-book"))
    assert closed[0].path.name.endswith(settings_hash(closed[3]))


def test_a_run_named_by_its_corpus_path_resumes_from_anywhere_and_nothing_finished_runs_again(tmp_path):
    """A folder made before ids left the path out is named by a hash of its settings with the path in."""
    write_hotpot(tmp_path / "hotpot.json")
    first = _write_corpus(tmp_path / "data" / "corpus.jsonl")
    store, _ = evaluate(_corpus_config(tmp_path, first), progress=False, llm=reader())
    settings = json.loads(store.settings_path.read_text())
    legacy = store.path.with_name(store.path.name.rsplit("-", 1)[0] + "-" + settings_hash(settings))
    store.path.rename(legacy)  # as the older id named it
    moved = tmp_path / "elsewhere" / "corpus.jsonl"
    moved.parent.mkdir()
    shutil.copy(first, moved)
    assert prepare(_corpus_config(tmp_path, moved))[0].path == legacy
    again = ScriptedLLM([])
    _, results = evaluate(_corpus_config(tmp_path, moved), progress=False, llm=again)
    assert again.prompts == [] and len(results) == 6 and all(r.scores.em == 1.0 for r in results)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [legacy.name]


# --------------------------------------------------------------------------------------- 9. view
def test_view_refuses_a_folder_that_is_not_there_and_serves_an_empty_one(tmp_path):
    done = subprocess.run([METARAG, "view", str(tmp_path / "no" / "such"), "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == f"metarag: error: {tmp_path / 'no' / 'such'}: no such folder (metarag view takes " \
                                  "run folders, runs/<run-id>, or a folder of them)"
    starting = tmp_path / "starting"
    starting.mkdir()
    view = subprocess.Popen([METARAG, "view", str(starting), "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("serving" in line for line in lines):
            line = view.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
    finally:
        view.terminate()
        view.wait(30)
    assert os.path.isdir(starting)
