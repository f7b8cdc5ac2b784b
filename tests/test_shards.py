"""Sharded runs (`eval --shard i/n`): n writers share one run folder, each over a disjoint slice of the
questions, and `report` / `view` read the merged folder as the run an unsharded eval writes; a shard
that has not finished is named, never scored as absent."""
import json
import threading
from dataclasses import replace

import pytest
from test_harness import CITIES, COUNTRIES, answer_from_prompt

from metarag.cli import main
from metarag.errors import ConfigError, DataError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.evaluate.report import load_run, report_table
from metarag.evaluate.runs import RunStore, Shard
from metarag.llm.scripted import ScriptedLLM

# ten questions, so that shards of 3 and 4 are uneven; every third answered wrong by the script
MORE_CITIES = CITIES + ["Athens", "Dublin", "Warsaw", "Prague"]
MORE_COUNTRIES = COUNTRIES + ["Greece", "Ireland", "Poland", "Czechia"]


def write_questions(path):
    records = [{"_id": f"q{i}", "question": f"What is the capital of {country}?", "answer": city,
                "type": "bridge", "level": "easy", "supporting_facts": [[country, 0]],
                "context": [[country, [f"{country} is a country in Europe.", f" Its capital is {city}."]],
                            [f"{city} (song)", [f"{city} is also the title of a song."]]]}
               for i, (city, country) in enumerate(zip(MORE_CITIES, MORE_COUNTRIES))]
    path.write_text(json.dumps(records))
    return path


def scripted():
    """Right on most questions, wrong on Greece and Poland: a run whose scores differ per question."""
    def answer(prompt):
        return "Paris" if any(c in prompt.rsplit("Question:", 1)[1] for c in ("Greece", "Poland")) \
            else answer_from_prompt(prompt)
    return ScriptedLLM([("Passages:", answer)], default="Paris")


def cfg(tmp_path, shard=None, runs="runs", **kw):
    data = tmp_path / "questions.json"
    if not data.exists():
        write_questions(data)
    return EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data), limit=9, seed=3),
                      runs_dir=str(tmp_path / runs), shard=Shard.parse(shard) if shard else None, **kw)


def run_shards(tmp_path, n, only=None, runs="runs"):
    stores = [evaluate(cfg(tmp_path, f"{i}/{n}", runs), progress=False, llm=scripted())[0]
              for i in (only or range(1, n + 1))]
    return stores


@pytest.mark.parametrize("n, length", [(1, 5), (3, 9), (4, 9), (5, 3), (7, 20)])
def test_shards_are_disjoint_and_cover_the_questions_in_order(n, length):
    items = [f"q{i}" for i in range(length)]
    slices = [Shard(i, n).take(items) for i in range(1, n + 1)]
    flat = [x for s in slices for x in s]
    assert sorted(flat) == sorted(items) and len(flat) == len(items)  # disjoint and covering
    assert all(s == sorted(s, key=items.index) for s in slices)  # each keeps the seeded order
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", "-1/2"])
def test_a_bad_shard_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--shard"):
        Shard.parse(text)


def test_shards_merge_into_the_report_of_an_unsharded_run(tmp_path):
    whole, whole_results = evaluate(cfg(tmp_path, runs="whole"), progress=False, llm=scripted())
    stores = run_shards(tmp_path, 4)
    assert len({s.path for s in stores}) == 1  # one run folder for every shard
    assert stores[0].path.name == whole.path.name  # and the shard does not change the run id
    folder = stores[0].path
    files = sorted(p.name for p in folder.glob("results*.jsonl"))
    assert files == [f"results.shard-{i}-of-4.jsonl" for i in range(1, 5)]
    written = [json.loads(line)["question_id"] for f in files for line in (folder / f).read_text().splitlines()]
    assert sorted(written) == sorted(r.question_id for r in whole_results)  # each question once, all of them

    merged, alone = load_run(folder), load_run(whole.path)
    assert merged.question_ids == alone.question_ids and merged.complete and not merged.missing_shards
    assert [(r.question_id, r.scores, r.prediction) for r in merged.results] == \
        [(r.question_id, r.scores, r.prediction) for r in alone.results]
    assert 0 < sum(r.scores.em for r in merged.results) < len(merged.results)  # a score that can tell them apart
    columns = ["method", "n", "failed", "EM", "F1", "Prec", "Rec", "cover-EM", "req/q", "tok/q", "retr/q",
               "support recall"]
    table, row = report_table([merged], baseline=None, columns=columns)
    assert table == report_table([alone], baseline=None, columns=columns)[0]  # the same row, but for latency
    assert "(partial)" not in table and "incomplete" not in table
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(s["shard"] for s in manifest["sessions"]) == ["1/4", "2/4", "3/4", "4/4"]
    assert all(s["outcome"] == "finished" for s in manifest["sessions"])


def test_shards_written_at_once_by_concurrent_writers_lose_nothing(tmp_path):
    from metarag.evaluate.harness import load_questions
    from metarag.retrieve.memory import MemoryRetriever

    service = MemoryRetriever(list(load_questions(cfg(tmp_path).dataset).passages))  # one shared retriever
    errors = []

    def shard(i):
        try:
            evaluate(cfg(tmp_path, f"{i}/3", workers=2), progress=False, llm=scripted(), retriever=service)
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=shard, args=(i,)) for i in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    folder = next((tmp_path / "runs").iterdir())
    run = load_run(folder)
    assert run.complete and len(run.results) == 9 and not run.missing_shards
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(s["shard"] for s in manifest["sessions"]) == ["1/3", "2/3", "3/3"]  # no session overwritten


