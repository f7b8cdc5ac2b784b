"""Benchmark question files in, parsed questions out: one parser per official format, as published.

Each parser returns, per question, the `Question` (without supporting ids yet), the question's own
paragraphs when the format carries them, and its supporting paragraphs as (title, text) pairs;
`metarag.data.datasets` turns those into a passage pool and supporting passage ids.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from metarag.errors import DataError
from metarag.records import Question

_UTF8_BOM = "\ufeff"

# Top-level keys of a JSON object that holds the question records as a list.
_CONTAINER_KEYS = ("queries", "data", "questions")


@dataclass(frozen=True)
class Record:
    """One question record and where it sits, so a bad field's error names file and line or record."""

    data: dict[str, Any]
    path: str
    index: int  # 0-based position among the file's records
    line: int | None = None  # JSON lines: 1-based line number

    def error(self, message: str, field: str | None = None) -> DataError:
        """A DataError pointing at this record (its line, or its position in a JSON document)."""
        if self.line is None:
            message = f"record {self.index}: {message}"
        return DataError(message, path=self.path, line=self.line, field=field)

    def value(self, *names: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
        """The first of `names` present (not null) in the record, checked to be of `kind`."""
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                raise self.error(f"expected {expected}, found {type(value).__name__}", field=name)
            return value
        if required:
            raise self.error("missing field", field=" or ".join(names))
        return None

    def text(self, *names: str, required: bool = True) -> str | None:
        """A string field."""
        return self.value(*names, kind=str, required=required)

    def ident(self, *names: str, required: bool = True) -> str | None:
        """An id field; integer ids are read as their decimal string."""
        value = self.value(*names, kind=(str, int), required=required)
        if value == "":
            raise self.error("empty id", field=names[0])
        return None if value is None else str(value)

    def strings(self, name: str, *, required: bool = True) -> list[str]:
        """A list-of-strings field (an absent optional one is empty)."""
        values = self.value(name, kind=list, required=required) or []
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise self.error(f"expected a list of strings, item {i} is {type(value).__name__}",
                                 field=name)
        return values


@dataclass(frozen=True)
class QuestionFile:
    """The records of a question file; `container` is the top-level key that held them, if any."""

    path: str
    records: tuple[Record, ...]
    container: str | None = None


@dataclass(frozen=True)
class ParsedQuestion:
    """A question as its file states it, before its supporting paragraphs are mapped to passage ids.

    `paragraphs` are the question's own (title, text) paragraphs in file order, None when the
    format carries none; `supporting` are the (title, text) of its supporting paragraphs, the text
    None where the file names only a title that none of its paragraphs has.
    """

    question: Question
    paragraphs: tuple[tuple[str, str], ...] | None
    supporting: tuple[tuple[str, str | None], ...] = ()


# ------------------------------------------------------------------------------------ reading
def read_question_file(path: str | Path) -> QuestionFile:
    """The records of a JSON array, a JSON object holding a list of records, or a JSON-lines file."""
    where = str(path)
    try:
        raw = Path(path).read_text(encoding="utf-8").removeprefix(_UTF8_BOM)
    except FileNotFoundError:
        raise DataError("question file not found", path=where) from None
    except IsADirectoryError:
        raise DataError("question path is a directory, not a file", path=where) from None
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path=where) from None
    except OSError as exc:
        raise DataError(f"cannot read question file: {exc.strerror or exc}", path=where) from None
    if not raw.strip():
        raise DataError("empty question file", path=where)
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        # A sound first value followed by more is JSON lines; any other failure is where it says.
        if exc.msg != "Extra data":
            raise DataError(f"malformed JSON: {exc.msg} (column {exc.colno})", path=where,
                            line=exc.lineno) from None
        document = None
    if document is None:
        file = QuestionFile(where, tuple(_json_lines(raw, where)))
    elif isinstance(document, list):
        file = QuestionFile(where, tuple(_records(document, where)))
    elif isinstance(document, dict):
        key = next((k for k in _CONTAINER_KEYS if isinstance(document.get(k), list)), None)
        # A whole-file object without a record list is a one-line JSON-lines file.
        records = _records(document[key], where) if key else [Record(document, where, 0, line=1)]
        file = QuestionFile(where, tuple(records), container=key)
    else:
        raise DataError(f"expected JSON records, found a {type(document).__name__}", path=where)
    if not file.records:
        raise DataError("no question records", path=where)
    return file


def _records(items: list[Any], where: str) -> Iterable[Record]:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DataError(f"record {i}: expected a JSON object, found {type(item).__name__}", path=where)
        yield Record(item, where, i)


