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

from metarag.data.datasets import Dataset
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


def _write_questions(path: Path, questions: Sequence[tuple[str, Question]]) -> None:
    path.write_text("".join(json.dumps({"id": q.id, "question": q.text, "golden_answers": list(q.answers),
                                        "source": source}) + "\n" for source, q in questions))


def write_pool(pool: Pool, folder: str | Path, name: str = "pool",
               unseen_questions: Sequence[tuple[str, Question]] = ()) -> tuple[Path, ...]:
    """Write FOLDER/NAME_train.jsonl, NAME_heldout.jsonl and NAME_corpus.jsonl, and NAME_unseen.jsonl
    when `unseen_questions` are given (`unseen`); return their paths."""
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{name}_train.jsonl", out / f"{name}_heldout.jsonl", out / f"{name}_corpus.jsonl"
    for path, questions in zip(paths, (pool.train, pool.heldout)):
        _write_questions(path, questions)
    paths[2].write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                for p in pool.passages))
    if unseen_questions:
        paths += (out / f"{name}_unseen.jsonl",)
        _write_questions(paths[3], unseen_questions)
    return paths
