"""scripts/run-table: every row of a paper's table on the same questions, then one report against the
reference row (here against a fake OpenAI-compatible server: no model)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from fake_openai import FakeOpenAIServer

SCRIPT = Path(__file__).parents[1] / "scripts" / "run-table"
METARAG = str(Path(sys.executable).parent / "metarag")


def run_table(tmp_path, url, *args, **env):
    full = {**os.environ, "METARAG": METARAG, "METARAG_RUNS": str(tmp_path / "runs"), "LIMIT": "2",
            "EXTRA": f"--llm openai --model fake --base-url {url}", **env}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=300)


ROWS = "standard-rag metarag:similarity=token-f1,max_iter=1"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rows_run_on_the_same_questions_and_are_reported_against_the_reference(tmp_path):
    port = free_port()
    with FakeOpenAIServer(port, answer="Paris") as server:
        out = run_table(tmp_path, server.url, "study", "demo", ROWS=ROWS)
    assert out.returncode == 0, out.stderr
    assert "## study table on demo (limit 2, seed 0)" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and " demo | 2 |" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| standard-rag", "| metarag"]  # the table's order
    assert "against metarag-demo-openai-" in out.stdout
    assert "### metarag-demo-openai-" in out.stdout  # the breakdown of each run
    assert (tmp_path / "runs" / "study-demo.csv").is_file()
    # a second call resumes: nothing is asked again, the same table comes out
    with FakeOpenAIServer(port, answer="Paris") as server:
        again = run_table(tmp_path, server.url, "study", "demo", ROWS=ROWS)
        assert server.requests == 0
    assert again.stdout == out.stdout
    # the row's --set values went into its run: max_iter=1, token-f1 similarity
    (metarag_run,) = (tmp_path / "runs").glob("metarag-demo-*")
    settings = json.loads((metarag_run / "settings.json").read_text())["method_settings"]
    assert settings["max_iter"] == 1 and settings["similarity"] == "token-f1"


def test_running_one_row_keeps_the_finished_rows_in_the_report_and_csv(tmp_path):
    port = free_port()
    with FakeOpenAIServer(port, answer="Paris") as server:
        first = run_table(tmp_path, server.url, "study", "demo", ROWS="standard-rag")
        assert first.returncode == 0, first.stderr
        second = run_table(tmp_path, server.url, "study", "demo", ROWS="closed-book")
    assert second.returncode == 0, second.stderr
    assert "== closed-book on demo" in second.stderr and "== standard-rag" not in second.stderr  # runs only ROWS
    csv = (tmp_path / "runs" / "study-demo.csv").read_text().splitlines()
    assert [line.split(",")[0].split("-demo-")[0] for line in csv[1:]] == ["closed-book", "standard-rag"]  # table order


def test_unknown_tables_are_refused():
    bad = subprocess.run([str(SCRIPT), "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown table 'nonsense'" in bad.stderr


def test_the_agent_table_retrieves_from_the_wiki_corpus_where_a_benchmark_has_no_paragraphs(tmp_path):
    import pytest
    from conftest import SHARED_DATA

    if not (SHARED_DATA / "bamboogle").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text("".join(json.dumps({"id": f"w{i}", "contents": f"Title {i}\nPassage number {i}."}) + "\n"
                            for i in range(5)))
    port = free_port()
    with FakeOpenAIServer(port, answer="<answer>Paris</answer>") as server:
        out = run_table(tmp_path, server.url, "agent", "bamboogle",
                        ROWS="standard-rag belief-agent:probe=true belief-agent",
                        WIKI_CORPUS=str(wiki), METARAG_DATA_DIR=str(SHARED_DATA))
    assert out.returncode == 0, out.stderr
    assert "## agent table on bamboogle (limit 2, seed 0)" in out.stdout
    rows = [line.split(" | ")[0] for line in out.stdout.splitlines() if " bamboogle | 2 |" in line]
    assert rows == ["| standard-rag", "| belief-agent (probe=False)", "| belief-agent (probe=True)"]  # table order
    plain = next(r for r in (tmp_path / "runs").glob("belief-agent-bamboogle-*")
                 if not json.loads((r / "settings.json").read_text())["method_settings"]["probe"])
    assert f"against {plain.name}" in out.stdout  # the reference: the paper's method with its defaults
    for run in (tmp_path / "runs").glob("*-bamboogle-*"):
        dataset = json.loads((run / "settings.json").read_text())["dataset"]
        assert dataset["corpus"] == str(wiki), run.name


def test_the_aligned_evoctx_table_runs_the_papers_budget_where_a_method_exposes_it(tmp_path):
    """EvoCtx §4.1 aligns its baselines to T = 8 rounds and k = 5 passages; rows whose own defaults
    already are that share their run with the evoctx table."""
    port = free_port()
    with FakeOpenAIServer(port, answer="Paris") as server:
        out = run_table(tmp_path, server.url, "evoctx-aligned", "demo", ROWS="ircot:k=5,max_steps=8 kirag:k=5,T=8")
        assert out.returncode == 0, out.stderr
        plain = run_table(tmp_path, server.url, "evoctx", "demo", ROWS="ircot")
    assert plain.returncode == 0, plain.stderr
    runs = {p.name.split("-demo-")[0] + ":" + json.dumps(
        {k: v for k, v in json.loads((p / "settings.json").read_text())["method_settings"].items()
         if k in ("k", "T", "max_steps")}, sort_keys=True) for p in (tmp_path / "runs").glob("*-demo-*")}
    assert runs == {'ircot:{"k": 5, "max_steps": 8}', 'ircot:{"k": 6, "max_steps": 10}', 'kirag:{"T": 8, "k": 5}'}
    assert (tmp_path / "runs" / "evoctx-aligned-demo.csv").is_file()