def _json_lines(raw: str, where: str) -> Iterable[Record]:
    index = 0
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():  # blank lines (often the last) are not records
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"malformed JSON line: {exc.msg} (column {exc.colno})", path=where,
                            line=lineno) from None
        if not isinstance(item, dict):
            raise DataError(f"expected a JSON object, found {type(item).__name__}", path=where, line=lineno)
        yield Record(item, where, index, line=lineno)
        index += 1


# --------------------------------------------------------------------------------- detection
def detect_format(file: QuestionFile) -> str:
    """The format of a question file, told from its container and the keys of every record.

    Each record admits one format, or two where its keys cannot tell them apart (a `context`
    without `evidences` or HotpotQA's `level` is HotpotQA or 2Wiki); the file's format is the one
    every record admits (HotpotQA where both still do). A record that admits none of the formats
    the records before it admit is refused, naming it: a file holds one format.
    """
    admitted: tuple[str, ...] | None = None
    first: Record | None = None
    for record in file.records:
        formats = _record_formats(record, file.container)
        if admitted is None:
            admitted, first = formats, record
            continue
        common = tuple(f for f in admitted if f in formats)
        if not common:
            at = f"line {first.line}" if first.line is not None else f"record {first.index}"
            raise record.error(f"its keys read as {' or '.join(formats)}, but {at} reads as "
                               f"{' or '.join(admitted)}: a file holds one format (name it with --format "
                               f"to read every record as that one)")
        admitted = common
    if not admitted:
        raise DataError("no question records", path=file.path)
    return admitted[0]


def check_format(file: QuestionFile, format: str) -> None:
    """Refuse a format named for a file (`--format`) that the file's content contradicts: no record's keys
    admit it and some read as another format (a 2Wiki file named hotpotqa). A file whose keys tell no
    format, or that mixes formats with the named one among them, is read as named."""
    other: tuple[Record, tuple[str, ...]] | None = None
    for record in file.records:
        try:
            formats = _record_formats(record, file.container)
        except DataError:  # keys that tell no format: naming one is how such a file is read
            continue
        if format in formats:
            return
        other = other or (record, formats)
    if other is not None:
        record, formats = other
        raise record.error(f"the format {format!r} contradicts the file's content: its records read as "
                           f"{' or '.join(formats)} by their keys ({', '.join(sorted(record.data)[:8])}); leave the "
                           f"format out to read it as {formats[0]}")


def _record_formats(record: Record, container: str | None) -> tuple[str, ...]:
    """The formats one record's keys admit, most likely first."""
    keys = set(record.data)
    if container == "queries" or "query" in keys:
        return ("multihop-rag",)
    if "question_text" in keys or "answers_objects" in keys:
        return ("ircot",)
    if "question_decomposition" in keys or "paragraphs" in keys:
        return ("musique",)
    if "golden_answers" in keys:
        return ("flashrag",)
    if "context" in keys:
        if "evidences" in keys:
            return ("2wiki",)
        return ("hotpotqa",) if "level" in keys else ("hotpotqa", "2wiki")
    if "question" in keys and keys & {"evidence", "evidences", "question_type"}:
        return ("2wiki-hipporag",)
    raise record.error(f"cannot tell the dataset format from its keys ({', '.join(sorted(keys))}); "
                       f"name it with --format, one of: {', '.join(sorted(FORMATS))}")


# ----------------------------------------------------------------------------------- parsers
def gold_answers(*groups: Iterable[str]) -> tuple[str, ...]:
    """Answers in order (the gold answer first, then aliases), stripped, without blanks or repeats."""
    seen: dict[str, None] = {}
    for group in groups:
        for answer in group:
            answer = answer.strip()
            if answer:
                seen.setdefault(answer, None)
    return tuple(seen)


def _context(record: Record, join: Callable[[list[str]], str]) -> list[tuple[str, str]]:
    """HotpotQA / 2Wiki `context`: [[title, [sentences]], ...] as (title, joined text) pairs."""
    paragraphs = []
    for j, item in enumerate(record.value("context", kind=list)):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], list) and all(isinstance(s, str) for s in item[1])):
            raise record.error(f"context[{j}] is not [title, [sentences]]", field="context")
        paragraphs.append((item[0], join(item[1])))
    return paragraphs


