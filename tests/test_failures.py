"""Failures are not forever and never silent, and one writer per run: retryable failures retried by a
re-run (the failed line kept), consecutive failures stopping a run, health checks before the first
question (a dead or hung OpenAI-compatible server, a dead or hung remote retriever), `eval`'s exit
status and the report's failed column, and the run folder's writer lock (refusal, --wait, kill -9)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer
from servers import free_port
from test_harness import answer_from_prompt, config, reader, write_hotpot

from metarag.cli import main
from metarag.errors import BackendError, ConfigError, DataError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.evaluate.report import load_run, report_table
from metarag.evaluate.runs import RunStore
from metarag.llm.scripted import ScriptedLLM
from metarag.retrieve.memory import MemoryRetriever
from metarag.retrieve.remote import RemoteRetriever

IDS = [f"q{i}" for i in range(6)]


def question_of(prompt: str) -> str:
    return prompt.rsplit("Question:", 1)[1]


def failing_on(countries, error):
    """A scripted reader that raises `error()` for questions about `countries`, else answers right."""
    def respond(prompt):
        if any(c in question_of(prompt) for c in countries):
            raise error()
        return answer_from_prompt(prompt)
    return ScriptedLLM([("Question:", respond)])


def lines(store: RunStore) -> list[dict]:
    return [json.loads(line) for line in store.results_path.read_text().splitlines()]


def asked(llm: ScriptedLLM) -> list[str]:
    import re
    return [re.search(r"capital of (\w+)", question_of(p)).group(1) for p in llm.prompts]


# ------------------------------------------------------------------------------------- retrying
def test_a_retryable_failure_is_retried_by_a_rerun_and_its_failed_line_kept(tmp_path):
    cfg = config(tmp_path)
    down = failing_on(["Spain"], lambda: BackendError("server down", retryable=True))
    store, results = evaluate(cfg, progress=False, llm=down)
    failed = [r for r in results if r.failed]
    assert [r.question_id for r in failed] == ["q2"] and failed[0].retryable
    assert lines(store)[2]["trace"]["retryable"] is True

    llm = reader()
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert asked(llm) == ["Spain"]  # only the failed question is asked again
    assert [r.question_id for r in results] == IDS and not any(r.failed for r in results)
    written = lines(store)
    assert [w["question_id"] for w in written] == [*IDS, "q2"]  # appended; the failed line stays as evidence
    assert written[2]["error"] and written[6]["error"] is None
    row = report_table([load_run(store.path)], baseline=None)[1][0]
    assert row["n"] == 6 and row["failed"] == 0 and row["EM"] == 100.0  # readers take the newest line

    again = reader()
    evaluate(cfg, progress=False, llm=again)
    assert again.prompts == [] and len(lines(store)) == 7  # a done question is never run twice


def test_a_non_retryable_failure_is_done_unless_retry_failed(tmp_path):
    cfg = config(tmp_path)
    evaluate(cfg, progress=False, llm=failing_on(["Spain", "Austria"], lambda: RuntimeError("parser bug")))
    llm = reader()
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert llm.prompts == [] and sum(r.failed for r in results) == 2
    llm = reader()
    store, results = evaluate(replace(cfg, retry_failed=True), progress=False, llm=llm)
    assert sorted(asked(llm)) == ["Austria", "Spain"]
    assert not any(r.failed for r in results) and len(lines(store)) == 8


def test_consecutive_retryable_failures_stop_the_run_and_a_rerun_completes_it(tmp_path):
    cfg = config(tmp_path, max_consecutive_failures=3)
    down = failing_on(["France", "Italy", "Spain", "Germany", "Austria", "Portugal"],
                      lambda: BackendError("connection refused", retryable=True))
    with pytest.raises(BackendError, match=r"stopped after 3 consecutive .*q2: BackendError: connection refused"
                                           r".*3 questions not tried"):
        evaluate(cfg, progress=False, llm=down)
    store = RunStore(next((tmp_path / "runs").iterdir()))
    assert [w["question_id"] for w in lines(store)] == ["q0", "q1", "q2"]
    session = json.loads(store.manifest_path.read_text())["sessions"][-1]
    assert session["outcome"].startswith("BackendError: stopped after 3") and session["ended"]

    llm = reader()
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert sorted(asked(llm)) == sorted(["France", "Italy", "Spain", "Germany", "Austria", "Portugal"])
    assert all(r.scores.em == 1.0 for r in results) and len(lines(store)) == 9
    assert json.loads(store.manifest_path.read_text())["sessions"][-1]["retrying"] == 3


def test_a_success_between_failures_resets_the_count_and_zero_never_stops(tmp_path):
    flaky = ["France", "Italy", "Germany", "Austria"]  # fail, fail, ok, fail, fail, ok
    error = lambda: BackendError("timeout", retryable=True)  # noqa: E731
    store, results = evaluate(config(tmp_path, max_consecutive_failures=3), progress=False,
                              llm=failing_on(flaky, error))
    assert len(results) == 6 and sum(r.failed for r in results) == 4
    other = tmp_path / "other"
    other.mkdir()
    store, results = evaluate(config(other, max_consecutive_failures=0), progress=False,
                              llm=failing_on(CITIES_ALL, error))
    assert len(results) == 6 and all(r.failed for r in results)


CITIES_ALL = ["France", "Italy", "Spain", "Germany", "Austria", "Portugal"]


def test_concurrent_workers_stop_too_and_start_no_new_question(tmp_path):
    def slow_down(prompt):
        time.sleep(0.05)
        raise BackendError("down", retryable=True)

    cfg = config(tmp_path, workers=2, max_consecutive_failures=2)
    with pytest.raises(BackendError, match="stopped after 2 consecutive"):
        evaluate(cfg, progress=False, llm=ScriptedLLM([("Passages:", slow_down)]))
    written = lines(RunStore(next((tmp_path / "runs").iterdir())))
    # the two that tripped the limit, plus at most one in flight on each worker; never all six
    assert 2 <= len(written) <= 4 and len({w["question_id"] for w in written}) == len(written)


def test_negative_max_consecutive_failures_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--max-consecutive-failures"):
        evaluate(config(tmp_path, max_consecutive_failures=-1), progress=False, llm=reader())


# ------------------------------------------------------------------------ eval's exit and report
def test_eval_exits_non_zero_naming_the_failures_and_the_report_shows_them(tmp_path, monkeypatch, capsys):
    from metarag.evaluate import harness

    pytest.importorskip("bm25s")
    monkeypatch.setattr(harness, "make_llm", lambda spec, **_: failing_on(["Spain"], lambda: RuntimeError("boom")))
    data = write_hotpot(tmp_path / "hotpot.json")
    argv = ["eval", "--method", "standard-rag", "--dataset-file", str(data), "--runs-dir", str(tmp_path / "runs"),
            "--quiet"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    err = err.strip().splitlines()[-1]  # after the index build's note
    assert err.startswith("metarag: error: 1 of 6 questions have no successful result (none retryable")
    assert "first: q2: RuntimeError: boom" in err
    assert table_cells(out)["failed"] == "1 !"
    assert f"\n! {Path(out.split('run folder: ')[1].strip()).name}: 1 of 6 questions failed (0 retryable); " \
           "first: q2: RuntimeError: boom (at " in out

    run = next((tmp_path / "runs").iterdir())
    assert main(["report", str(run), "--csv", ""]) == 0
    report = capsys.readouterr().out
    assert table_cells(report)["failed"] == "1 !"
    monkeypatch.setattr(harness, "make_llm", lambda spec, **_: reader())
    assert main([*argv, "--retry-failed"]) == 0
    out = capsys.readouterr().out
    assert table_cells(out)["failed"] == "0" and "questions failed" not in out


def table_cells(out: str) -> dict[str, str]:
    """The first row of the markdown table at the start of `out`, by column name."""
    header, _, row = out.splitlines()[:3]
    split = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    return dict(zip(split(header), split(row)))


def test_report_table_marks_only_runs_with_failures(tmp_path):
    good, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    bad, _ = evaluate(config(tmp_path, method="closed-book"), progress=False,
                      llm=failing_on(["Italy"], lambda: BackendError("503", retryable=True)))
    table, rows = report_table([load_run(good.path), load_run(bad.path)], baseline=None)
    assert [r["failed"] for r in rows] == [0, 1] and rows[1]["retryable failed"] == 1
    body = table.splitlines()
    assert body[2].split(" | ")[5] == "0" and body[3].split(" | ")[5] == "1 !"
    assert body[-1] == f"! {bad.path.name}: 1 of 6 questions failed (1 retryable); first: q1: BackendError: 503"


def test_readers_skip_a_torn_last_line_and_only_the_writer_cuts_it(tmp_path):
    store, _ = evaluate(config(tmp_path), progress=False, llm=reader())
    text = store.results_path.read_text()
    store.results_path.write_text(text + text.splitlines()[0][:40])  # a writer mid-line
    assert len(load_run(store.path).results) == 6
    assert store.results_path.read_text().endswith(text.splitlines()[0][:40])  # a report never truncates
    evaluate(config(tmp_path), progress=False, llm=reader())
    assert store.results_path.read_text() == text


# -------------------------------------------------------------------------------- health checks
def test_a_failed_health_check_stops_before_the_first_question(tmp_path):
    class Down(ScriptedLLM):
        def check(self):
            raise BackendError("LLM server at http://x/v1 is not reachable", retryable=True)

    llm = Down(default="Paris")
    with pytest.raises(BackendError, match="LLM health check failed before the first question: LLM server at"):
        evaluate(config(tmp_path), progress=False, llm=llm)
    assert llm.prompts == []
    assert not list((tmp_path / "runs").glob("*/results.jsonl")) or not any(
        p.read_text() for p in (tmp_path / "runs").glob("*/results.jsonl"))


def test_a_model_named_by_the_method_settings_is_checked_before_the_first_question(tmp_path):
    pytest.importorskip("openai")
    url = f"http://127.0.0.1:{free_port()}/v1"
    settings = {"decision_llm": f"openai:m@{url}", "encoder": "bag-of-words"}
    llm = reader()
    with pytest.raises(BackendError, match=f"model openai:m@{url} health check failed before the first question: "
                                           f"LLM server at {url} is not reachable"):
        evaluate(config(tmp_path, "evoctx", overrides=settings), progress=False, llm=llm)
    assert llm.prompts == []


def no_backoff(monkeypatch) -> None:
    """Fail the test if anything sleeps (a retry's backoff) from here on: a health check asks once and
    fails at once, asserted without a bound in seconds, which a machine busy with other jobs can break."""
    def sleep(seconds):
        raise AssertionError(f"slept {seconds} s: a health check that retries")

    monkeypatch.setattr(time, "sleep", sleep)


def test_a_dead_remote_retriever_fails_the_health_check_fast(tmp_path, monkeypatch):
    no_backoff(monkeypatch)
    dead = RemoteRetriever(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendError, match="retriever health check failed before the first question: retrieval "
                                           "service at .*/health failed after 1 try"):
        evaluate(config(tmp_path), progress=False, llm=reader(), retriever=dead)


def test_a_hung_remote_retriever_fails_the_health_check_in_its_timeout():
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        hung = RemoteRetriever(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=30)
        start = time.perf_counter()
        with pytest.raises(BackendError, match="failed after 1 try"):
            hung.check(timeout_s=1)
        # the timeout given, not the client's 30 s: a bound 15x the given one, for a busy machine
        assert time.perf_counter() - start < 15


def test_an_in_memory_retriever_and_a_scripted_llm_pass_the_health_check(tmp_path, corpus):
    store, results = evaluate(config(tmp_path), progress=False, llm=reader(),
                              retriever=MemoryRetriever([p for p in corpus]))
    assert len(results) == 6


def openai_llm(url: str, timeout_s: float = 5):
    pytest.importorskip("openai")
    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

    return OpenAICompatLLM(OpenAISettings(base_url=url, model="fake", max_retries=0, backoff_s=0.0,
                                          timeout_s=timeout_s))


def test_the_openai_check_passes_on_a_live_server_and_fails_fast_on_a_dead_one(monkeypatch):
    with FakeOpenAIServer() as server:
        openai_llm(server.url).check()
        url = server.url
    no_backoff(monkeypatch)
    with pytest.raises(BackendError, match=r"LLM server at .* is not reachable \(.*\): start it or fix --base-url"
                       ) as caught:
        openai_llm(url).check()
    assert caught.value.retryable


def test_the_openai_check_fails_in_seconds_on_a_hung_server():
    with FakeOpenAIServer(mode="hang") as server:
        start = time.perf_counter()
        with pytest.raises(BackendError, match="did not answer GET /models within 1 s"):
            openai_llm(server.url, timeout_s=60).check(timeout_s=1)
        # the timeout given, not the client's 60 s: a bound 15x the given one, for a busy machine
        assert time.perf_counter() - start < 15


def test_the_openai_check_reports_a_server_error():
    with FakeOpenAIServer(mode="error") as server:
        with pytest.raises(BackendError, match="answered GET /models with HTTP 500") as caught:
            openai_llm(server.url).check()
        assert caught.value.retryable


def test_cli_eval_against_a_dead_openai_server_fails_fast_with_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("openai")
    no_backoff(monkeypatch)
    data = write_hotpot(tmp_path / "hotpot.json")
    url = f"http://127.0.0.1:{free_port()}/v1"
    code = main(["eval", "--method", "standard-rag", "--dataset-file", str(data), "--runs-dir",
                 str(tmp_path / "runs"), "--llm", "openai", "--base-url", url, "--model", "m", "--no-cache",
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"metarag: error: LLM health check failed before the first question: LLM server at {url} "
                          "is not reachable") and len(err.strip().splitlines()) == 1


def test_a_server_that_dies_mid_run_stops_it_and_the_same_call_completes_after_it_returns(tmp_path):
    server = FakeOpenAIServer(answer=answer_from_prompt).start()
    try:
        llm = openai_llm(server.url)
        cfg = config(tmp_path, max_consecutive_failures=3)

        def kill_after_two(result):
            if result.question_id == "q1":
                server.stop()

        # the first retryable failure is followed by a health check, which fails at once: the run
        # stops there instead of paying the client's retries on every later question
        with pytest.raises(BackendError, match="stopped: LLM health check failed after q2 failed.*not reachable"):
            evaluate(cfg, progress=False, llm=llm, on_result=kill_after_two)
        store = RunStore(next((tmp_path / "runs").iterdir()))
        written = lines(store)
        assert [w["error"] is None for w in written] == [True, True, False]
        assert written[2]["trace"]["retryable"]
        with pytest.raises(BackendError, match="not reachable"):  # still down: the check says so at once
            evaluate(cfg, progress=False, llm=llm)

        server.start()  # back, on the same port
        store, results = evaluate(cfg, progress=False, llm=llm)
        assert [r.question_id for r in results] == IDS
        assert all(r.error is None and r.scores.em == 1.0 for r in results)
        assert [w["question_id"] for w in lines(store)] == ["q0", "q1", "q2", "q2", "q3", "q4", "q5"]
    finally:
        server.stop()


# ----------------------------------------------------------------------------- one writer per run
HOLDER = """
import sys, time
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.llm.scripted import ScriptedLLM
def slow(prompt):
    time.sleep(float(sys.argv[3]))
    return "Paris"
cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=sys.argv[1]), runs_dir=sys.argv[2])
evaluate(cfg, progress=False, llm=ScriptedLLM([("Passages:", slow)]))
"""


def start_holder(tmp_path: Path, delay: float) -> tuple[subprocess.Popen, Path, Path]:
    """A subprocess evaluating the standard hotpot file slowly; returns once it holds the run's lock
    (its pid is in run.lock) and has written one result."""
    data = write_hotpot(tmp_path / "hotpot.json")
    runs = tmp_path / "runs"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(data), str(runs), str(delay)], env=os.environ.copy())
    deadline = time.time() + 60
    while time.time() < deadline:
        found = list(runs.glob("*/results.jsonl"))
        if found and found[0].read_text().count("\n") >= 1:
            lock = found[0].parent / "run.lock"
            if lock.exists() and f'"pid": {proc.pid}' in lock.read_text():
                return proc, data, found[0].parent
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the holder never started writing")


def test_a_second_writer_is_refused_naming_the_holder_and_the_file_has_one_line_per_question(tmp_path, capsys):
    proc, data, run = start_holder(tmp_path, 0.3)
    try:
        argv = ["eval", "--method", "standard-rag", "--dataset-file", str(data), "--runs-dir", str(tmp_path / "runs"),
                "--quiet"]
        assert main(argv) == 1  # refused before any model is built
        err = capsys.readouterr().err
        assert err.startswith(f"metarag: error: run folder {run} is being written by pid {proc.pid} on ")
        assert "holder.py" in err and "--wait" in err and len(err.strip().splitlines()) == 1
    finally:
        assert proc.wait(timeout=60) == 0
    ids = [json.loads(line)["question_id"] for line in (run / "results.jsonl").read_text().splitlines()]
    assert ids == IDS
    assert len(json.loads((run / "manifest.json").read_text())["sessions"]) == 1


def test_wait_waits_for_the_holder_then_finds_the_run_done(tmp_path, notes):
    proc, data, run = start_holder(tmp_path, 0.2)
    try:
        cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"),
                         wait=True)
        llm = ScriptedLLM(default="Paris")
        store, results = evaluate(cfg, progress=False, llm=llm)
        # it got the lock only when the holder released it, done: nothing was left to ask
        assert llm.prompts == [] and len(results) == 6 and proc.wait(timeout=30) == 0
        assert f"waiting for pid {proc.pid}" in notes()
    finally:
        proc.wait(timeout=60)
    assert len((run / "results.jsonl").read_text().splitlines()) == 6


def test_a_holder_killed_with_sigkill_leaves_no_lock_that_blocks_a_resume(tmp_path):
    proc, data, run = start_holder(tmp_path, 0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert f'"pid": {proc.pid}' in (run / "run.lock").read_text()  # the record stays, the lock died with it
    before = len((run / "results.jsonl").read_text().splitlines())
    cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)), runs_dir=str(tmp_path / "runs"))
    llm = ScriptedLLM([("Passages:", "Paris")])
    store, results = evaluate(cfg, progress=False, llm=llm)
    assert len(llm.prompts) == 6 - before and [r.question_id for r in results] == IDS
    ids = [json.loads(line)["question_id"] for line in store.results_path.read_text().splitlines()]
    assert sorted(ids) == IDS
    assert f'"pid": {os.getpid()}' in (run / "run.lock").read_text()


def test_the_lock_is_per_run_folder_and_released_after_the_run(tmp_path):
    store = RunStore(tmp_path / "run")
    with store.lock(command=["first"]) as holder:
        assert holder["pid"] == os.getpid() and holder["command"] == "first"
        errors = []

        def second():  # flock locks are per open file: a second open in this process is refused too
            try:
                with store.lock():
                    pass
            except ConfigError as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert errors and f"pid {os.getpid()}" in errors[0] and "'first'" in errors[0]
        with RunStore(tmp_path / "other").lock():
            pass  # another run folder is not blocked
    with store.lock():
        pass  # released


def test_a_file_system_without_locks_gets_one_line_naming_the_lock_file(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(DataError, match=r"run\.lock: cannot lock the run folder \(No locks available\); put "
                                        "--runs-dir on a local file system"):
        evaluate(config(tmp_path), progress=False, llm=reader())
