"""`metarag view`'s JSON endpoints (FastAPI's test client) over run folders made with the scripted
model: the report table as `metarag report` computes it, the question list's filters, sorting, paging
and paired wins, a question's traces, and bad input said on the page (a folder that is no run, a torn
results.jsonl line, a step kind this metarag does not know) instead of failing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the viewer needs fastapi: pip install 'metarag[view]'")

from fastapi.testclient import TestClient  # noqa: E402
from test_harness import answer_from_prompt, reader, write_hotpot  # noqa: E402

from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate, score  # noqa: E402
from metarag.evaluate.report import load_run, report_table  # noqa: E402
from metarag.evaluate.runs import RunStore  # noqa: E402
from metarag.llm.scripted import ScriptedLLM  # noqa: E402
from metarag.view.server import create_app  # noqa: E402


def make_runs(root: Path) -> dict[str, Path]:
    """Three scripted runs over the same six HotpotQA questions: a reader that finds each capital
    (all right), one that always says Paris (right for France only) and IterDRAG saying Paris."""
    root.mkdir(parents=True, exist_ok=True)
    data = write_hotpot(root / "hotpot.json")

    def config(method: str, folder: str) -> EvalConfig:
        return EvalConfig(method=method, dataset=DatasetSpec(file=str(data)), runs_dir=str(root / folder))

    good, _ = evaluate(config("standard-rag", "good"), progress=False, llm=reader())
    paris, _ = evaluate(config("standard-rag", "paris"), progress=False, llm=ScriptedLLM([], default="Paris"))
    iterdrag, _ = evaluate(config("iterdrag", "iter"), progress=False,
                           llm=ScriptedLLM([("Follow up", "So the final answer is: Paris.")], default="Paris"))
    return {"good": good.path, "paris": paris.path, "iterdrag": iterdrag.path, "data": data}


def make_evoctx_run(root: Path, corpus) -> Path:
    """An EvoCtx run of one question (the scripted model, a stub encoder, oracle margins on): the
    boundary overrules a THINK, then agrees, then the model answers."""
    from test_evoctx import Q, run_case

    from metarag.records import Question

    trace, _ = run_case("retrieve-think-answer", corpus)
    question = Question(Q.id, Q.text, Q.answers, supporting_ids=("p2",))
    store = RunStore(root / "evoctx-run")
    store.write_json("settings.json", {"method": "evoctx", "method_settings": {"k": 2, "tau_near": 0.3,
                                                                               "tau_cent": 0.2, "tau_90": 0.4}})
    store.write_json("questions.json", [Q.id])
    with store.open_for_append() as handle:
        store.append(score(question, trace), handle)
    return store.path


def make_flaky_run(root: Path, data: Path) -> Path:
    """The reader again, but the model crashes on Spain's question: a failed question, scored 0."""
    def flaky(prompt):
        if "Spain" in prompt.rsplit("Question:", 1)[1]:
            raise RuntimeError("model crashed")
        return answer_from_prompt(prompt)

    config = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)), runs_dir=str(root / "flaky"))
    return evaluate(config, progress=False, llm=ScriptedLLM([("Passages:", flaky)]))[0].path


