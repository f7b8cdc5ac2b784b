"""Benchmark datasets: a question file (and optionally a corpus) in, a `Dataset` out; presets name them.

Formats are parsed in `metarag.data.formats`. Here the questions' own paragraphs become the
distractor pool, or a corpus file (`load_corpus`) replaces it, and each question's supporting
paragraphs become ids of passages in that pool.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from metarag.data.corpus import load_corpus, passage_id
from metarag.data.formats import FORMATS, ParsedQuestion, detect_format, parse_questions, read_question_file
from metarag.errors import ConfigError, DataError, close_matches
from metarag.records import Passage, Question

__all__ = ["DEMO", "EVIDENCE_FACTS", "FORMATS", "PRESETS", "Dataset", "Preset", "find_data_dir", "load_dataset",
           "QuestionList", "question_list", "resolve_preset", "sample", "select"]


@dataclass(frozen=True)
class Dataset:
    """A benchmark's questions, the passage pool they are asked over, and where both came from.

    `passages` is the distractor pool (the union of the questions' own paragraphs) or the corpus
    given with `corpus=`; None when the format has no paragraphs and no corpus was given.
    `contexts` holds, aligned with `questions`, the ids of each question's own paragraphs when the
    pool was built from them (None otherwise). `missing_support` counts, per question, the
    supporting paragraphs that could not be mapped to a passage of the pool.
    """

    name: str
    questions: tuple[Question, ...]
    passages: tuple[Passage, ...] | None
    path: str
    sha256: str
    format: str
    contexts: tuple[tuple[str, ...], ...] | None = None
    missing_support: tuple[int, ...] = ()
    corpus: str | None = None

    @property
    def unmapped_support(self) -> int:
        """How many supporting paragraphs, over all questions, have no passage in the pool."""
        return sum(self.missing_support)


def load_dataset(path: str | os.PathLike[str], format: str | None = None, *,
                 corpus: str | os.PathLike[str] | None = None,
                 ground_truth: str | os.PathLike[str] | None = None,
                 name: str | None = None, allow_unanswerable: bool = False,
                 pool: str | None = None) -> Dataset:
    """Read a benchmark question file in one of `FORMATS` (detected from its content when not named).

    `corpus` replaces the distractor pool with a corpus file's passages, supporting paragraphs
    being matched to them by title (and by text where a title repeats). `ground_truth` is the
    MultiHop-RAG answers file, found beside the queries when not given. A question without a gold
    answer or without text is refused (DataError naming its record); `allow_unanswerable` scores
    one without a gold answer as unanswerable instead (see `formats.UNANSWERABLE`). `pool` =
    EVIDENCE_FACTS ("evidence-facts") builds the passage pool from the supporting facts of every
    question instead (MultiHop-RAG without its corpus: see `_map_to_facts`).
    """
    if pool is not None and pool != EVIDENCE_FACTS:
        raise ConfigError(f"unknown passage pool {pool!r}; the one pool there is: {EVIDENCE_FACTS}")
    if pool is not None and corpus is not None:
        raise ConfigError(f"pool={pool!r} builds its own passages; give it no corpus")
    if format is not None and format not in FORMATS:
        raise ConfigError(f"unknown dataset format {format!r}{close_matches(format, FORMATS)}")
    file = read_question_file(path)
    format = format or detect_format(file)
    if ground_truth is not None and format != "multihop-rag":
        raise ConfigError(f"ground_truth= is for the multihop-rag format, not {format}")
    parsed = parse_questions(file, format, ground_truth=ground_truth, allow_unanswerable=allow_unanswerable)
    passages: tuple[Passage, ...] | None = None
    contexts: tuple[tuple[str, ...], ...] | None = None
    if corpus is not None:
        passages = tuple(load_corpus(corpus))
        questions, missing = _map_to_corpus(parsed, passages)
    elif pool == EVIDENCE_FACTS:
        passages, questions, missing = _map_to_facts(parsed, file.path)
    elif any(item.paragraphs is not None for item in parsed):
        passages, contexts, questions, missing = _map_to_paragraphs(parsed)
    else:  # no pool to map into: any supporting titles the file names stay unmapped
        questions = tuple(item.question for item in parsed)
        missing = tuple(len(item.supporting) for item in parsed)
    return Dataset(name=name or Path(path).stem, questions=questions, passages=passages, path=file.path,
                   sha256=_sha256(Path(path)), format=format, contexts=contexts, missing_support=missing,
                   corpus=None if corpus is None else str(corpus))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _map_to_paragraphs(parsed: list[ParsedQuestion]) -> tuple[
        tuple[Passage, ...], tuple[tuple[str, ...], ...], tuple[Question, ...], tuple[int, ...]]:
    """The distractor pool (the questions' paragraphs, once each, in order of first appearance)."""
    pool: dict[str, Passage] = {}
    contexts, questions, missing = [], [], []
    for item in parsed:
        ids = []
        for title, text in item.paragraphs or ():
            pid = passage_id(title, text)
            pool.setdefault(pid, Passage(pid, title, text))
            ids.append(pid)
        contexts.append(tuple(ids))
        support = [passage_id(title, text) for title, text in item.supporting if text is not None]
        questions.append(replace(item.question, supporting_ids=tuple(dict.fromkeys(support))))
        missing.append(len(item.supporting) - len(support))
    return tuple(pool.values()), tuple(contexts), tuple(questions), tuple(missing)


def _map_to_corpus(parsed: list[ParsedQuestion], passages: tuple[Passage, ...]) -> tuple[
        tuple[Question, ...], tuple[int, ...]]:
    """Supporting paragraphs as ids of corpus passages: by title, by text where a title repeats."""
    by_title: dict[str, list[Passage]] = {}
    for passage in passages:
        by_title.setdefault(passage.title, []).append(passage)
    questions, missing = [], []
    for item in parsed:
        found = [_corpus_match(by_title.get(title, []), text) for title, text in item.supporting]
        support = [p.id for p in found if p is not None]
        questions.append(replace(item.question, supporting_ids=tuple(dict.fromkeys(support))))
        missing.append(len(found) - len(support))
    return tuple(questions), tuple(missing)


def _map_to_facts(parsed: list[ParsedQuestion], path: str) -> tuple[
        tuple[Passage, ...], tuple[Question, ...], tuple[int, ...]]:
    """The evidence-fact pool: every question's supporting (title, fact) pairs, once each, as passages.

    MultiHop-RAG's news corpus is not offline; its ground truth names each query's evidence facts
    with their article titles (1,153 over the 500 queries of the shared sample, 438 of them
    distinct: a fact that several queries cite is one passage, so no top-k holds copies). Every
    question retrieves over the whole pool (all questions' facts, so the other questions' facts are
    its distractors; `sample` keeps the whole pool), and its supporting ids are its own facts'
    passages, found by article title and fact. Report it as "MultiHop-RAG, evidence-fact pool",
    never as the benchmark with its corpus.
    """
    pool: dict[str, Passage] = {}
    questions = []
    for item in parsed:
        ids = []
        for title, text in item.supporting:
            if text is None:
                continue
            pid = passage_id(title, text)
            pool.setdefault(pid, Passage(pid, title, text))
            ids.append(pid)
        questions.append(replace(item.question, supporting_ids=tuple(dict.fromkeys(ids))))
    if not pool:
        raise DataError("no supporting facts in any question: nothing to build the evidence-fact pool from",
                        path=path)
    return tuple(pool.values()), tuple(questions), tuple(0 for _ in parsed)


def _corpus_match(candidates: list[Passage], text: str | None) -> Passage | None:
    """The one passage among those with the paragraph's title that is the paragraph (or, for a
    chunked article, the chunk that holds it), if any is."""
    if len(candidates) == 1:
        return candidates[0]
    if text is None:
        return None
    # The last rule is MultiHop-RAG's retrieval_evaluate.py: the evidence fact, spaces and newlines
    # removed, is a substring of the chunk so stripped.
    for same in (lambda p: p.text == text, lambda p: _squash(p.text) == _squash(text),
                 lambda p: _unspaced(text) in _unspaced(p.text)):
        matches = [p for p in candidates if same(p)]
        if matches:
            return matches[0]
    return None


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _unspaced(text: str) -> str:
    return text.replace(" ", "").replace("\n", "")


def sample(dataset: Dataset, limit: int, seed: int) -> Dataset:
    """A seeded random `limit` of the questions, kept in file order; a paragraph pool shrinks to theirs."""
    total = len(dataset.questions)
    if limit < 1:
        raise ConfigError(f"sample limit must be at least 1, got {limit}")
    if limit > total:
        raise DataError(f"cannot sample {limit} questions: {dataset.name} has only {total}",
                        path=dataset.path)
    return _subset(dataset, sorted(random.Random(seed).sample(range(total), limit)))


def select(dataset: Dataset, ids: Sequence[str], *, source: str = "the question list") -> Dataset:
    """The questions whose ids are `ids`, kept in file order, a paragraph pool shrunk to theirs (as
    `sample` does); an id the dataset lacks, or one given twice, is a DataError naming `source`."""
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if list(ids).count(i) > 1)
        raise DataError(f"{source} names question {twice!r} twice", path=dataset.path)
    position = {q.id: n for n, q in enumerate(dataset.questions)}
    missing = [i for i in ids if i not in position]
    if missing:
        raise DataError(f"{source}: {len(missing)} of its {len(ids)} question ids are not in {dataset.name} "
                        f"(first {missing[0]!r})", path=dataset.path)
    return _subset(dataset, sorted(position[i] for i in ids))


def _subset(dataset: Dataset, chosen: Sequence[int]) -> Dataset:
    picked = replace(dataset, questions=tuple(dataset.questions[i] for i in chosen),
                     missing_support=tuple(dataset.missing_support[i] for i in chosen)
                     if dataset.missing_support else ())
    if dataset.contexts is None or dataset.passages is None:
        return picked
    contexts = tuple(dataset.contexts[i] for i in chosen)
    by_id = {p.id: p for p in dataset.passages}
    pool = dict.fromkeys(pid for context in contexts for pid in context)
    return replace(picked, contexts=contexts, passages=tuple(by_id[pid] for pid in pool))


# ----------------------------------------------------------------------------- question lists
@dataclass(frozen=True)
class QuestionList:
    """A committed list of question ids of one dataset: the questions a table runs on, so anyone re-runs
    exactly them (`--questions NAME|FILE`). `how` says how the ids were drawn."""

    name: str
    dataset: str
    ids: tuple[str, ...]
    how: str
    path: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256("\n".join(self.ids).encode()).hexdigest()


def _lists_folder():
    return resources.files("metarag") / "data" / "questions"


def named_question_lists(dataset: str | None = None) -> dict[str, list[str]]:
    """The lists shipped with metarag, {list name: [datasets it exists for]} (only `dataset`'s, given)."""
    out: dict[str, list[str]] = {}
    folder = _lists_folder()
    for entry in sorted(folder.iterdir(), key=lambda e: e.name) if folder.is_dir() else ():
        stem, _, rest = entry.name.partition(".")
        if rest.endswith(".json") and (dataset is None or stem == dataset):
            out.setdefault(rest[: -len(".json")], []).append(stem)
    return out


def question_list(spec: str, dataset: str) -> QuestionList:
    """The question list `spec` names for dataset `dataset`: a list shipped with metarag
    (`data/questions/<dataset>.<name>.json`, e.g. "headline200"), or a file of ids (a JSON list, a JSON
    object with "ids", or one id a line). A shipped list made for another dataset is a ConfigError."""
    entry = _lists_folder() / f"{dataset}.{spec}.json"
    if "/" not in spec and not spec.endswith((".json", ".txt")):
        if not entry.is_file():
            known = named_question_lists(dataset)
            raise ConfigError(f"no question list {spec!r} for {dataset}"
                              + (f"; lists: {', '.join(known)}" if known else " (metarag ships none for it)")
                              + "; or give a file of question ids")
        raw = json.loads(entry.read_text(encoding="utf-8"))
        if raw.get("dataset") != dataset:
            raise DataError(f"question list {spec!r} says it is for {raw.get('dataset')!r}, not {dataset}",
                            path=str(entry))
        return QuestionList(spec, dataset, tuple(map(str, raw["ids"])), raw.get("how", ""), str(entry))
    path = Path(spec).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no question list file {spec!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"unreadable question list: {exc}", path=str(path)) from None
    if text.lstrip().startswith(("[", "{")):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"question list is not valid JSON: {exc}", path=str(path)) from None
        ids = raw.get("ids") if isinstance(raw, dict) else raw
        if not isinstance(ids, list) or not all(isinstance(i, (str, int)) for i in ids):
            raise DataError("a question list holds a list of ids (or an object with \"ids\": [...])", path=str(path))
        how = raw.get("how", "") if isinstance(raw, dict) else ""
    else:
        ids, how = [line.strip() for line in text.splitlines() if line.strip()], ""
    if not ids:
        raise DataError("the question list is empty", path=str(path))
    return QuestionList(path.stem, dataset, tuple(map(str, ids)), how, str(path))


