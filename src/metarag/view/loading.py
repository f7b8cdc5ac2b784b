"""The viewer's reading of run folders: the report table (`evaluate/report.py`'s own code), the newest
result of each question, one trace's raw JSON when it is opened, and every problem with the files,
said on the page rather than raised.

Result lines are parsed as `RunStore.load_attempts` parses them (`from_plain(QuestionResult, ...)`; the
newest line of a question counts). Where `metarag report` refuses a whole run (a torn or corrupt line,
a step kind this metarag does not know) the viewer skips the bad line, or keeps the unknown step as
raw JSON with its usage counted, and lists the problem. A sharded run's shard files are read as one
run, and a shard that has not finished is listed as a problem. Nothing here writes to a run folder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from metarag.errors import MetaRAGError
from metarag.evaluate.report import LoadedRun, incomplete_note, report_table
from metarag.evaluate.runs import QuestionResult, RunStore
from metarag.records import STEP_TYPES, Decide, Step, Usage, from_plain

_PARSE_ERRORS = (TypeError, KeyError, ValueError, AttributeError, IndexError)


@dataclass(frozen=True)
class UnknownStep(Step):
    """A trace step this metarag cannot read (an unknown kind, or fields that do not fit its kind),
    kept as raw JSON so that the page can show it and its usage still counts in the run's cost."""

    kind: ClassVar[str] = "unknown"
    raw: Any = None
    note: str = ""


def read_step(raw: Any) -> tuple[Step, str | None]:
    """A step of a trace's JSON as its record, or as an UnknownStep with a note saying why."""
    if not isinstance(raw, dict):
        return UnknownStep(usage=Usage(), raw=raw, note="a step that is not a JSON object"), \
            "a step that is not a JSON object"
    kind = raw.get("kind")
    if kind not in STEP_TYPES:
        note = f"unknown step kind {kind!r} (written by another version of metarag?)"
    else:
        try:
            return from_plain(Step, raw), None
        except _PARSE_ERRORS as exc:
            note = f"a {kind!r} step whose fields this metarag cannot read ({type(exc).__name__}: {exc})"
    return UnknownStep(usage=_usage(raw.get("usage")), raw=raw, note=note), note