def make_rerank_run(root: Path) -> Path:
    """One question whose retrieval of three passages a reranker cut to two, the last first."""
    from metarag.evaluate.runs import QuestionResult
    from metarag.metrics import AnswerScores
    from metarag.records import Answer, Generate, Hit, Message, Passage, Rerank, Retrieve, Trace, Usage

    passages = [Passage("a", "Alpha", "Alpha text."), Passage("b", "Beta", "Beta text."),
                Passage("c", "Gamma", "Gamma is the answer.")]
    hits = tuple(Hit(p, 3.0 - i, "bm25") for i, p in enumerate(passages))
    steps = (Retrieve(Usage(retrieval_calls=1), "Which?", 3, hits),
             Rerank(Usage(llm_requests=3, prompt_tokens=300, latency_s=0.3), "llm", "Which?", ("a", "b", "c"),
                    (Hit(passages[2], 0.9, "llm"), Hit(passages[0], 0.4, "llm"))),
             Generate(Usage(llm_requests=1, prompt_tokens=40, completion_tokens=4, latency_s=0.1), "reason",
                      (Message("user", "Think about: Which?"),), "Gamma is the", cut=True),
             Generate(Usage(llm_requests=1, prompt_tokens=80, completion_tokens=2, latency_s=0.1), "answer",
                      (Message("user", "Passages: ... Question: Which?"),), "Gamma"),
             Answer(Usage(), "Gamma"))
    trace = Trace("r1", "Which?", "standard-rag", steps, answer="Gamma")
    store = RunStore(root / "rerank-run")
    store.write_json("settings.json", {"method": "standard-rag", "reranker": {"spec": "llm", "depth": 3}})
    store.write_json("questions.json", ["r1"])
    with store.open_for_append() as handle:
        store.append(QuestionResult("r1", ("Gamma",), "Gamma", AnswerScores(1, 1, 1, 1, 1), 1.0, 1.0, trace), handle)
    return store.path


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    return make_runs(tmp_path / "runs")


def client(*paths) -> TestClient:
    return TestClient(create_app([str(p) for p in paths]))


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_runs_table_is_the_report_table(runs):
    paths = [runs["good"], runs["paris"], runs["iterdrag"]]
    data = ok(client(*paths).get("/api/runs"))
    markdown, rows = report_table([load_run(p) for p in paths], baseline=0)
    table = data["table"]
    assert table["markdown"] == markdown  # the very text `metarag report` prints
    assert table["columns"][:7] == ["method", "retriever", "model", "dataset", "n", "failed", "EM"]
    em = table["columns"].index("EM")
    # Wilson intervals; 5 discordant questions each (McNemar p 0.0625), so no * after Holm
    assert [cells[em] for cells in table["cells"]] == ["100.0 (61.0–100.0)", "16.7 (3.0–56.4)", "16.7 (3.0–56.4)"]
    assert [r.get("p EM (Holm)") for r in table["rows"]][1:] == pytest.approx([0.125, 0.125])
    assert [r["EM"] for r in table["rows"]] == pytest.approx([r["EM"] for r in rows])
    # the same run id under two runs folders is told apart by its folder
    assert [r["name"] for r in data["runs"]] == [f"good/{paths[0].name}", f"paris/{paths[1].name}", paths[2].name]
    first = data["runs"][0]
    assert first["error"] is None and first["n_results"] == first["n_questions"] == 6
    assert first["manifest"]["model_identity"] == "scripted:scripted"
    assert first["settings"]["method_settings"] == {"k": 5, "max_tokens": 32}
    assert first["manifest"]["dataset_sha256"] == first["settings"]["dataset"]["sha256"]


def test_question_list_filters_sorts_pages_and_pairs(runs):
    c = client(runs["good"], runs["paris"], runs["iterdrag"])
    everything = ok(c.get("/api/questions"))
    assert everything["total"] == 6 and [i["id"] for i in everything["items"]] == [f"q{i}" for i in range(6)]
    first = everything["items"][0]
    assert first["question"] == "What is the capital of France?" and first["golds"] == ["Paris"]
    assert first["type"] == "bridge"  # read from the run's dataset file
    assert [cell["answer"] for cell in everything["items"][1]["runs"]] == ["Rome", "Paris", "Paris"]
    cell = everything["items"][1]["runs"][0]
    assert cell["em"] == 1.0 and cell["requests"] == 1 and cell["tokens"] > 0 and not cell["failed"]
    # wrong in run A (paris), right in run B (good): every question but France's
    flips = ok(c.get("/api/questions", params={"filter": "flip", "a": 1, "b": 0}))
    assert [i["id"] for i in flips["items"]] == ["q1", "q2", "q3", "q4", "q5"]
    assert ok(c.get("/api/questions", params={"filter": "flip", "a": 0, "b": 1}))["total"] == 0
    assert flips["counts"]["wrong-any"] == 5 and flips["counts"]["failed"] == 0
    assert flips["pairs"] == {"a": 1, "b": 0, "n": 6, "em": {"wins": 5, "losses": 0, "ties": 1},
                              "f1": {"wins": 5, "losses": 0, "ties": 1}}
    page = ok(c.get("/api/questions", params={"offset": 4, "limit": 2}))
    assert [i["id"] for i in page["items"]] == ["q4", "q5"] and page["total"] == 6
    by_em = ok(c.get("/api/questions", params={"sort": "1:em", "order": "desc"}))
    assert by_em["items"][0]["id"] == "q0"  # the only question Paris gets right comes first
    assert ok(c.get("/api/questions", params={"q": "germany"}))["total"] == 1
    assert ok(c.get("/api/questions", params={"type": "comparison"}))["total"] == 0
    for bad, message in [({"filter": "nope"}, "unknown filter"), ({"sort": "7:em"}, "sort must be"),
                         ({"a": 9}, "run a=9"), ({"limit": 0}, "limit must be"), ({"limit": "x"}, "bad parameter")]:
        response = c.get("/api/questions", params=bad)
        assert response.status_code == 400 and message in response.json()["error"]