def test_a_missing_shard_is_named_in_one_line_and_not_scored(tmp_path, capsys):
    (store,) = run_shards(tmp_path, 3, only=[2])
    partial = replace(cfg(tmp_path, "1/3"), max_consecutive_failures=0)
    def crash(prompt):
        raise RuntimeError("reader crashed")

    evaluate(partial, progress=False, llm=ScriptedLLM([("Passages:", crash)]))
    run = load_run(store.path)
    assert run.missing_shards == ("3/3 (not started)",)  # shard 1's failures are written: they score 0, not absent
    assert sum(r.failed for r in run.results) == 3
    assert len(run.results) == 6 and not run.complete
    assert main(["report", str(store.path), "--csv", ""]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "incomplete" in line]
    assert lines == [f"incomplete {store.path.name}: shard 3/3 (not started) missing, so its row scores 6 of 9 "
                     "questions; run the missing shards to finish it"]
    assert "| 6 (partial) |" in out


def test_a_shard_cut_short_is_named_with_its_count(tmp_path):
    (store,) = run_shards(tmp_path, 2, only=[1])
    lines = store.results_path.read_text().splitlines(keepends=True)
    store.results_path.write_text("".join(lines[:2]))  # as if killed after two questions
    run_shards(tmp_path, 2, only=[2])
    assert load_run(store.path).missing_shards == ("1/2 (2 of 5 questions)",)
    run_shards(tmp_path, 2, only=[1])  # resuming the shard finishes the run
    assert load_run(store.path).complete and not load_run(store.path).missing_shards


def test_mixing_sharded_and_unsharded_writes_or_another_n_is_an_error(tmp_path):
    run_shards(tmp_path, 2, only=[1])
    with pytest.raises(ConfigError, match="sharded 2 ways: run it with --shard I/2"):
        evaluate(cfg(tmp_path), progress=False, llm=scripted())
    with pytest.raises(ConfigError, match="sharded 2 ways, not 3"):
        evaluate(cfg(tmp_path, "1/3"), progress=False, llm=scripted())
    evaluate(cfg(tmp_path, runs="plain"), progress=False, llm=scripted())
    with pytest.raises(ConfigError, match="holds an unsharded run"):
        evaluate(cfg(tmp_path, "1/2", runs="plain"), progress=False, llm=scripted())


def test_a_shard_refuses_a_folder_an_unsharded_writer_holds(tmp_path):
    store = RunStore(tmp_path / "run")
    store.write_json("settings.json", {})
    with store.lock():
        sharded = RunStore(tmp_path / "run", Shard(1, 2))
        with sharded.lock(), sharded.folder_lock(), pytest.raises(ConfigError, match="unsharded run"):
            sharded.check_layout()


def test_each_shard_has_its_own_writer_lock(tmp_path):
    one, two = RunStore(tmp_path / "run", Shard(1, 2)), RunStore(tmp_path / "run", Shard(2, 2))
    with one.lock():
        with two.lock():  # another shard writes beside it
            pass
        with pytest.raises(ConfigError, match="shard 1/2 of run folder .* is being written by"):
            with RunStore(tmp_path / "run", Shard(1, 2)).lock():
                pass


def test_stray_shard_files_are_refused(tmp_path):
    (store,) = run_shards(tmp_path, 2, only=[1])
    (store.path / "results.shard-1-of-3.jsonl").write_text("")
    with pytest.raises(DataError, match="shard 1/3 in a run folder sharded 2 ways"):
        run_shards(tmp_path, 2, only=[2])


def test_the_cli_and_api_take_a_shard(tmp_path, monkeypatch, capsys):
    import metarag
    from metarag.evaluate import harness

    monkeypatch.setattr(harness, "make_llm", lambda spec, **_: scripted())
    data = write_questions(tmp_path / "questions.json")
    argv = ["eval", "--method", "standard-rag", "--dataset-file", str(data), "--runs-dir", str(tmp_path / "runs"),
            "--quiet", "--llm", "embedded"]
    assert main([*argv, "--shard", "1/2"]) == 0
    out = capsys.readouterr().out
    assert "incomplete" in out and "shard 2/2 (not started)" in out
    run = metarag.run("standard-rag", data, runs_dir=tmp_path / "runs", llm_instance=scripted(), shard="2/2")
    assert len(run.records) == 10 and "incomplete" not in run.table()
    assert main([*argv, "--shard", "2/x"]) == 1
    assert "--shard '2/x': give I/N" in capsys.readouterr().err


def test_the_viewer_reads_a_sharded_run_as_one(tmp_path):
    pytest.importorskip("fastapi")
    from metarag.view.loading import RunView

    (store,) = run_shards(tmp_path, 3, only=[1])
    view = RunView(store.path)
    assert len(view.results) == 3
    assert any("shards 2/3 (not started), 3/3 (not started) missing" in p["message"] for p in view.problems)
    run_shards(tmp_path, 3, only=[2, 3])
    assert view.refresh()
    assert len(view.results) == 9 and not view.run.missing_shards
    assert not [p for p in view.problems if "incomplete" in p["message"]]
    last = Shard(3, 3).take(list(view.run.question_ids))[-1]
    raw, why = view.raw_trace(last)  # read again from shard 3's file
    assert why is None and raw["question_id"] == last