# ----------------------------------------------------------------------------------- presets
class Preset(NamedTuple):
    """A benchmark shipped in the shared data folder: question file, format, corpus (paths relative to it)."""

    path: str
    format: str
    corpus: str | None = None
    pool: str | None = None


EVIDENCE_FACTS = "evidence-facts"

PRESETS: dict[str, Preset] = {
    "hotpotqa-dev500": Preset("hotpotqa/dev500_ircot.jsonl", "ircot"),
    "hotpotqa-train100": Preset("hotpotqa/train100_official.json", "hotpotqa",
                                "hotpotqa/train100_corpus_hipporag.json"),
    "2wiki-dev1000": Preset("2wikimultihopqa/dev1000_hipporag_questions.json", "2wiki-hipporag",
                            "2wikimultihopqa/dev1000_hipporag_corpus.json"),
    "2wiki-dev38": Preset("2wikimultihopqa/dev38_official.jsonl", "2wiki"),
    "musique-train100": Preset("musique/train100_official.json", "musique"),
    "bamboogle": Preset("bamboogle/test125.jsonl", "flashrag"),
    "nq-1000": Preset("nq/test1000.jsonl", "flashrag"),
    "triviaqa-1000": Preset("triviaqa/test1000.jsonl", "flashrag"),
    "popqa-1000": Preset("popqa/test1000.jsonl", "flashrag"),
    "multihop-rag-500": Preset("multihop_rag/sample500_queries.json", "multihop-rag"),
    # "MultiHop-RAG, evidence-fact pool": the 500 queries over their own evidence facts (no news corpus)
    "multihop-rag-facts": Preset("multihop_rag/sample500_queries.json", "multihop-rag", pool=EVIDENCE_FACTS),
}