def test_question_page_has_every_runs_trace_with_supporting_flags(runs):
    c = client(runs["good"], runs["paris"])
    data = ok(c.get("/api/question", params={"id": "q1"}))
    assert data["question"] == "What is the capital of Italy?" and data["golds"] == ["Rome"]
    assert len(data["supporting"]) == 1  # the Italy paragraph, from the dataset file
    good, paris = data["runs"]
    assert good["result"]["prediction"] == "Rome" and paris["result"]["prediction"] == "Paris"
    kinds = [s["kind"] for s in good["trace"]["steps"]]
    assert kinds == ["retrieve", "generate", "answer"]
    retrieve, generate = good["trace"]["steps"][:2]
    assert retrieve["hits"][0]["passage"]["id"] == data["supporting"][0]
    assert "Question:" in generate["prompt"][-1]["content"]  # the full prompt, for the collapsed block
    assert all("_note" not in s for s in good["trace"]["steps"])
    missing = c.get("/api/question", params={"id": "q99"})
    assert missing.status_code == 404 and "q99" in missing.json()["error"]


def test_agent_run_flags_over_search_and_keeps_decision_signals(tmp_path, corpus):
    path = make_evoctx_run(tmp_path, corpus)
    c = client(path)
    listing = ok(c.get("/api/questions"))
    cell = listing["items"][0]["runs"][0]
    # round 1: margin 2.33 said RETRIEVE where the oracle margin (-1) said THINK: over-search
    assert cell["over_search"] is True and cell["under_search"] is False
    assert listing["counts"]["over-search"] == 1 and listing["counts"]["under-search"] == 0
    steps = ok(c.get("/api/question", params={"id": "q1"}))["runs"][0]["trace"]["steps"]
    decisions = [s for s in steps if s["kind"] == "decide"]
    assert [d["choice"] for d in decisions] == ["RETRIEVE", "THINK", "ANSWER"]
    assert {"d_near", "d_cent", "d_90", "margin", "oracle_margin"} <= set(decisions[0]["signals"])
    runs = ok(c.get("/api/runs"))
    assert runs["runs"][0]["decides"] is True and runs["table"]["cells"][0][0] == "evoctx"


def test_a_failed_question_is_listed_as_failed_with_its_error(runs):
    flaky = make_flaky_run(runs["good"].parents[1], runs["data"])
    c = client(runs["good"], flaky)
    failed = ok(c.get("/api/questions", params={"filter": "failed"}))
    assert [i["id"] for i in failed["items"]] == ["q2"]
    cell = failed["items"][0]["runs"][1]
    assert cell["failed"] and "model crashed" in cell["error"] and cell["em"] == 0
    table = ok(c.get("/api/runs"))["table"]
    assert table["cells"][1][table["columns"].index("failed")] == "1 !"
    assert any("1 of 6 questions failed" in note for note in table["notes"])
    result = ok(c.get("/api/question", params={"id": "q2"}))["runs"][1]["result"]
    assert "model crashed" in result["error"] and result["retryable"] is False


