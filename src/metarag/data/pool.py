"""Training pools: several training splits mixed into one training file and one held-out file of the
same mixture, over the union of their passages (`scripts/make-train-pool`). What `train-agent`
trains on and what its checkpoint is then evaluated on, so that the held-out questions come from the
training distribution and are never seen in training.

Written as FlashRAG JSON lines (`id`, `question`, `golden_answers`, and `source`, the split a
question came from) and a corpus of `{id, title, text}` lines: formats the harness reads
(`--dataset-file`, `--corpus`). The pool's passage ids are prefixed by their split's name, so two
splits' ids never collide.
"""
from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metarag.data.datasets import Dataset, check_disjoint
from metarag.errors import ConfigError, DataError
from metarag.records import Passage, Question


@dataclass(frozen=True)
class Pool:
    """A mixed split: training and held-out questions (each with the name of its source split) and
    the passages of every source."""

    train: tuple[tuple[str, Question], ...]
    heldout: tuple[tuple[str, Question], ...]
    passages: tuple[Passage, ...]


def mixed_split(datasets: Sequence[object], heldout: int, seed: int) -> Pool:
    """From each dataset (a `data.datasets.Dataset` with passages), a seeded `heldout` of its
    questions held out and the rest for training, both in file order; the passages of all."""
    train: list[tuple[str, Question]] = []
    held: list[tuple[str, Question]] = []
    passages: list[Passage] = []
    for dataset in datasets:
        name, questions = dataset.name, dataset.questions
        if not dataset.passages:
            raise DataError(f"{name} has no passages to retrieve from: give it a corpus", path=dataset.path)
        if not 0 < heldout < len(questions):
            raise ConfigError(f"cannot hold out {heldout} of {name}'s {len(questions)} questions and train on the rest")
        chosen = set(random.Random(seed).sample(range(len(questions)), heldout))
        for i, q in enumerate(questions):
            (held if i in chosen else train).append((name, q))
        passages += [Passage(f"{name}:{p.id}", p.title, p.text) for p in dataset.passages]
    ids = [q.id for _, q in train + held]
    if len(set(ids)) != len(ids):
        raise DataError("two splits share a question id: the pool cannot tell their questions apart",
                        path=", ".join(d.path for d in datasets))
    return Pool(tuple(train), tuple(held), tuple(passages))


# The declared training pool of the search agents (issue 51): the two training splits, and the dev
# questions outside the headline tables' lists (the only other questions with a retrieval corpus offline);
# each (preset, committed question list or None). The headline lists stay held out.
DECLARED_POOL = (("hotpotqa-train100", None), ("musique-train100", None),
                 ("hotpotqa-dev500", "train-pool"), ("2wiki-dev1000", "train-pool"))


def declared_pool(sources: Sequence[tuple[str, str | None]] = DECLARED_POOL, data_dir: str | None = None,
                  seed: int | None = 0) -> Pool:
    """Every question of `sources` to train on (nothing held out of it: the held-out questions are the
    headline lists, `check_disjoint`), over the union of their passages, each split's passage ids
    prefixed by its name. A dev set's list shrinks its distractor pool to those questions' paragraphs.
    The questions come in a seeded random order (`seed`; None: source by source), so that a sampled
    filter over the pool that stops once it has kept enough (`scripts/cpu-queue`) keeps a random part of
    it, every source in its share, not the first sources whole."""
    from metarag.data.datasets import question_list, resolve_preset, select

    train: list[tuple[str, Question]] = []
    passages: list[Passage] = []
    for preset, listed in sources:
        dataset = resolve_preset(preset, data_dir)
        if listed:
            dataset = select(dataset, question_list(listed, preset).ids, source=f"question list {listed!r}")
        if not dataset.passages:
            raise DataError(f"{preset} has no passages to retrieve from", path=dataset.path)
        train += [(preset, q) for q in dataset.questions]
        passages += [Passage(f"{preset}:{p.id}", p.title, p.text) for p in dataset.passages]
    ids = [q.id for _, q in train]
    if len(set(ids)) != len(ids):
        raise DataError("two sources of the pool share a question id", path=", ".join(p for p, _ in sources))
    check_disjoint(ids)
    if seed is not None:
        random.Random(seed).shuffle(train)
    return Pool(tuple(train), (), tuple(passages))


