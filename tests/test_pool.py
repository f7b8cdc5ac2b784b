"""Training pools (`metarag.data.pool`, `scripts/make-train-pool`): a seeded held-out share of each
training split, the rest for training, over the union of the splits' passages, written in formats
the harness reads back."""
import json
from collections import Counter
from pathlib import Path

import pytest

from metarag.data.datasets import Dataset
from metarag.data.pool import mixed_split, write_pool
from metarag.errors import ConfigError, DataError
from metarag.evaluate.harness import DatasetSpec, load_questions
from metarag.records import Passage, Question


def dataset(name, n, prefix):
    questions = tuple(Question(f"{prefix}{i}", f"Question {prefix}{i}?", (f"answer {i}",)) for i in range(n))
    passages = tuple(Passage(f"p{i}", f"Title {prefix}{i}", f"Text {prefix}{i}.") for i in range(n))
    return Dataset(name, questions, passages, f"/data/{name}.json", "sha", "flashrag")


def test_each_split_holds_out_a_seeded_share_and_the_rest_trains(tmp_path):
    a, b = dataset("alpha-train", 6, "a"), dataset("beta-train", 4, "b")
    pool = mixed_split([a, b], heldout=2, seed=3)
    assert len(pool.train) == 6 and len(pool.heldout) == 4
    assert {s for s, _ in pool.heldout} == {"alpha-train", "beta-train"}
    trained, held = {q.id for _, q in pool.train}, {q.id for _, q in pool.heldout}
    assert not trained & held and trained | held == {q.id for d in (a, b) for q in d.questions}
    assert mixed_split([a, b], 2, 3) == pool and mixed_split([a, b], 2, 4) != pool  # seeded
    assert len({p.id for p in pool.passages}) == 10  # both splits' "p0" kept apart by their names
    train, heldout, corpus = write_pool(pool, tmp_path)
    assert train.name == "pool_train.jsonl"
    back = load_questions(DatasetSpec(file=str(train), corpus=str(corpus)))
    assert [q.id for q in back.questions] == [q.id for _, q in pool.train] and len(back.passages) == 10
    assert [json.loads(x)["source"] for x in heldout.read_text().splitlines()][:2] == ["alpha-train"] * 2


def test_bad_splits_are_refused():
    with pytest.raises(ConfigError, match="cannot hold out 4 of alpha-train's 4 questions"):
        mixed_split([dataset("alpha-train", 4, "a")], heldout=4, seed=0)
    with pytest.raises(DataError, match="share a question id"):
        mixed_split([dataset("alpha-train", 4, "a"), dataset("beta-train", 4, "a")], heldout=1, seed=0)


def test_a_slice_keeps_the_questions_of_its_types_and_hops_and_refuses_an_empty_one():
    import pytest

    from metarag.data.datasets import Dataset
    from metarag.data.pool import question_slice
    from metarag.errors import ConfigError
    from metarag.records import Passage, Question

    questions = (Question("a", "A?", ("x",), type="comparison"), Question("b", "B?", ("y",), type="bridge"),
                 Question("c", "C?", ("z",), hops=2), Question("d", "D?", ("w",), hops=3))
    dataset = Dataset("t", questions, (Passage("p", "P", "text"),), "t.json", "0" * 64, "flashrag",
                      contexts=(("p",), ("p",), (), ()), missing_support=(0, 1, 0, 0))
    comparison = question_slice(dataset, ("comparison",))
    assert [q.id for q in comparison.questions] == ["a"] and comparison.contexts == (("p",),)
    assert question_slice(dataset, ("bridge",)).missing_support == (1,)
    assert [q.id for q in question_slice(dataset, max_hops=2).questions] == ["c"]
    assert question_slice(dataset).questions == questions
    assert question_slice(dataset, ("comparison",)).passages == dataset.passages
    with pytest.raises(ConfigError, match="no question of t"):
        question_slice(dataset, ("comparison",), max_hops=2)
    typed_only = Dataset("h", questions[:2], dataset.passages, "h.json", "0" * 64, "hotpotqa")
    # no hops in this split: the hop filter does not apply
    assert [q.id for q in question_slice(typed_only, ("comparison",), max_hops=2).questions] == ["a"]


