"""Corpus files in, Passages out: the passage pools every retriever indexes.

Five formats, told apart by their content, not their name:
  * JSON lines `{id, title, text}`;
  * JSON lines `{id, contents}`, contents being "title\\ntext" (FlashRAG's wiki-18 dump; the title
    may be wrapped in double quotes, which are dropped);
  * a JSON list of `{title, text}` (HippoRAG's corpora); ids come from `passage_id` unless a
    record carries its own `id` or `idx`;
  * a JSON object title -> list of sentences (HippoRAG's HotpotQA corpus); the sentences carry
    their own leading spaces, so they are joined with "" and the result stripped;
  * a JSON list of news articles `{title, author, source, published_at, category, url, body}`
    (MultiHop-RAG's corpus.json): each body is cut into overlapping chunks (`chunk_article`), each
    chunk a passage under the article's title.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from metarag.errors import DataError
from metarag.records import Passage

_UTF8_BOM = b"\xef\xbb\xbf"


def passage_id(title: str, text: str) -> str:
    """A stable id for a passage that has none: the first 12 hex digits of sha1("title\\ntext")."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """The passages of a corpus file in any of the four formats above, in file order.

    Raises DataError naming the file and the line (JSON lines) or record (JSON documents) and
    field at fault: missing or unreadable file, malformed JSON, missing or mistyped fields,
    duplicate ids, or a corpus with no passages.
    """
    path = Path(path)
    where = str(path)
    try:
        with path.open("rb") as f:
            passages = _read_any(f, where)
    except FileNotFoundError:
        raise DataError("corpus file not found", path=where) from None
    except IsADirectoryError:
        raise DataError("corpus path is a directory, not a file", path=where) from None
    except OSError as exc:
        raise DataError(f"cannot read corpus file: {exc.strerror or exc}", path=where) from None
    if not passages:
        raise DataError(f"corpus {where} has no passages")
    return passages


def corpus_fingerprint(passages: Iterable[Passage]) -> str:
    """sha256 (hex) over every passage's id, title and text, in order: equal iff the corpora are."""
    digest = hashlib.sha256()
    for p in passages:
        # Length prefixes make the encoding unambiguous whatever characters the fields hold.
        digest.update(f"{len(p.id)}:{p.id}{len(p.title)}:{p.title}{len(p.text)}:{p.text}".encode())
    return digest.hexdigest()


def ids_fingerprint(passages: Iterable[Passage]) -> str:
    """sha256 (hex) over the passage ids in order: what a saved index checks its rows against."""
    digest = hashlib.sha256()
    for p in passages:
        digest.update(f"{len(p.id)}:{p.id}".encode())
    return digest.hexdigest()