# The HotpotQA train100 files shipped inside the package, usable with no data folder at all.
DEMO = "demo"
_DEMO_QUESTIONS = "hotpotqa_train100.json"
_DEMO_CORPUS = "hotpotqa_train100_corpus.jsonl"

_NO_DATA_DIR = "set METARAG_DATA_DIR to the benchmark data folder, or pass a file with --dataset-file"


def find_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The benchmark data folder: `data_dir`, else $METARAG_DATA_DIR, else a `shared/data` found nearby.

    "Nearby" means: walking up from this module's folder, then from the working directory, the
    first folder P for which P/shared/data/README.md exists (the checkout sits beside `shared/`).
    """
    for given, origin in ((data_dir, "data_dir"), (os.environ.get("METARAG_DATA_DIR"), "METARAG_DATA_DIR")):
        if given:
            folder = Path(given).expanduser()
            if not folder.is_dir():
                raise ConfigError(f"{origin} {str(folder)!r} is not a folder; {_NO_DATA_DIR}")
            return folder
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for folder in (start, *start.parents):
            if (folder / "shared" / "data" / "README.md").is_file():
                return folder / "shared" / "data"
    raise ConfigError(f"no benchmark data folder found; {_NO_DATA_DIR}")


def resolve_preset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                   corpus: str | os.PathLike[str] | None = None, allow_unanswerable: bool = False) -> Dataset:
    """The dataset a preset name stands for (see `PRESETS`, and `DEMO` for the files in the package).
    `corpus` replaces the preset's own paragraphs (or gives the ones a preset lacks) with a corpus file."""
    if name == DEMO:
        if corpus is not None:
            raise ConfigError("the demo dataset retrieves from its own paragraphs; give it no corpus")
        return _load_demo()
    if name not in PRESETS:
        raise ConfigError(f"unknown dataset preset {name!r}{close_matches(name, [*PRESETS, DEMO])}")
    preset = PRESETS[name]
    folder = find_data_dir(data_dir)
    for relative in filter(None, (preset.path, preset.corpus)):
        if not (folder / relative).is_file():
            raise ConfigError(f"preset {name}: {relative} is not in the data folder {folder}; {_NO_DATA_DIR}")
    if corpus is None and preset.corpus:
        corpus = folder / preset.corpus
    return load_dataset(folder / preset.path, preset.format, corpus=corpus, name=name,
                        allow_unanswerable=allow_unanswerable, pool=preset.pool)