def _supporting_titles(record: Record) -> list[str]:
    """The titles named by `supporting_facts` ([title, sentence index] pairs), in order, once each."""
    titles: dict[str, None] = {}
    for j, fact in enumerate(record.value("supporting_facts", kind=list, required=False) or []):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)
                and isinstance(fact[1], int)):
            raise record.error(f"supporting_facts[{j}] is not [title, sentence index]",
                               field="supporting_facts")
        titles.setdefault(fact[0], None)
    return list(titles)


def _support_by_title(titles: list[str],
                      paragraphs: list[tuple[str, str]]) -> tuple[tuple[str, str | None], ...]:
    """Each supporting title's paragraphs among the question's own (all of them if a title repeats)."""
    supporting: dict[tuple[str, str | None], None] = {}
    for title in titles:
        matches = [p for p in paragraphs if p[0] == title]
        for paragraph in matches or [(title, None)]:
            supporting.setdefault(paragraph, None)
    return tuple(supporting)


def _wiki_style(file: QuestionFile, join: Callable[[list[str]], str]) -> list[ParsedQuestion]:
    """HotpotQA and 2WikiMultiHopQA official JSON: _id, question, answer, context, supporting_facts."""
    parsed = []
    for record in file.records:
        paragraphs = _context(record, join)
        question = Question(
            id=record.ident("_id", "id"),
            text=record.text("question"),
            answers=gold_answers([record.text("answer")], record.strings("answer_aliases", required=False)),
            type=record.text("type", required=False),
        )
        supporting = _support_by_title(_supporting_titles(record), paragraphs)
        parsed.append(ParsedQuestion(question, tuple(paragraphs), supporting))
    return parsed


def parse_hotpotqa(file: QuestionFile) -> list[ParsedQuestion]:
    """Official HotpotQA; a paragraph's sentences carry their own leading spaces, so join with ""."""
    return _wiki_style(file, lambda sentences: "".join(sentences).strip())


def parse_2wiki(file: QuestionFile) -> list[ParsedQuestion]:
    """Official 2WikiMultiHopQA; its sentences have no leading spaces, so join with " " (as HippoRAG)."""
    return _wiki_style(file, " ".join)


def parse_2wiki_hipporag(file: QuestionFile) -> list[ParsedQuestion]:
    """HippoRAG's 2Wiki question file: no paragraphs (the corpus is a separate file).

    Evidence triples name entities, not paragraph titles, so they are not used as support; only
    `supporting_facts`, where a file has them, name supporting titles (mapped through a corpus).
    """
    parsed = []
    for record in file.records:
        question = Question(
            id=record.ident("id", "_id"),
            text=record.text("question"),
            answers=gold_answers([record.text("answer")], record.strings("answer_aliases", required=False)),
            type=record.text("question_type", "type", required=False),
        )
        supporting = tuple((title, None) for title in _supporting_titles(record))
        parsed.append(ParsedQuestion(question, None, supporting))
    return parsed


def _paragraph(record: Record, field: str, j: int, item: Any, text_key: str) -> tuple[str, str, bool]:
    """One {title, <text_key>, is_supporting} paragraph of IRCoT contexts or MuSiQue paragraphs."""
    at = f"{field}[{j}]"
    if not isinstance(item, dict):
        raise record.error(f"expected an object, found {type(item).__name__}", field=at)
    for key, kind in (("title", str), (text_key, str), ("is_supporting", bool)):
        if not isinstance(item.get(key), kind):
            found = "nothing" if item.get(key) is None else type(item.get(key)).__name__
            raise record.error(f"expected {kind.__name__}, found {found}", field=f"{at}.{key}")
    return item["title"], item[text_key], item["is_supporting"]


def parse_ircot(file: QuestionFile) -> list[ParsedQuestion]:
    """IRCoT-processed JSON lines: question_id, question_text, answers_objects[].spans, contexts[]."""
    parsed = []
    for record in file.records:
        spans: list[str] = []
        for j, obj in enumerate(record.value("answers_objects", kind=list)):
            if not isinstance(obj, dict) or not isinstance(obj.get("spans", []), list):
                raise record.error("expected {spans: [...]}", field=f"answers_objects[{j}]")
            for span in obj.get("spans", []):
                if not isinstance(span, str):
                    raise record.error("expected string spans", field=f"answers_objects[{j}].spans")
                spans.append(span)
            if isinstance(obj.get("number"), str):  # DROP-style numeric answers; "" when unused
                spans.append(obj["number"])
        contexts = [_paragraph(record, "contexts", j, item, "paragraph_text")
                    for j, item in enumerate(record.value("contexts", kind=list))]
        question = Question(id=record.ident("question_id"), text=record.text("question_text"),
                            answers=gold_answers(spans))
        parsed.append(ParsedQuestion(question, tuple((t, x) for t, x, _ in contexts),
                                     tuple(dict.fromkeys((t, x) for t, x, s in contexts if s))))
    return parsed