def write_corpus_jsonl(passages: Iterable[Passage], path: str | os.PathLike[str]) -> None:
    """Write passages as JSON lines `{id, title, text}`, the format `load_corpus` reads first.

    Written to a temporary file and renamed into place, so a reader never sees half a corpus.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for p in passages:
                f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False))
                f.write("\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------- chunking
# MultiHop-RAG (Tang & Yang, 2024) chunks its news articles with LlamaIndex's SentenceSplitter at
# 256 tokens (simple_retrieval.py, --chunk_size 256, llama-index 0.9.40), leaving the overlap at the
# splitter's default; EvoCtx (Table 10), whose MultiHop-RAG runs the toolkit reproduces, states the
# same splitter with 256-token chunks and a 32-token overlap, so 32 here.
CHUNK_TOKENS = 256
CHUNK_OVERLAP_TOKENS = 32
_TOKEN = re.compile(r"\w+|[^\w\s]")
# Not `parsing.sentence_spans`: this split also drops the closing quotes or brackets after a sentence's
# end ('Radio "Moving Pictures." It' -> 'Radio "Moving Pictures.'), and the corpora built so far have
# their chunks cut so; the shared splitter would change the chunks, so their hashes, of a rebuilt corpus.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|\n\s*\n+")


def count_tokens(text: str) -> int:
    """Words and punctuation marks: a tokenizer-free stand-in for the splitter's tiktoken count
    (close to it for English news text, a little under for rare words)."""
    return len(_TOKEN.findall(text))


def chunk_article(body: str, chunk_tokens: int = CHUNK_TOKENS,
                  overlap_tokens: int = CHUNK_OVERLAP_TOKENS) -> list[str]:
    """A body cut the SentenceSplitter way: whole sentences packed into chunks of at most
    `chunk_tokens`, each chunk after the first starting with the previous chunk's last sentences
    that fit in `overlap_tokens`; a sentence longer than a chunk is cut at word boundaries."""
    if not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError(f"the overlap ({overlap_tokens}) must be at least 0 and under the chunk size ({chunk_tokens})")
    pieces: list[tuple[str, int]] = []
    for sentence in (s.strip() for s in _SENTENCE_END.split(body)):
        if not sentence:
            continue
        size = count_tokens(sentence)
        if size <= chunk_tokens:
            pieces.append((sentence, size))
            continue
        words: list[str] = []
        for word in sentence.split():
            if words and count_tokens(" ".join([*words, word])) > chunk_tokens:
                pieces.append((" ".join(words), count_tokens(" ".join(words))))
                words = []
            words.append(word)
        if words:
            pieces.append((" ".join(words), count_tokens(" ".join(words))))
    chunks: list[str] = []
    current: list[tuple[str, int]] = []
    for piece in pieces:
        if current and sum(n for _, n in current) + piece[1] > chunk_tokens:
            chunks.append(" ".join(t for t, _ in current))
            carried: list[tuple[str, int]] = []
            for kept in reversed(current):
                if sum(n for _, n in carried) + kept[1] + piece[1] > min(overlap_tokens + piece[1], chunk_tokens):
                    break
                carried.insert(0, kept)
            current = carried
        current.append(piece)
    if current:
        chunks.append(" ".join(t for t, _ in current))
    return chunks


# ------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class _Where:
    """Where a record sits, so every error can point at it."""

    path: str
    line: int | None = None  # JSON lines: 1-based line number
    record: int | None = None  # JSON documents: 0-based position of the record

    def error(self, message: str, field: str | None = None) -> DataError:
        if self.record is not None:
            message = f"record {self.record}: {message}"
        return DataError(message, path=self.path, line=self.line, field=field)


def _read_any(f: BinaryIO, where: str) -> list[Passage]:
    head = f.read(1 << 16).removeprefix(_UTF8_BOM).lstrip()
    f.seek(0)
    if not head:
        return []
    if head[:1] == b"[":
        return _from_records(_load_document(f, where), where)
    if head[:1] != b"{":
        raise DataError("not a corpus file: expected JSON lines or one JSON list or object",
                        path=where, line=1)
    # "{" opens either JSON lines or one JSON object (title -> sentences). A first line that is not
    # a whole JSON value means a pretty-printed document; a whole one whose values are all lists
    # is a one-line title -> sentences object; anything else is JSON lines.
    try:
        first = json.loads(f.readline().removeprefix(_UTF8_BOM))
    except ValueError:
        first = None
    f.seek(0)
    if first is None:
        document = _load_document(f, where)
        if not isinstance(document, dict):
            raise DataError("expected a JSON object title -> sentences", path=where)
        return _from_sentences(document, where)
    if isinstance(first, dict) and all(isinstance(v, list) for v in first.values()):
        return _from_sentences(_load_document(f, where), where)
    return _from_lines(f, where)


def _load_document(f: BinaryIO, where: str) -> Any:
    raw = f.read().removeprefix(_UTF8_BOM)
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"malformed JSON: {exc.msg} (column {exc.colno})", path=where,
                        line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path=where) from None


def _from_lines(f: BinaryIO, where: str) -> list[Passage]:
    seen = _Ids()
    passages = []
    for lineno, raw in enumerate(f, 1):
        if not raw.strip():  # a blank line (often the last) is not a record
            continue
        loc = _Where(where, line=lineno)
        try:
            record = json.loads(raw.removeprefix(_UTF8_BOM) if lineno == 1 else raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both
            raise loc.error(f"malformed JSON line: {exc}") from None
        if not isinstance(record, dict):
            raise loc.error(f"expected a JSON object, found {type(record).__name__}")
        pid = _id_field(record, "id", loc)
        if pid is None:
            raise loc.error("missing id", field="id")
        if "contents" in record:
            title, text = _split_contents(_str_field(record, "contents", loc))
        elif "text" in record:
            title, text = _str_field(record, "title", loc, default=""), _str_field(record, "text", loc)
        else:
            raise loc.error("missing passage text ('text', or 'contents' as \"title\\ntext\")", field="text")
        passages.append(seen.add(Passage(pid, title, text), loc))
    return passages


def _from_records(records: Any, where: str) -> list[Passage]:
    if not isinstance(records, list):
        raise DataError("expected a JSON list of {title, text} records", path=where)
    seen = _Ids()
    passages = []
    articles = bool(records) and isinstance(records[0], dict) and "body" in records[0] and "text" not in records[0]
    for i, record in enumerate(records):
        loc = _Where(where, record=i)
        if not isinstance(record, dict):
            raise loc.error(f"expected a JSON object, found {type(record).__name__}")
        if articles:
            if "body" not in record:
                raise loc.error("missing article body (record 0 reads as a MultiHop-RAG article)", field="body")
            title, body = _str_field(record, "title", loc), _str_field(record, "body", loc)
            article = passage_id(title, body)
            for j, chunk in enumerate(chunk_article(body)):
                passages.append(seen.add(Passage(f"{article}-{j}", title, chunk), loc))
            continue
        if "text" not in record:
            raise loc.error("missing passage text", field="text")
        title, text = _str_field(record, "title", loc, default=""), _str_field(record, "text", loc)
        pid = _id_field(record, "id", loc) or _id_field(record, "idx", loc) or passage_id(title, text)
        passages.append(seen.add(Passage(pid, title, text), loc))
    return passages


def _from_sentences(document: dict[str, Any], where: str) -> list[Passage]:
    seen = _Ids()
    passages = []
    for i, (title, sentences) in enumerate(document.items()):
        loc = _Where(where, record=i)
        if isinstance(sentences, str):
            sentences = [sentences]
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise loc.error("expected a list of sentence strings", field=title)
        text = "".join(sentences).strip()
        passages.append(seen.add(Passage(passage_id(title, text), title, text), loc))
    return passages


class _Ids:
    """The ids seen so far and where, so a duplicate's error can point at both places."""

    def __init__(self) -> None:
        self._first: dict[str, _Where] = {}

    def add(self, passage: Passage, loc: _Where) -> Passage:
        first = self._first.setdefault(passage.id, loc)
        if first is not loc:
            at = f"line {first.line}" if first.line is not None else f"record {first.record}"
            raise loc.error(f"duplicate id {passage.id!r} (first at {at})", field="id")
        return passage


def _str_field(record: dict[str, Any], name: str, loc: _Where, default: str | None = None) -> str:
    value = record.get(name, default)
    if value is None:
        raise loc.error("missing field", field=name)
    if not isinstance(value, str):
        raise loc.error(f"expected a string, found {type(value).__name__}", field=name)
    return value


def _id_field(record: dict[str, Any], name: str, loc: _Where) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    # Integer ids are common (idx); bool is an int subclass but never an id.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise loc.error(f"expected a string or integer id, found {type(value).__name__}", field=name)
    if value == "":
        raise loc.error("empty id", field=name)
    return str(value)


def _split_contents(contents: str) -> tuple[str, str]:
    title, sep, text = contents.partition("\n")
    if not sep:  # no title line: the whole of contents is the text
        return "", contents
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text