def test_unseen_is_every_question_of_the_whole_splits_not_trained_on(tmp_path):
    from metarag.data.pool import unseen

    a, b = dataset("alpha-train", 6, "a"), dataset("beta-train", 4, "b")
    # a slice: the first 3 questions of each split, 1 of them held out
    pool = mixed_split([Dataset(d.name, d.questions[:3], d.passages, d.path, "sha", "flashrag") for d in (a, b)], 1, 0)
    rest = unseen([a, b], pool)
    trained = {q.id for _, q in pool.train}
    assert len(rest) == 10 - len(trained) and not trained & {q.id for _, q in rest}
    assert {q.id for _, q in pool.heldout} <= {q.id for _, q in rest}  # the slice's held-out ones are in it
    paths = write_pool(pool, tmp_path, "easy", rest)
    assert paths[3].name == "easy_unseen.jsonl" and len(paths[3].read_text().splitlines()) == len(rest)
    assert len(write_pool(pool, tmp_path / "plain")) == 3


# ------------------------------------------------------------------ issue 51: the declared pool and its filter
def test_the_declared_pool_never_holds_a_held_out_question(tmp_path):
    from conftest import SHARED_DATA

    from metarag.data.datasets import load_dataset, question_list
    from metarag.data.pool import check_disjoint, declared_pool, write_pool
    from metarag.errors import DataError

    if not (SHARED_DATA / "2wikimultihopqa").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    pool = declared_pool(data_dir=SHARED_DATA)
    ids = [q.id for _, q in pool.train]
    assert len(ids) == len(set(ids)) == 1300  # at least 1,000 distinct questions before filtering
    # a seeded order, every source spread through it: the first 200 hold each in about its share
    in_order = declared_pool(data_dir=SHARED_DATA, seed=None)
    assert sorted(ids) == sorted(q.id for _, q in in_order.train) and ids == [q.id for _, q in declared_pool(
        data_dir=SHARED_DATA).train]
    first = Counter(source for source, _ in pool.train[:200])
    assert first.keys() == {"hotpotqa-train100", "musique-train100", "hotpotqa-dev500", "2wiki-dev1000"}
    assert 90 <= first["2wiki-dev1000"] <= 150  # 800 of 1,300: 123 expected
    for dataset in ("hotpotqa-dev500", "2wiki-dev1000"):
        held = set(question_list("headline200", dataset).ids)
        assert len(held) == 200 and not held & set(ids)  # against the committed lists
    with pytest.raises(DataError, match="held-out headline200 questions"):
        check_disjoint(ids + [next(iter(question_list("headline200", "2wiki-dev1000").ids))])
    train, _, corpus = write_pool(pool, tmp_path, "declared")
    back = load_dataset(train, corpus=corpus)
    assert [q.id for q in back.questions] == ids
    # HotpotQA's and MuSiQue's supporting paragraphs survive the file (2Wiki's hipporag file has none)
    supported = {q.id: q.supporting_ids for q in back.questions if q.supporting_ids}
    assert len(supported) == 500 and back.unmapped_support == 0


def test_the_difficulty_filter_keeps_questions_right_in_some_samples():
    from metarag.errors import ConfigError
    from metarag.train.difficulty import difficulty_filter

    samples = [("always", i, 1.0) for i in range(5)] + [("never", i, 0.0) for i in range(5)]
    samples += [("some", i, float(i < 2)) for i in range(5)] + [("one", i, float(i == 4)) for i in range(5)]
    samples += [("short", i, 1.0) for i in range(3)] + [("extra", i, float(i >= 5)) for i in range(7)]
    kept = difficulty_filter(samples, k=5, low=1, high=4)
    # "extra" is right only in samples 5 and 6, beyond the first five: 0 of 5, dropped
    assert kept.kept == ("some", "one")
    assert kept.right_counts == {0: 2, 1: 1, 2: 1, 5: 1} and kept.measured == 5 and kept.incomplete == ("short",)
    with pytest.raises(ConfigError, match="0 <= low <= high <= k"):
        difficulty_filter(samples, k=5, low=3, high=2)