def _load_demo() -> Dataset:
    folder = resources.files("metarag") / "demo"
    questions, corpus = folder / _DEMO_QUESTIONS, folder / _DEMO_CORPUS
    if not (questions.is_file() and corpus.is_file()):
        raise ConfigError(f"the demo dataset is not installed (metarag/demo/{_DEMO_QUESTIONS} and "
                          f"{_DEMO_CORPUS}); reinstall metarag, or use another preset")
    with resources.as_file(questions) as questions_path, resources.as_file(corpus) as corpus_path:
        return load_dataset(questions_path, "hotpotqa", corpus=corpus_path, name=DEMO)


# The committed list each dataset holds out for evaluation: no training command may learn from its questions
HELD_OUT_LIST = "headline200"


def held_out_ids(listed: str = HELD_OUT_LIST) -> dict[str, frozenset[str]]:
    """The question ids each dataset holds out for evaluation: its committed `listed` list."""
    return {dataset: frozenset(question_list(listed, dataset).ids)
            for dataset in named_question_lists().get(listed, [])}


def check_disjoint(question_ids: Sequence[str], listed: str = HELD_OUT_LIST, what: str = "the training pool") -> None:
    """A DataError when any of `question_ids` is a held-out question of a headline list: training never
    sees an evaluation question."""
    for dataset, held in held_out_ids(listed).items():
        shared = sorted(held & set(question_ids))
        if shared:
            raise DataError(f"{what} holds {len(shared)} of {dataset}'s held-out {listed} questions "
                            f"(first {shared[0]!r}): they are for evaluation only")


