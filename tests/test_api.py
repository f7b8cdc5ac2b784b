"""The public API (`metarag.run`, `Run`, `register_method`) and methods from other packages
(the `metarag.methods` entry-point group), run from docs/tutorial.md's own code: in-process on a
scripted model, then as an installed package's method through `metarag eval`, `report` and
`methods` against a fake OpenAI-compatible server."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer

import metarag
from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.records import Score

TUTORIAL = Path(__file__).parents[1] / "docs" / "tutorial.md"
METARAG = str(Path(sys.executable).parent / "metarag")


def tutorial_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_import_metarag_gives_the_public_names_lazily():
    code = ("import sys, metarag; heavy = [m for m in ('torch', 'transformers', 'llama_cpp', 'metarag.api') "
            "if m in sys.modules]; assert not heavy, heavy; from metarag import run, Run, register_method, "
            "Method, Search, Ask, Probe, Note, Assess, Clip, Decoding, Question, Message; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
    with pytest.raises(AttributeError, match="no attribute 'rn'"):
        metarag.rn  # noqa: B018


def test_the_tutorials_scripted_block_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its run folders go to ./runs-scripted
    namespace: dict = {}
    exec(tutorial_blocks()[0], namespace)
    exec(tutorial_blocks()[1], namespace)
    assert namespace["trace"].usage.retrieval_calls == 2 and (tmp_path / "runs-scripted").is_dir()
    with pytest.raises(ConfigError, match="'k' must be >= 1, got 0"):  # the tutorial's ranges are enforced
        metarag.run("checked-rag", "demo", limit=1, settings={"k": 0}, llm_instance=namespace["llm"])


@pytest.mark.embedded
def test_the_tutorials_embedded_block_runs(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    monkeypatch.setenv("METARAG_RUNS", str(tmp_path / "runs"))
    namespace: dict = {}
    exec(tutorial_blocks()[0], namespace)
    exec(tutorial_blocks()[2], namespace)
    assert "| checked-rag |" in namespace["base"].table(namespace["mine"])


def test_the_tutorials_method_runs_in_process_beside_standard_rag(tmp_path):
    namespace: dict = {}
    exec(tutorial_blocks()[0], namespace)  # defines CheckedRAG and registers it as "checked-rag"
    llm = ScriptedLLM([("Write one search query", "Gustave Eiffel birthplace"), ("Short answer:", "Paris")],
                      [("Do the passages answer it", {"Yes": 0.2, "No": 0.8})])
    mine = metarag.run("checked-rag", "demo", limit=2, runs_dir=tmp_path, llm_instance=llm,
                            settings={"threshold": 0.6})
    base = metarag.run("standard-rag", "demo", limit=2, runs_dir=tmp_path, llm_instance=llm)
    assert mine.path.name.startswith("checked-rag-demo-") and mine.settings["method_settings"]["threshold"] == 0.6
    trace = mine.records[0].trace
    assert [s.purpose for s in trace.steps if isinstance(s, Score)] == ["enough"]
    assert trace.usage.retrieval_calls == 2  # P(Yes) 0.2 < 0.6: a second search
    table = base.table(mine)
    assert "| standard-rag |" in table and "| checked-rag |" in table and "p EM" in table
    frame = mine.results
    assert list(frame["question_id"]) == [r.question_id for r in mine.records] and set(frame["searches"]) == {2}
    again = metarag.run("checked-rag", "demo", limit=2, runs_dir=tmp_path, llm_instance=ScriptedLLM([]),
                             settings={"threshold": 0.6})  # resumed: nothing asked of the model
    assert again.records == mine.records
    batched = metarag.run("checked-rag", "demo", limit=2, runs_dir=tmp_path / "batched", llm_instance=llm,
                          settings={"threshold": 0.6}, batch=2)  # both questions in lockstep: the same answers
    assert [r.trace.answer for r in batched.records] == [r.trace.answer for r in mine.records]
    with pytest.raises(ConfigError, match="--batch must be at least 1"):  # the value reaches the harness
        metarag.run("checked-rag", "demo", limit=2, runs_dir=tmp_path / "zero", llm_instance=llm, batch=0)
    with pytest.raises(ConfigError, match="one of metarag's own methods"):
        metarag.register_method("ircot", namespace["CheckedRAG"])


def test_an_installed_packages_method_runs_through_eval_report_and_methods(tmp_path):
    site = tmp_path / "site"
    package = site / "checked_pkg"
    package.mkdir(parents=True)
    code = tutorial_blocks()[0].replace('metarag.register_method("checked-rag", CheckedRAG)', "")
    (package / "__init__.py").write_text(code)
    info = site / "checked_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: checked-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[metarag.methods]\nchecked-rag = checked_pkg:CheckedRAG\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def cli(*args):
        return subprocess.run([METARAG, *args], capture_output=True, text=True, env=env, timeout=300)

    listed = cli("methods")
    assert listed.returncode == 0 and "| checked-rag |" in listed.stdout
    assert "| Retrieve, ask whether the passages answer the question" in listed.stdout  # its docstring's first line
    assert "| threshold | float | 0.5 |" in cli("methods", "checked-rag").stdout
    with FakeOpenAIServer(free_port(), answer="Paris") as server:
        run = cli("eval", "--method", "checked-rag", "--dataset", "demo", "--limit", "2", "--set", "k=3",
                  "--llm", "openai", "--model", "fake", "--base-url", server.url, "--runs-dir", str(tmp_path / "runs"),
                  "--quiet", "--no-cache")
    assert run.returncode == 0, run.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    assert json.loads((folder / "settings.json").read_text())["method_settings"]["k"] == 3
    report = cli("report", str(folder))
    assert report.returncode == 0 and "| checked-rag |" in report.stdout


@pytest.mark.embedded
def test_the_readmes_python_example_runs_on_the_embedded_model(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("pandas")
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "metarag.run(" in b]
    monkeypatch.setenv("METARAG_RUNS", str(tmp_path / "runs"))
    namespace: dict = {}
    exec(block, namespace)
    run = namespace["run"]
    assert len(run.records) == 2 and not any(r.failed for r in run.records)
    assert "| standard-rag |" in run.table() and list(run.results.columns)[:3] == ["question_id", "golds",
                                                                                   "prediction"]