def test_the_filter_reads_a_sampled_run_and_writes_the_kept_questions(tmp_path):
    import json

    from metarag import run
    from metarag.llm.scripted import ScriptedLLM
    from metarag.train.difficulty import difficulty_filter, run_samples, write_filtered

    answers = iter(["Paris", "Rome"] * 1000)  # samples alternate: a question is right in some of them
    llm = ScriptedLLM([("Question:", lambda prompt: next(answers))])
    data = tmp_path / "pool_train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Question {i}?", "golden_answers": [g]}) + "\n"
                            for i, g in enumerate(["Paris", "Oslo", "Rome"])))
    sampled = run("closed-book", data, samples=4, runs_dir=tmp_path / "runs", llm_instance=llm)
    filtered = difficulty_filter(run_samples(sampled.path), k=4, low=1, high=3)
    assert filtered.kept == ("q0", "q2") and filtered.right_counts == {0: 1, 2: 2}
    assert write_filtered(data, filtered.kept, tmp_path / "kept.jsonl") == 2
    assert [json.loads(line)["id"] for line in (tmp_path / "kept.jsonl").read_text().splitlines()] == ["q0", "q2"]
    # scripts/filter-pool --enough N: nothing written, exit 3, until N questions are kept
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "filter-pool"
    out = tmp_path / "enough.jsonl"
    args = [sys.executable, str(script), str(sampled.path), str(data), str(out), "--k", "4", "--keep", "1-3"]
    short = subprocess.run([*args, "--enough", "3"], capture_output=True, text=True)
    assert short.returncode == 3 and not out.exists() and "2 kept of 3 questions decided" in short.stdout
    assert subprocess.run([*args, "--enough", "2"], capture_output=True, text=True).returncode == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["q0", "q2"]
    # --status N: where the filter stands towards N kept, nothing written
    status = subprocess.run([*args[:4], "--k", "4", "--keep", "1-3", "--status", "3"], capture_output=True, text=True)
    assert status.returncode == 0 and not (tmp_path / "status.jsonl").exists()
    assert status.stdout.startswith("3 of the pool's 3 questions decided, 2 kept (67 %, a 95 % Wilson interval of ")
    assert "in 12 sampled answers (4.0 a question)" in status.stdout
    assert "the whole pool keeps about 2, fewer than 3" in status.stdout
    # --also: a second run over some of the same questions (here q2 and q1, the other way round), its samples
    # joining where the first run has none: q1 right once in the second run's samples, kept too
    other_answers = iter(["Rome", "Oslo"] * 1000)
    more = tmp_path / "pool_train_tail.jsonl"
    more.write_text("".join(line + "\n" for line in reversed(data.read_text().splitlines()[1:])))
    other = run("closed-book", more, samples=6, runs_dir=tmp_path / "runs",
                llm_instance=ScriptedLLM([("Question:", lambda prompt: next(other_answers))]))
    merged = run_samples(sampled.path, other.path)
    assert len(merged) == 12 + 2 * 2  # q1 and q2's samples 4 and 5 are new; their 0..3 are the first run's
    assert [s for s in merged if s[0] == "q2" and s[1] < 4] == [s for s in run_samples(sampled.path) if s[0] == "q2"]
    # at K = 6, q1's four wrong samples of the first run leave it undecided; the second run's fifth (wrong) and
    # sixth (right) decide it
    status = [*args[:4], "--k", "6", "--keep", "1-5", "--status", "3"]
    alone = subprocess.run(status, capture_output=True, text=True).stdout
    both = subprocess.run([*status, "--also", str(other.path)], capture_output=True, text=True).stdout
    assert alone.startswith("2 of the pool's 3 questions decided, 2 kept") and "in 8 sampled answers" in alone
    assert both.startswith("3 of the pool's 3 questions decided, 3 kept") and "in 16 sampled answers" in both


def test_the_filter_s_progress_projects_the_kept_rate_over_the_rest_of_the_pool():
    from metarag.train.difficulty import filter_progress

    samples = [("mixed", 0, 1.0), ("mixed", 1, 0.0)] + [("never", i, 0.0) for i in range(5)]
    samples += [("some", i, float(i < 2)) for i in range(5)] + [("running", i, 0.0) for i in range(2)]
    # decided: mixed (kept, 2 answers), never (5), some (kept, 5); "running" is undecided and not counted
    p = filter_progress(samples, pool=10, enough=4)
    assert (p.decided, p.kept, p.answers) == (3, 2, 12)
    assert p.needed == 6 and p.more_answers == 12  # 4 kept at 2 of 3: 6 questions, 3 more at 4 answers each
    short = filter_progress(samples, pool=5, enough=4)  # the pool keeps ~3 < 4: all of it, 2 more questions
    assert short.needed is None and short.more_answers == 8
    none = filter_progress([("never", i, 0.0) for i in range(5)], pool=10, enough=4)
    assert (none.decided, none.kept, none.needed, none.more_answers) == (1, 0, None, None)