_MUSIQUE_TYPE = re.compile(r"^(\d+hop\d*)__")


def parse_musique(file: QuestionFile) -> list[ParsedQuestion]:
    """Official MuSiQue: id, question, answer, answer_aliases, paragraphs[], question_decomposition.

    hops = len(question_decomposition); the type is the id's prefix (2hop, 3hop1, 4hop3 ...).
    """
    parsed = []
    for record in file.records:
        qid = record.ident("id")
        paragraphs = [_paragraph(record, "paragraphs", j, item, "paragraph_text")
                      for j, item in enumerate(record.value("paragraphs", kind=list))]
        hops = len(record.value("question_decomposition", kind=list, required=False) or []) or None
        prefix = _MUSIQUE_TYPE.match(qid)
        question = Question(
            id=qid,
            text=record.text("question"),
            answers=gold_answers([record.text("answer")], record.strings("answer_aliases", required=False)),
            type=prefix.group(1) if prefix else (f"{hops}hop" if hops else None),
            hops=hops,
        )
        parsed.append(ParsedQuestion(question, tuple((t, x) for t, x, _ in paragraphs),
                                     tuple(dict.fromkeys((t, x) for t, x, s in paragraphs if s))))
    return parsed


def parse_flashrag(file: QuestionFile) -> list[ParsedQuestion]:
    """FlashRAG JSON lines (NQ, TriviaQA, PopQA, Bamboogle ...): id, question, golden_answers; and, in
    metarag's training pools (`data.pool.write_pool`), `supporting`, [title, text] pairs of the question's
    supporting paragraphs, found in the corpus given with the file."""
    parsed = []
    for record in file.records:
        supporting = record.data.get("supporting", [])
        if not isinstance(supporting, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in supporting):
            raise DataError(f"record {record.index}: supporting must be a list of [title, text] pairs", path=file.path)
        parsed.append(ParsedQuestion(Question(id=record.ident("id"), text=record.text("question"),
                                              answers=gold_answers(record.strings("golden_answers"))), None,
                                     tuple((t, x) for t, x in supporting)))
    return parsed


def parse_multihop_rag(file: QuestionFile, ground_truth: str | Path | None = None) -> list[ParsedQuestion]:
    """MultiHop-RAG: queries {id, question, question_type} and their answers from a ground-truth file.

    The official MultiHopRAG.json carries `query` and `answer` in each record and needs no second
    file; the split form (queries.json + ground_truth.json) is aligned by position, and where the
    ground truth is keyed by query id the keys must agree with the queries' ids.
    """
    inline = "answer" in file.records[0].data
    truths = _ground_truth(file, ground_truth) if ground_truth is not None or not inline else None
    parsed = []
    for record in file.records:
        truth = record if truths is None else truths[record.index]
        answer = truth.text("answer")
        question = Question(id=record.ident("id", required=False) or str(record.index),
                            text=record.text("question", "query"),
                            answers=gold_answers([answer], _null_aliases(answer)),
                            type=record.text("question_type", required=False))
        parsed.append(ParsedQuestion(question, None, _evidence(truth)))
    return parsed


# MultiHop-RAG's null queries answer "Insufficient information." Its qa_evaluate.py counts a reply as
# right when it shares a whitespace word with the gold (lower-cased); for the null answer the word that
# tells an abstention is "insufficient", so "Insufficient" is an alias (EM / Acc then agree with it).
MULTIHOP_RAG_NULL = "insufficient information"


def _null_aliases(answer: str) -> tuple[str, ...]:
    return ("Insufficient information", "Insufficient") if \
        answer.strip().rstrip(".").lower() == MULTIHOP_RAG_NULL else ()


def _evidence(truth: Record) -> tuple[tuple[str, str | None], ...]:
    """A MultiHop-RAG record's evidence facts as (article title, fact) supporting pairs."""
    facts = truth.value("evidence_list", kind=list, required=False) or []
    pairs = []
    for j, fact in enumerate(facts):
        if not (isinstance(fact, dict) and isinstance(fact.get("title"), str) and isinstance(fact.get("fact"), str)):
            raise truth.error(f"evidence_list[{j}] is not an object with string title and fact", field="evidence_list")
        pairs.append((fact["title"], fact["fact"]))
    return tuple(pairs)