def test_a_rerank_step_keeps_the_ranks_before_and_after(tmp_path):
    steps = ok(client(make_rerank_run(tmp_path)).get("/api/question", params={"id": "r1"}))["runs"][0]["trace"]["steps"]
    rerank = steps[1]
    assert rerank["kind"] == "rerank" and rerank["before"] == ["a", "b", "c"]
    assert [h["passage"]["id"] for h in rerank["hits"]] == ["c", "a"]


def test_a_folder_that_is_no_run_is_said_not_raised(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    data = ok(client(runs["good"], empty, tmp_path / "missing").get("/api/runs"))
    errors = [r["error"] for r in data["runs"]]
    assert errors[0] is None
    assert "not a metarag run folder" in errors[1] and "settings.json" in errors[1]
    assert "no such folder" in errors[2]
    assert len(data["table"]["cells"]) == 1  # the good run still has its row
    assert ok(client(empty).get("/api/questions"))["total"] == 0


def test_a_folder_of_runs_stands_for_the_runs_in_it(runs):
    data = ok(client(runs["good"].parent.parent / "good").get("/api/runs"))
    assert [r["path"] for r in data["runs"]] == [str(runs["good"])]


def test_a_torn_results_line_is_skipped_and_said(runs):
    store = RunStore(runs["good"])
    lines = store.results_path.read_bytes().splitlines(keepends=True)
    # a corrupt line in the middle (which `metarag report` refuses) and a torn last line (a kill mid-write)
    store.results_path.write_bytes(b"".join(lines[:2]) + lines[2][:40] + b"\n" + b"".join(lines[3:5]) + lines[5][:30])
    data = ok(client(runs["good"]).get("/api/runs"))
    run = data["runs"][0]
    messages = [p["message"] for p in run["problems"]]
    assert any("line 3 is torn or corrupt" in m for m in messages), messages
    assert any("line 6 is torn" in m for m in messages), messages
    assert run["n_results"] == 4
    n = data["table"]["columns"].index("n")
    assert data["table"]["cells"][0][n] == "4 (partial)"
    listing = ok(client(runs["good"]).get("/api/questions"))
    assert [i["runs"][0] is None for i in listing["items"]] == [False, False, True, False, False, True]
    assert "no result" in ok(client(runs["good"]).get("/api/question", params={"id": "q2"}))["runs"][0]["error"]


def test_an_unknown_step_kind_is_shown_raw_and_its_cost_counted(runs):
    store = RunStore(runs["good"])
    lines = store.results_path.read_text().splitlines()
    record = json.loads(lines[1])
    record["trace"]["steps"].insert(1, {"kind": "telepathy", "usage": {"prompt_tokens": 1000, "llm_requests": 1},
                                        "thought": "Rome, surely"})
    record["trace"]["steps"][0]["hits"][0]["novel_field"] = 1  # a new field of a known kind is no problem
    lines[1] = json.dumps(record)
    store.results_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception, match="corrupt result line"):
        load_run(runs["good"])  # what `metarag report` does with it
    c = client(runs["good"])
    run = ok(c.get("/api/runs"))["runs"][0]
    assert any("unknown step kind 'telepathy'" in p["message"] and p["question_id"] == "q1" for p in run["problems"])
    assert run["n_results"] == 6
    cell = ok(c.get("/api/questions"))["items"][1]["runs"][0]
    assert cell["unreadable_steps"] == 1 and cell["requests"] == 2  # the unknown step's request counts
    steps = ok(c.get("/api/question", params={"id": "q1"}))["runs"][0]["trace"]["steps"]
    assert steps[1]["kind"] == "telepathy" and "unknown step kind" in steps[1]["_note"]
    assert steps[1]["thought"] == "Rome, surely" and "_note" not in steps[0]