def test_a_question_stopped_early_at_a_right_and_a_wrong_sample_is_kept_by_a_1_to_k_minus_1_window():
    from metarag.train.difficulty import difficulty_filter

    samples = [("mixed", 0, 0.0), ("mixed", 1, 1.0), ("wrong-so-far", 0, 0.0), ("wrong-so-far", 1, 0.0)]
    samples += [("never", i, 0.0) for i in range(5)]
    got = difficulty_filter(samples, k=5, low=1, high=4)
    assert got.kept == ("mixed",) and got.mixed == ("mixed",) and got.incomplete == ("wrong-so-far",)
    assert got.right_counts == {0: 1} and got.measured == 2
    narrow = difficulty_filter(samples, k=5, low=2, high=3)  # 1 right of 2 does not say 2..3 of 5
    assert narrow.kept == () and narrow.mixed == () and set(narrow.incomplete) == {"mixed", "wrong-so-far"}


def test_sampling_until_mixed_stops_a_question_at_its_first_right_and_wrong_and_the_rest_can_follow(tmp_path):
    import json

    from metarag import run
    from metarag.errors import ConfigError
    from metarag.llm.scripted import ScriptedLLM
    from metarag.train.difficulty import difficulty_filter, run_samples

    answers = iter(["Paris", "Rome", "Paris", "Oslo"] * 1000)
    llm = ScriptedLLM([("Question:", lambda prompt: next(answers))])
    data = tmp_path / "pool_train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Question {i}?", "golden_answers": [g]}) + "\n"
                            for i, g in enumerate(["Paris", "Berlin"])))
    sampled = run("closed-book", data, samples=5, samples_until="mixed", runs_dir=tmp_path / "runs", llm_instance=llm)
    per_question = {q: sorted(i for qid, i, _ in run_samples(sampled.path) if qid == q) for q in ("q0", "q1")}
    # q0: Paris (right), Rome (wrong): decided after two; q1 (Berlin) never right: all five
    assert per_question == {"q0": [0, 1], "q1": [0, 1, 2, 3, 4]}
    assert difficulty_filter(run_samples(sampled.path)).kept == ("q0",)
    # the same run folder (until is not in the run id): a run of all five samples adds q0's other three
    full = run("closed-book", data, samples=5, runs_dir=tmp_path / "runs", llm_instance=llm)
    assert full.path == sampled.path and len(run_samples(full.path)) == 10
    with pytest.raises(ConfigError, match="--samples-until mixed needs to know when a question is decided"):
        run("closed-book", data, samples=5, samples_until="mixed", workers=2, runs_dir=tmp_path / "runs",
            llm_instance=llm)
    # in lockstep (--batch 2): q0's first two samples run together and decide it, its other three never start
    answers = iter(["Paris", "Rome", "Paris", "Oslo"] * 1000)
    batched = run("closed-book", data, samples=5, samples_until="mixed", batch=2, runs_dir=tmp_path / "batched",
                  llm_instance=llm)
    per_question = {q: sorted(i for qid, i, _ in run_samples(batched.path) if qid == q) for q in ("q0", "q1")}
    assert per_question == {"q0": [0, 1], "q1": [0, 1, 2, 3, 4]}
    with pytest.raises(ConfigError, match="'until' must be one of all, mixed"):
        run("closed-book", data, samples=5, samples_until="some", runs_dir=tmp_path / "runs", llm_instance=llm)


def test_no_training_command_learns_from_a_held_out_question(tmp_path):
    from conftest import SHARED_DATA

    from metarag.data.datasets import check_training_split, question_list, resolve_preset, select

    if not (SHARED_DATA / "hotpotqa").is_dir():
        pytest.skip("needs the shared benchmark data beside the repo")
    dev = resolve_preset("hotpotqa-dev500", SHARED_DATA)
    held = select(dev, question_list("headline200", "hotpotqa-dev500").ids[:3])
    renamed = Dataset("my_train", held.questions, held.passages, str(tmp_path / "my_train.json"), "x", "ircot")
    with pytest.raises(DataError, match="the training set my_train holds 3 of hotpotqa-dev500's held-out"):
        check_training_split(renamed, allow_any=True)  # named a training split, and --allow-any: still refused
    pool = select(dev, question_list("train-pool", "hotpotqa-dev500").ids[:3])
    check_training_split(Dataset("my_train", pool.questions, pool.passages, "p", "x", "ircot"))  # allowed