# ------------------------------------------------------------------------------- training splits
TRAINING_PRESETS = frozenset({"hotpotqa-train100", "musique-train100", DEMO})
# "train" at the start of the name or after a non-letter: "train100_official", "my-train", not "retrain".
_TRAIN_WORD = re.compile(r"(?<![a-z])train")


def check_training_split(dataset: Dataset, allow_any: bool = False, *, trained: str = "a critic is trained") -> None:
    """Refuse to learn from an evaluation split, so no critic, router, agent or threshold ever sees
    the questions it is evaluated on. The one rule of every command that learns from questions (train-critic,
    train-router, train-agent, calibrate-judges); `trained` words the refusal for it.

    The rule: a preset is allowed only if it is one of TRAINING_PRESETS (hotpotqa-train100,
    musique-train100, demo); any other preset (hotpotqa-dev500, 2wiki-dev1000, bamboogle ...) is
    refused. A user file is allowed when its name says it is a training split ("train" at the start
    of the file name or after a non-letter: train.json, hotpotqa_train.json, my-train-set.jsonl);
    any other file needs `allow_any=True` (`--allow-any`), the user's word that it is. And whatever its
    name, a dataset whose questions include a held-out question of a committed headline list
    (`HELD_OUT_LIST`) is refused, `--allow-any` or not.
    """
    name = dataset.name
    if name in PRESETS and name not in TRAINING_PRESETS:
        raise ConfigError(f"{name} is an evaluation set: {trained} only on training splits "
                          f"({', '.join(sorted(TRAINING_PRESETS))}, or a file of your own training questions)")
    questions = getattr(dataset, "questions", None)
    if questions:
        check_disjoint([q.id for q in questions], what=f"the training set {name}")
    if name in TRAINING_PRESETS or allow_any or _TRAIN_WORD.search(name.lower()):
        return
    raise ConfigError(f"the file {dataset.path} is not named as a training split: rename it to say 'train' "
                      "(e.g. my_train.json) or pass allow_any=True (--allow-any) if it holds no evaluation questions")