def test_a_known_step_with_missing_fields_is_shown_raw(runs):
    store = RunStore(runs["good"])
    lines = store.results_path.read_text().splitlines()
    record = json.loads(lines[0])
    del record["trace"]["steps"][0]["hits"]
    lines[0] = json.dumps(record)
    store.results_path.write_text("\n".join(lines) + "\n")
    steps = ok(client(runs["good"]).get("/api/question", params={"id": "q0"}))["runs"][0]["trace"]["steps"]
    assert "cannot read" in steps[0]["_note"] and steps[1]["kind"] == "generate"


def test_the_page_and_its_scripts_ship_in_the_package_and_use_no_internet(runs):
    c = client(runs["good"])
    page = c.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    for name in ("app.js", "charts.js", "style.css"):
        response = c.get(f"/static/{name}")
        assert response.status_code == 200 and len(response.text) > 500
        assert "http://" not in response.text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in response.text
    assert "https://" not in page.text and "http://" not in page.text


def test_a_run_being_written_is_reread(runs):
    c = client(runs["good"])
    assert ok(c.get("/api/runs"))["runs"][0]["n_results"] == 6
    store = RunStore(runs["good"])
    lines = store.results_path.read_text().splitlines()
    store.results_path.write_text("\n".join(lines[:3]) + "\n")
    assert ok(c.get("/api/runs"))["runs"][0]["n_results"] == 3


def test_a_growing_run_parses_only_its_new_lines(runs, monkeypatch):
    from metarag.view import loading

    store = RunStore(runs["good"])
    lines = store.results_path.read_text().splitlines(keepends=True)
    store.results_path.write_text("".join(lines[:3]))
    parsed = []
    real = loading.parse_line
    monkeypatch.setattr(loading, "parse_line", lambda line: parsed.append(line) or real(line))
    c = client(runs["good"])
    assert ok(c.get("/api/runs"))["runs"][0]["n_results"] == 3 and len(parsed) == 3
    with open(store.results_path, "a") as f:
        f.write("".join(lines[3:]))
    data = ok(c.get("/api/runs"))
    assert data["runs"][0]["n_results"] == 6 and len(parsed) == 6  # the three new lines only
    n = data["table"]["columns"].index("n")
    assert data["table"]["cells"][0][n] == "6"
    assert ok(c.get("/api/questions"))["items"][5]["runs"][0]["answer"] == "Lisbon"


def test_view_command_refuses_a_bad_port_and_binds_loopback_by_default():
    from metarag.cli import build_parser, main

    args = build_parser().parse_args(["view", "runs/x"])
    assert args.host == "127.0.0.1" and args.port == 8100 and args.handler.__name__ == "cmd_view"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["view", "runs/x", "--port", "70000"])
    assert main(["view", "runs/x", "--host", " "]) == 1


def test_make_demo_evaluates_the_two_questions_it_asked():
    """`make demo` ends with `metarag eval --dataset demo --limit 2 --seed 316` so that the response
    cache answers it at once: that sample must be exactly the two questions it asked before."""
    import re

    from metarag.data.datasets import resolve_preset, sample

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    asked = dict(re.findall(r"^(DEMO_Q\d) := (.+)$", makefile, flags=re.M))
    seed = re.search(r"metarag eval --method standard-rag --dataset demo --limit 2 --seed (\d+)", makefile)
    assert seed and len(asked) == 2
    picked = sample(resolve_preset("demo"), 2, int(seed.group(1)))
    assert sorted(q.text for q in picked.questions) == sorted(asked.values())


def test_view_command_serves_the_runs_on_loopback(runs):
    import subprocess
    import sys
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "metarag.cli", "view", str(runs["good"]), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "serving" in line or not line:
                break
        assert "on http://127.0.0.1:" in lines[-1], lines
        assert "6 of 6 questions finished" in "".join(lines)
        url = lines[-1].split(" on ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "api/runs", timeout=30) as response:
            data = json.loads(response.read())
        assert data["runs"][0]["n_results"] == 6 and data["table"]["cells"][0][0] == "standard-rag"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
