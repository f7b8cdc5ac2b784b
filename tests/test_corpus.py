"""Corpus loading: the four formats, the shared benchmark corpora, and every error a user can cause."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from metarag.data.corpus import corpus_fingerprint, load_corpus, passage_id, write_corpus_jsonl
from metarag.errors import DataError
from metarag.records import Passage

# The shared benchmark data sits beside the repository: <repo>/../shared/data.
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, *records: object) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


# ------------------------------------------------------------------------------- shared corpora
@needs_data
@pytest.mark.parametrize("relpath, count", [
    ("wiki_sample/wiki18_sample1000.jsonl", 1000),
    ("hotpotqa/train100_corpus_hipporag.json", 994),
    ("2wikimultihopqa/dev1000_hipporag_corpus.json", 6119),
    ("musique/train100_corpus_hipporag.json", 1890),
])
def test_shared_corpora_load_with_their_counts(relpath, count):
    passages = load_corpus(DATA / relpath)
    assert len(passages) == count
    assert len({p.id for p in passages}) == count
    assert all(p.text for p in passages)


@needs_data
def test_flashrag_contents_split_into_unquoted_title_and_text():
    first = load_corpus(DATA / "wiki_sample/wiki18_sample1000.jsonl")[0]
    assert first.id == "0"
    assert first.title == "Evan Morris"
    assert first.text.startswith("Evan Morris Evan L. Morris (January 26, 1977")


@needs_data
def test_hotpotqa_sentences_join_with_their_own_spaces():
    first = load_corpus(DATA / "hotpotqa/train100_corpus_hipporag.json")[0]
    assert first.title == "Demon Dice"
    assert first.text.startswith("Demon Dice, originally published as Chaos Progenitus, is a collectible")
    # The second sentence brings its own leading space: exactly one space between sentences.
    assert "Tim Brown. In it, each player controls a demon" in first.text
    assert first.id == passage_id(first.title, first.text)


# ------------------------------------------------------------------------------------ formats
def test_passage_id_is_sha1_of_title_newline_text():
    assert passage_id("Paris", "Paris is the capital of France.") == "11651935d564"


def test_jsonl_title_text(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", {"id": "a", "title": "T", "text": "x"}, {"id": 7, "text": "no title"})
    assert load_corpus(path) == [Passage("a", "T", "x"), Passage("7", "", "no title")]


def test_jsonl_contents_with_quoted_title_and_blank_lines(tmp_path):
    lines = [json.dumps({"id": "1", "contents": '"Evan Morris"\nEvan Morris was'}), "",
             json.dumps({"id": "2", "contents": "Plain\ntext\nwith lines"}),
             json.dumps({"id": "3", "contents": "no title line"}), ""]
    path = write(tmp_path / "c.jsonl", "\n".join(lines))
    assert load_corpus(path) == [Passage("1", "Evan Morris", "Evan Morris was"),
                                 Passage("2", "Plain", "text\nwith lines"),
                                 Passage("3", "", "no title line")]


def test_hipporag_list_uses_given_ids_else_content_ids(tmp_path):
    records = [{"title": "A", "text": "a"}, {"idx": 5, "title": "B", "text": "b"},
               {"id": "x9", "title": "C", "text": "c"}]
    path = write(tmp_path / "c.json", json.dumps(records, indent=2))
    assert load_corpus(path) == [Passage(passage_id("A", "a"), "A", "a"), Passage("5", "B", "b"),
                                 Passage("x9", "C", "c")]


@pytest.mark.parametrize("indent", [None, 4])
def test_hipporag_title_to_sentences_object(tmp_path, indent):
    document = {"A": ["First.", " Second."], "B": [" Only. "]}
    path = write(tmp_path / "c.json", json.dumps(document, indent=indent))
    assert load_corpus(path) == [Passage(passage_id("A", "First. Second."), "A", "First. Second."),
                                 Passage(passage_id("B", "Only."), "B", "Only.")]


def test_write_then_load_round_trips(tmp_path):
    passages = [Passage("1", "Tïtle", "line one\nline two"), Passage("2", "", "no title")]
    write_corpus_jsonl(passages, tmp_path / "sub" / "out.jsonl")
    assert load_corpus(tmp_path / "sub" / "out.jsonl") == passages
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["out.jsonl"]


# ------------------------------------------------------------------------------------- errors
def test_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.jsonl", '{"id": "1", "text": "a"}\n{"id": "2", "text": "b"}\n{"id": "3\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: malformed JSON line") as err:
        load_corpus(path)
    assert err.value.line == 3 and err.value.path == str(path)


def test_malformed_json_document_names_its_line(tmp_path):
    path = write(tmp_path / "bad.json", '[\n {"title": "A", "text": "a"},\n {"title": "B" "text": "b"}\n]\n')
    with pytest.raises(DataError, match=r"bad\.json:3: malformed JSON"):
        load_corpus(path)


def test_missing_text_names_line_and_field(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", {"id": "1", "text": "a"}, {"id": "2", "title": "no text"})
    with pytest.raises(DataError, match=r"c\.jsonl:2: .*\(field 'text'\)") as err:
        load_corpus(path)
    assert err.value.field == "text"


def test_missing_id_in_jsonl(tmp_path):
    with pytest.raises(DataError, match=r":1: missing id \(field 'id'\)"):
        load_corpus(jsonl(tmp_path / "c.jsonl", {"title": "T", "text": "x"}))


def test_wrong_field_type_in_list_names_record(tmp_path):
    path = write(tmp_path / "c.json", json.dumps([{"title": "A", "text": "a"}, {"title": "B", "text": 3}]))
    with pytest.raises(DataError, match=r"c\.json: record 1: expected a string, found int \(field 'text'\)"):
        load_corpus(path)


def test_duplicate_id_names_both_places(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", {"id": "1", "text": "a"}, {"id": "2", "text": "b"},
                 {"id": "1", "text": "c"})
    with pytest.raises(DataError, match=r"c\.jsonl:3: duplicate id '1' \(first at line 1\)"):
        load_corpus(path)


def test_duplicate_passage_in_list_is_a_duplicate_id(tmp_path):
    path = write(tmp_path / "c.json", json.dumps([{"title": "A", "text": "a"}, {"title": "A", "text": "a"}]))
    with pytest.raises(DataError, match=r"record 1: duplicate id .*first at record 0"):
        load_corpus(path)


@pytest.mark.parametrize("content", ["", "\n  \n", "[]", "{}"])
def test_empty_corpus(tmp_path, content):
    path = write(tmp_path / "empty.json", content)
    with pytest.raises(DataError, match=re.escape(f"corpus {path} has no passages")):
        load_corpus(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: corpus file not found"):
        load_corpus(tmp_path / "nope.jsonl")


def test_not_a_corpus(tmp_path):
    with pytest.raises(DataError, match="not a corpus file"):
        load_corpus(write(tmp_path / "c.tsv", "id\ttext\n1\ta\n"))


# -------------------------------------------------------------------------------- fingerprint
def test_fingerprint_follows_every_field_and_the_order():
    base = [Passage("1", "A", "alpha"), Passage("2", "B", "beta")]
    fp = corpus_fingerprint(base)
    assert fp == corpus_fingerprint(list(base)) and len(fp) == 64
    assert fp != corpus_fingerprint([base[0], Passage("2", "B", "beta!")])
    assert fp != corpus_fingerprint([base[0], Passage("2", "b", "beta")])
    assert fp != corpus_fingerprint([base[0], Passage("3", "B", "beta")])
    assert fp != corpus_fingerprint(base[::-1])
    # Field boundaries count: moving a character from title to text is a different corpus.
    assert corpus_fingerprint([Passage("1", "ab", "c")]) != corpus_fingerprint([Passage("1", "a", "bc")])