def question_slice(dataset: Dataset, types: Sequence[str] = (), max_hops: int | None = None) -> Dataset:
    """The dataset with only the questions of `types` (HotpotQA's bridge / comparison; empty: any)
    and of at most `max_hops` hops (MuSiQue's 2 / 3 / 4; None: any), its passages kept: an easier
    slice of a training split to train on. A filter applies to a dataset that gives its questions that
    field (HotpotQA types, MuSiQue hops), so one call slices a mixture of both; there a question
    without the field is left out."""
    import dataclasses

    by_type = bool(types) and any(q.type for q in dataset.questions)
    by_hops = max_hops is not None and any(q.hops is not None for q in dataset.questions)
    keep = [i for i, q in enumerate(dataset.questions)
            if (not by_type or q.type in types) and (not by_hops or (q.hops is not None and q.hops <= max_hops))]
    if not keep:
        raise ConfigError(f"no question of {dataset.name} is of type {', '.join(types) or 'any'} with at most "
                          f"{max_hops if max_hops is not None else 'any'} hops")

    def aligned(values):  # the fields that run alongside the questions
        return tuple(values[i] for i in keep) if values and len(values) == len(dataset.questions) else values

    return dataclasses.replace(dataset, questions=aligned(dataset.questions), contexts=aligned(dataset.contexts),
                               missing_support=aligned(dataset.missing_support))


def unseen(datasets: Sequence[object], pool: Pool) -> tuple[tuple[str, Question], ...]:
    """Every question of `datasets` (the whole splits, before any slice) that `pool` does not train
    on, in file order: what a checkpoint trained on an easier slice is evaluated on when that slice's
    own held-out share is too small to test (it holds the slice's held-out questions and the harder
    ones the slice left out)."""
    trained = {q.id for _, q in pool.train}
    return tuple((d.name, q) for d in datasets for q in d.questions if q.id not in trained)


def _write_questions(path: Path, questions: Sequence[tuple[str, Question]],
                     passages: dict[str, Passage] | None = None) -> None:
    """FlashRAG lines, with each question's supporting paragraphs as [title, text] pairs where `passages`
    (the pool's, by prefixed id) holds them, so support recall and a retrieval reward can be read."""
    passages = passages or {}

    def supporting(source: str, q: Question) -> list[list[str]]:
        found = [passages.get(f"{source}:{pid}") for pid in q.supporting_ids]
        return [[p.title, p.text] for p in found if p is not None]

    lines = []
    for source, q in questions:
        record = {"id": q.id, "question": q.text, "golden_answers": list(q.answers), "source": source}
        if found := supporting(source, q):
            record["supporting"] = found
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))


def write_pool(pool: Pool, folder: str | Path, name: str = "pool",
               unseen_questions: Sequence[tuple[str, Question]] = ()) -> tuple[Path, ...]:
    """Write FOLDER/NAME_train.jsonl, NAME_heldout.jsonl and NAME_corpus.jsonl, and NAME_unseen.jsonl
    when `unseen_questions` are given (`unseen`); return their paths."""
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{name}_train.jsonl", out / f"{name}_heldout.jsonl", out / f"{name}_corpus.jsonl"
    by_id = {p.id: p for p in pool.passages}
    for path, questions in zip(paths, (pool.train, pool.heldout)):
        _write_questions(path, questions, by_id)
    paths[2].write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                for p in pool.passages))
    if unseen_questions:
        paths += (out / f"{name}_unseen.jsonl",)
        _write_questions(paths[3], unseen_questions, by_id)
    return paths