def _usage(raw: Any) -> Usage:
    names = {f.name for f in dataclasses.fields(Usage)}
    if not isinstance(raw, dict):
        return Usage()
    values = {k: v for k, v in raw.items() if k in names and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Usage(**values)


def parse_result(obj: Any) -> tuple[QuestionResult, list[str]]:
    """One results.jsonl record, and a note per step that could not be read (none for a clean line).
    ValueError when the line is no result record at all."""
    try:
        return from_plain(QuestionResult, obj), []
    except _PARSE_ERRORS as exc:
        first = f"{type(exc).__name__}: {exc}"
    if not isinstance(obj, dict) or not isinstance(obj.get("trace"), dict):
        raise ValueError(first)
    trace = obj["trace"]
    raw_steps = trace.get("steps") or []
    if not isinstance(raw_steps, list):
        raise ValueError("its trace's steps are not a list")
    steps, notes = [], []
    for number, raw in enumerate(raw_steps, 1):
        step, note = read_step(raw)
        steps.append(step)
        if note:
            notes.append(f"step {number}: {note}")
    try:
        result = from_plain(QuestionResult, {**obj, "trace": {**trace, "steps": []}})
    except _PARSE_ERRORS as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    trace_record = dataclasses.replace(result.trace, steps=tuple(steps))
    return dataclasses.replace(result, trace=trace_record), notes


class ParsedLine:
    """One results.jsonl line as read: its result and step notes, or why it is no result; `cell` is
    the question list's view of the result, computed once."""

    __slots__ = ("result", "notes", "why", "_cell")

    def __init__(self, result: QuestionResult | None, notes: list[str], why: str | None):
        self.result, self.notes, self.why, self._cell = result, notes, why, None

    @property
    def cell(self) -> dict:
        if self._cell is None:
            self._cell = question_cell(self.result)
        return self._cell


def parse_line(line: bytes) -> ParsedLine:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return ParsedLine(None, [], f"is torn or corrupt (not JSON: {exc})")
    try:
        result, notes = parse_result(obj)
    except ValueError as exc:
        return ParsedLine(None, [], f"is not a result record ({exc})")
    return ParsedLine(result, notes, None)


def read_results(path: Path, cache: dict[bytes, ParsedLine] | None = None
                 ) -> tuple[dict[str, ParsedLine], dict[str, tuple[int, int]], list[dict]]:
    """The newest readable result line of each question, the byte span of that line in the file (to
    read its trace again when it is opened), and the problems found, each {line, question_id, message}.

    `cache` maps a line's digest to its parse: a line already read (a run being written is reread
    as it grows) is not parsed again. It is left holding the lines of this read only."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if cache is not None:
            cache.clear()
        return {}, {}, []
    newest: dict[str, ParsedLine] = {}
    spans: dict[str, tuple[int, int]] = {}
    problems: list[dict] = []
    seen: dict[bytes, ParsedLine] = {}
    start = number = 0
    while start < len(raw):
        end = raw.find(b"\n", start)
        number += 1
        if end < 0:
            problems.append(_problem(number, None, f"results.jsonl line {number} is torn (cut short, no newline: "
                                                   "the run was killed mid-write or is being written); skipped"))
            break
        line, span, start = raw[start:end], (start, end), end + 1
        if not line.strip():
            continue
        key = hashlib.blake2b(line, digest_size=16).digest()
        parsed = seen.get(key) or (cache.get(key) if cache is not None else None) or parse_line(line)
        seen[key] = parsed
        if parsed.result is None:
            problems.append(_problem(number, None, f"results.jsonl line {number} {parsed.why}; skipped"))
            continue
        qid = parsed.result.question_id
        for note in parsed.notes:
            problems.append(_problem(number, qid, f"question {qid} (line {number}), {note}: shown as raw JSON"))
        newest[qid] = parsed
        spans[qid] = span
    if cache is not None:
        cache.clear()
        cache.update(seen)
    return newest, spans, problems


def _problem(line: int | None, question_id: str | None, message: str) -> dict:
    return {"line": line, "question_id": question_id, "message": message}


# ------------------------------------------------------------------------------- one question
def search_flags(result: QuestionResult) -> tuple[bool | None, bool | None]:
    """(over-searched, under-searched) for a method that decides when to search (its trace has
    Decide steps); (None, None) for one that does not.

    With EvoCtx's oracle margins recorded, as `evoctx_analysis.oracle_agreement` counts them: over
    when a decision's margin said RETRIEVE (> 0) where the oracle's said THINK, under the reverse.
    Otherwise from the supporting passages: over when it searched again although the first round
    already held every supporting passage; under when it answered wrong without having them all."""
    decisions = [s for s in result.trace.steps if isinstance(s, Decide)]
    if not decisions:
        return None, None
    pairs = [(d.signals["margin"], d.signals["oracle_margin"]) for d in decisions
             if "margin" in d.signals and "oracle_margin" in d.signals]
    if pairs:
        return any(m > 0 >= o for m, o in pairs), any(o > 0 >= m for m, o in pairs)
    over = len(result.trace.retrieval_rounds()) > 1 and result.first_support_recall == 1.0
    under = (not result.failed and result.scores.em == 0 and result.support_recall is not None
             and result.support_recall < 1.0)
    return over, under


def question_cell(result: QuestionResult) -> dict:
    """What the question list shows of one run's result for one question."""
    usage = result.trace.usage
    over, under = search_flags(result)
    return {"answer": result.prediction, "em": result.scores.em, "f1": result.scores.f1,
            "failed": result.failed, "retryable": result.retryable,
            "error": _one_line(result.error) if result.error else None,
            "requests": usage.llm_requests, "tokens": usage.total_tokens, "latency": usage.latency_s,
            # of the requests: answered by the model, and by metarag's response cache
            "served_requests": usage.llm_requests - usage.cache_hits, "cached_requests": usage.cache_hits,
            "retrievals": usage.retrieval_calls, "steps": len(result.trace.steps),
            "over_search": over, "under_search": under,
            "unreadable_steps": sum(isinstance(s, UnknownStep) for s in result.trace.steps)}


def _one_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ------------------------------------------------------------------------------------ datasets
@dataclass(frozen=True)
class DatasetInfo:
    """What a run folder does not keep of its questions: type, hops and supporting passages, read
    from the dataset the run names; `note` says why they are missing when they are."""

    types: dict[str, str | None] = field(default_factory=dict)
    hops: dict[str, int | None] = field(default_factory=dict)
    supporting: dict[str, tuple[str, ...]] = field(default_factory=dict)
    note: str | None = None


_DATASETS: dict[str, DatasetInfo] = {}
_DATASETS_LOCK = threading.Lock()


def dataset_info(settings: dict) -> DatasetInfo:
    """The question types and supporting passages of the dataset a run's settings name (cached)."""
    spec = settings.get("dataset") if isinstance(settings.get("dataset"), dict) else {}
    key = json.dumps({k: spec.get(k) for k in ("preset", "file", "format", "corpus")}, sort_keys=True)
    with _DATASETS_LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = _load_dataset_info(spec)
        return _DATASETS[key]


def _load_dataset_info(spec: dict) -> DatasetInfo:
    from metarag.evaluate.harness import run_dataset

    if not (spec.get("preset") or spec.get("file")):
        return DatasetInfo(note="the run's settings name no dataset: no question types or supporting flags")
    try:
        dataset = run_dataset({"dataset": spec})
    except (MetaRAGError, OSError, ValueError) as exc:
        return DatasetInfo(note=f"the run's dataset cannot be read ({_one_line(str(exc))}): no question types or "
                                "supporting flags")
    note = None
    if spec.get("sha256") and dataset.sha256 != spec["sha256"]:
        note = "the dataset changed since the run (its sha256 differs): types and supporting flags may not match"
    questions = dataset.questions
    return DatasetInfo({q.id: q.type for q in questions}, {q.id: q.hops for q in questions},
                       {q.id: tuple(q.supporting_ids) for q in questions}, note)


# ------------------------------------------------------------------------------------- one run
class RunView:
    """One folder named on the command line as the page shows it: its LoadedRun (for the report
    code), the newest result per question, and its problems. `refresh` rereads it when its files
    changed, so a run being written can be watched; a folder that is no run has `error` set."""

    FILES = ("settings.json", "questions.json", "manifest.json", "shards.json", "results.jsonl")

    def __init__(self, path: str | Path, name: str | None = None):
        self.path = Path(path)
        self.name = name or self.path.name or str(self.path)
        self.error: str | None = None
        self.problems: list[dict] = []
        self.run: LoadedRun | None = None
        self.results: dict[str, QuestionResult] = {}
        self.cells: dict[str, dict] = {}
        self._spans: dict[str, tuple[Path, int, int]] = {}  # each result's line: its file, and where in it
        self._stamp: tuple | None = None
        self._lines: dict[Path, dict[bytes, ParsedLine]] = {}  # the parse of each line read, by file and digest
        self._lock = threading.Lock()
        self.refresh()

    @property
    def store(self) -> RunStore:
        return RunStore(self.path)

    def stamp(self) -> tuple:
        out = []
        shards = sorted(p.name for _, p in self.store.result_files() if p.name != "results.jsonl")
        for name in (*self.FILES, *shards):
            try:
                st = (self.path / name).stat()
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def refresh(self) -> bool:
        """Reread the folder if any of its files changed since the last read; True if it did."""
        with self._lock:
            stamp = self.stamp()
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            self._load()
            return True

    def _load(self) -> None:
        """Read the folder into a fresh state, then swap it in whole: a request served meanwhile sees
        the old state or the new one, never half of each."""
        st = SimpleNamespace(error=None, problems=[], run=None, results={}, cells={}, _spans={})
        try:
            self._read_into(st)
        except Exception as exc:  # whatever is in the folder, the page says so instead of failing
            st.error = f"{self.path}: cannot be read ({type(exc).__name__}: {exc})"
            st.run = None
        self.__dict__.update(vars(st))

    def _read_into(self, st: SimpleNamespace) -> None:
        if not self.path.exists():
            st.error = f"{self.path}: no such folder"
            return
        if not self.path.is_dir():
            st.error = f"{self.path}: not a folder (give a run folder, runs/<run-id>)"
            return
        store = self.store
        if not store.settings_path.is_file():
            st.error = (f"{self.path}: not a metarag run folder (it has no settings.json, which metarag eval "
                        "writes into runs/<run-id>)")
            return
        try:
            settings = store.read_json("settings.json")
            ids = store.read_json("questions.json")
            manifest = store.read_json("manifest.json") if store.manifest_path.exists() else {}
        except MetaRAGError as exc:
            st.error = str(exc)
            return
        if not isinstance(settings, dict) or not isinstance(ids, list) or not isinstance(manifest, dict):
            st.error = f"{self.path}: settings.json, questions.json or manifest.json is not what metarag eval writes"
            return
        if not store.manifest_path.exists():
            st.problems.append(_problem(None, None, "no manifest.json: model and dataset hashes unknown"))
        newest: dict[str, ParsedLine] = {}
        spans: dict[str, tuple[Path, int, int]] = {}
        files = [path for _, path in store.result_files()]
        for path in files:
            found, where, problems = read_results(path, self._lines.setdefault(path, {}))
            newest.update(found)
            spans.update({q: (path, *span) for q, span in where.items()})
            # a shard's problem names its file; results.jsonl's read as they always have
            st.problems += problems if path.name == "results.jsonl" else [
                {**pr, "message": pr["message"].replace("results.jsonl", path.name, 1)} for pr in problems]
        for gone in set(self._lines) - set(files):
            del self._lines[gone]
        if not files:
            st.problems.append(_problem(None, None, "no results.jsonl yet: no question has finished"))
        ids = [str(i) for i in ids]
        known = set(ids)
        strays = [q for q in newest if q not in known]
        if strays:
            st.problems.append(_problem(None, None, f"{len(strays)} results for questions not in questions.json "
                                                    f"(first: {strays[0]}); left out"))
        st.results = {q: newest[q].result for q in ids if q in newest}
        st._spans = spans
        st.cells = {q: newest[q].cell for q in st.results}
        missing = tuple(store.missing_shards(ids, st.results))
        st.run = LoadedRun(name=self.name, path=self.path, settings=settings, manifest=manifest,
                           question_ids=tuple(ids), results=tuple(st.results.values()), missing_shards=missing)
        if missing:
            st.problems.append(_problem(None, None, incomplete_note(st.run)))

    def raw_trace(self, question_id: str) -> tuple[dict | None, str | None]:
        """The newest result line of a question as raw JSON, read again from the file (only now that
        it is opened), or None and why not."""
        span = self._spans.get(question_id)
        if span is None:
            return None, f"{self.name} has no result for question {question_id}"
        path, start, end = span
        try:
            with open(path, "rb") as f:
                f.seek(start)
                line = f.read(end - start)
            obj = json.loads(line)
        except (OSError, ValueError) as exc:
            return None, f"{path}: cannot read the line of question {question_id} again ({exc})"
        if not isinstance(obj, dict) or obj.get("question_id") != question_id:
            return None, f"{path} changed under the viewer; reload the page"
        return obj, None

    def dataset(self) -> DatasetInfo:
        return dataset_info(self.run.settings) if self.run is not None else DatasetInfo()


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The run folders named: a folder that is no run but holds run folders (runs/) stands for them."""
    out: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir() and not (path / "settings.json").exists():
            children = sorted(p for p in path.iterdir() if p.is_dir() and (p / "settings.json").is_file())
            if children:
                out += children
                continue
        out.append(path)
    return out


# --------------------------------------------------------------------------------- runs table
def runs_table(views: Sequence[RunView]) -> dict:
    """The report table of the runs that have results, exactly as `metarag report` prints it (the
    same `report_table` call; its markdown split into cells), the rows behind it, and notes."""
    ready = [v for v in views if v.run is not None and v.run.results]
    notes = [f"{v.name}: no finished question yet, so no row" for v in views if v.run is not None
             and not v.run.results]
    if not ready:
        return {"columns": [], "rows": [], "cells": [], "runs": [], "notes": notes, "markdown": ""}
    runs = [v.run for v in ready]
    baseline: int | None = 0 if len(runs) > 1 else None
    try:
        markdown, rows = report_table(runs, baseline=baseline)
    except MetaRAGError as exc:
        if baseline is None:
            raise
        notes.append(f"no significance against {runs[0].name}: {exc}")
        markdown, rows = report_table(runs, baseline=None)
    lines = markdown.splitlines()
    columns = _cells(lines[0])
    cells = [_cells(line) for line in lines[2:2 + len(rows)]]
    notes += [line for line in lines[2 + len(rows):] if line.strip()]
    return {"columns": columns, "cells": cells, "rows": [clean_json(r) for r in rows],
            "runs": [views.index(v) for v in ready], "notes": notes, "markdown": markdown}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def clean_json(value: Any) -> Any:
    """A value safe for strict JSON: NaN and infinities become None (a p-value of a constant metric)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value
