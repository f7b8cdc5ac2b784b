"""Training pools (`metarag.data.pool`, `scripts/make-train-pool`): a seeded held-out share of each
training split, the rest for training, over the union of the splits' passages, written in formats
the harness reads back."""
import json

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