def _ground_truth(file: QuestionFile, path: str | Path | None) -> list[Record]:
    """The records (answer, evidence_list) of a MultiHop-RAG ground-truth file, in query order."""
    if path is None:
        path = find_ground_truth(file.path)
    where = str(path)
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8").removeprefix(_UTF8_BOM))
    except FileNotFoundError:
        raise DataError("ground-truth file not found", path=where) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"malformed JSON: {exc.msg} (column {exc.colno})", path=where,
                        line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read ground-truth file: {exc}", path=where) from None
    if isinstance(document, dict):
        keys, entries = list(document), list(document.values())
    elif isinstance(document, list):
        keys, entries = None, document
    else:
        raise DataError("expected a JSON object or list of {answer, ...}", path=where)
    if len(entries) != len(file.records):
        raise DataError(f"{len(entries)} ground-truth entries for {len(file.records)} queries in {file.path}",
                        path=where)
    truths = []
    for i, (record, entry) in enumerate(zip(file.records, entries)):
        if not isinstance(entry, dict):
            raise DataError(f"record {i}: expected a JSON object, found {type(entry).__name__}", path=where)
        truth = Record(entry, where, i)
        qid = record.ident("id", required=False)
        if keys is not None and qid is not None and keys[i] != qid:
            raise truth.error(f"ground truth is keyed {keys[i]!r} where query {i} has id {qid!r}")
        truth.text("answer")  # checked here, so a missing answer names this file
        truths.append(truth)
    return truths


def find_ground_truth(queries: str | Path) -> Path:
    """The ground-truth file beside a MultiHop-RAG query file.

    `X_queries.json` looks for `X_ground_truth.json` first, then any query file for `ground_truth.json`.
    """
    queries = Path(queries)
    candidates = []
    if "queries" in queries.name:
        candidates.append(queries.with_name(queries.name.replace("queries", "ground_truth")))
    candidates.append(queries.with_name("ground_truth.json"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(c.name for c in candidates)
    raise DataError(f"no ground-truth file beside the queries (looked for {looked}); put MultiHop-RAG's answers "
                    f"file there under one of those names, or read the official MultiHopRAG.json, whose "
                    f"records carry their answers", path=str(queries))


FORMATS: dict[str, Callable[[QuestionFile], list[ParsedQuestion]]] = {
    "hotpotqa": parse_hotpotqa,
    "ircot": parse_ircot,
    "2wiki": parse_2wiki,
    "2wiki-hipporag": parse_2wiki_hipporag,
    "musique": parse_musique,
    "flashrag": parse_flashrag,
    "multihop-rag": parse_multihop_rag,
}


# The gold answers of a question without any, when they are scored as unanswerable: a prediction
# matching one of these (an abstention) is right, any other is wrong.
UNANSWERABLE = ("unanswerable", "unknown", "unsure", "no answer", "none", "i don't know")


def parse_questions(file: QuestionFile, format: str, *, ground_truth: str | Path | None = None,
                    allow_unanswerable: bool = False) -> list[ParsedQuestion]:
    """The questions of a file read in a named format, checked to have distinct ids, a question text
    and gold answers: a question without any is refused, naming its record, unless
    `allow_unanswerable`, which scores it against `UNANSWERABLE` (its `type` becomes "unanswerable"
    when it has none)."""
    check_format(file, format)
    parse = FORMATS[format]
    parsed = parse_multihop_rag(file, ground_truth) if parse is parse_multihop_rag else parse(file)
    if not any(item.question.answers for item in parsed):  # most likely read in the wrong format
        raise DataError(f"no gold answers in any of its {len(parsed)} questions (read as {format})",
                        path=file.path)
    first: dict[str, Record] = {}
    for i, (record, item) in enumerate(zip(file.records, parsed)):
        if not item.question.text.strip():
            raise record.error("the question text is empty")
        if not item.question.answers:
            if not allow_unanswerable:
                raise record.error(f"question {item.question.id!r} has no gold answer (read as {format}); "
                                   "remove it, or pass --allow-unanswerable to score it as unanswerable")
            question = replace(item.question, answers=UNANSWERABLE, type=item.question.type or "unanswerable")
            parsed[i] = item = replace(item, question=question)
        seen = first.setdefault(item.question.id, record)
        if seen is not record:
            at = f"line {seen.line}" if seen.line is not None else f"record {seen.index}"
            raise record.error(f"duplicate question id {item.question.id!r} (first at {at})", field="id")
    return parsed
