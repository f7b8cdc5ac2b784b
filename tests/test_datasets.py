"""Dataset loaders against the shared benchmark files, counted independently here, and bad input."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from metarag.data.corpus import passage_id
from metarag.data.datasets import (
    DEMO,
    FORMATS,
    PRESETS,
    Dataset,
    find_data_dir,
    load_dataset,
    resolve_preset,
    sample,
)
from metarag.errors import ConfigError, DataError

SHARED_DATA = Path(os.environ.get("METARAG_DATA_DIR")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture
def data() -> Path:
    """The shared benchmark data folder; tests that need it skip where it is absent."""
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pool_by_id(dataset: Dataset) -> dict:
    assert dataset.passages is not None
    return {p.id: p for p in dataset.passages}


def distinct(items) -> list:
    return list(dict.fromkeys(items))


# ------------------------------------------------------------------------------ one per format
def test_ircot_hotpotqa_dev500(data):
    records = read_jsonl(data / "hotpotqa/dev500_ircot.jsonl")
    ds = load_dataset(data / "hotpotqa/dev500_ircot.jsonl")
    assert ds.format == "ircot" and len(ds.questions) == len(records) == 500
    pool = pool_by_id(ds)
    assert len(pool) == len(ds.passages) == len({(c["title"], c["paragraph_text"])
                                                 for r in records for c in r["contexts"]}) == 4858
    for record, question, context in zip(records, ds.questions, ds.contexts):
        assert question.id == record["question_id"] and question.text == record["question_text"]
        assert question.answers == tuple(distinct(s for a in record["answers_objects"] for s in a["spans"]))
        gold = distinct((c["title"], c["paragraph_text"]) for c in record["contexts"] if c["is_supporting"])
        assert len(question.supporting_ids) == len(gold)
        assert {(pool[i].title, pool[i].text) for i in question.supporting_ids} == set(gold)
        assert set(question.supporting_ids) <= set(context)
        assert len(context) == len(record["contexts"])
    assert sum(len(q.supporting_ids) for q in ds.questions) == 1000
    assert ds.unmapped_support == 0


def test_hotpotqa_official_own_pool(data):
    records = read_json(data / "hotpotqa/train100_official.json")
    ds = load_dataset(data / "hotpotqa/train100_official.json")
    assert ds.format == "hotpotqa" and ds.corpus is None and len(ds.questions) == 100
    pool = pool_by_id(ds)
    assert len(pool) == len({title for r in records for title, _ in r["context"]}) == 994
    for record, question, context in zip(records, ds.questions, ds.contexts):
        assert question.id == record["_id"] and question.type == record["type"]
        assert question.answers == (record["answer"],)
        assert question.hops is None
        titles = {title for title, _ in record["supporting_facts"]}
        assert {pool[i].title for i in question.supporting_ids} == titles
        assert len(question.supporting_ids) == len(titles)
        assert set(question.supporting_ids) <= set(context)
        sentences = dict((title, s) for title, s in record["context"])
        for i in question.supporting_ids:  # leading spaces of the sentences kept, the ends stripped
            assert pool[i].text == "".join(sentences[pool[i].title]).strip()
            assert i == passage_id(pool[i].title, pool[i].text)


def test_hotpotqa_with_hipporag_corpus(data):
    own = load_dataset(data / "hotpotqa/train100_official.json")
    ds = resolve_preset("hotpotqa-train100", data)
    corpus = read_json(data / "hotpotqa/train100_corpus_hipporag.json")
    assert ds.name == "hotpotqa-train100" and ds.contexts is None
    assert len(ds.passages) == len(corpus) == 994 and ds.unmapped_support == 0
    pool = pool_by_id(ds)
    records = read_json(data / "hotpotqa/train100_official.json")
    for record, question, mine in zip(records, ds.questions, own.questions):
        assert {pool[i].title for i in question.supporting_ids} == {t for t, _ in record["supporting_facts"]}
        assert question.supporting_ids == mine.supporting_ids  # the corpus holds the same paragraphs


def test_2wiki_official(data):
    records = read_jsonl(data / "2wikimultihopqa/dev38_official.jsonl")
    ds = load_dataset(data / "2wikimultihopqa/dev38_official.jsonl")
    assert ds.format == "2wiki" and len(ds.questions) == 38
    pool = pool_by_id(ds)
    assert len(pool) == len({(t, " ".join(s)) for r in records for t, s in r["context"]})
    for record, question in zip(records, ds.questions):
        assert question.id == record["_id"] and question.type == record["type"]
        assert question.answers == (record["answer"],)
        titles = {title for title, _ in record["supporting_facts"]}
        assert {pool[i].title for i in question.supporting_ids} == titles
        texts = {(t, " ".join(s)) for t, s in record["context"] if t in titles}
        assert {(pool[i].title, pool[i].text) for i in question.supporting_ids} == texts
    assert ds.unmapped_support == 0


def test_2wiki_hipporag_questions_and_corpus(data):
    records = read_json(data / "2wikimultihopqa/dev1000_hipporag_questions.json")
    bare = load_dataset(data / "2wikimultihopqa/dev1000_hipporag_questions.json")
    assert bare.format == "2wiki-hipporag" and bare.passages is None and bare.contexts is None
    ds = resolve_preset("2wiki-dev1000", data)
    assert len(ds.questions) == len(records) == 1000
    assert len(ds.passages) == len(read_json(data / "2wikimultihopqa/dev1000_hipporag_corpus.json")) == 6119
    for record, question in zip(records, ds.questions):
        assert (question.id, question.answers, question.type) == (
            record["id"], (record["answer"],), record["question_type"])
        assert question.supporting_ids == ()  # the file names evidence triples, not paragraphs
    assert ds.unmapped_support == 0


def test_musique_official(data):
    records = read_json(data / "musique/train100_official.json")
    ds = resolve_preset("musique-train100", data)
    assert ds.format == "musique" and len(ds.questions) == 100
    pool = pool_by_id(ds)
    paragraphs = {(p["title"], p["paragraph_text"]) for r in records for p in r["paragraphs"]}
    assert len(pool) == len(paragraphs) == 1890
    for record, question in zip(records, ds.questions):
        assert question.answers == tuple(distinct([record["answer"], *record["answer_aliases"]]))
        assert question.hops == len(record["question_decomposition"])
        assert question.type == record["id"].split("__")[0]
        assert question.type.startswith(f"{question.hops}hop")
        gold = {(p["title"], p["paragraph_text"]) for p in record["paragraphs"] if p["is_supporting"]}
        assert {(pool[i].title, pool[i].text) for i in question.supporting_ids} == gold
    assert sum(len(q.supporting_ids) for q in ds.questions) == sum(
        p["is_supporting"] for r in records for p in r["paragraphs"]) == 237


def test_musique_support_maps_into_hipporag_corpus(data):
    own = load_dataset(data / "musique/train100_official.json")
    ds = load_dataset(data / "musique/train100_official.json",
                      corpus=data / "musique/train100_corpus_hipporag.json")
    assert len(ds.passages) == 1890 and ds.unmapped_support == 0
    assert [q.supporting_ids for q in ds.questions] == [q.supporting_ids for q in own.questions]


@pytest.mark.parametrize("relative, count", [
    ("bamboogle/test125.jsonl", 125), ("nq/test1000.jsonl", 1000),
    ("triviaqa/test1000.jsonl", 1000), ("popqa/test1000.jsonl", 1000)])
def test_flashrag(data, relative, count):
    records = read_jsonl(data / relative)
    ds = load_dataset(data / relative)
    assert ds.format == "flashrag" and ds.passages is None and len(ds.questions) == len(records) == count
    for record, question in zip(records, ds.questions):
        assert (question.id, question.text) == (record["id"], record["question"])
        assert question.answers == tuple(distinct(a.strip() for a in record["golden_answers"]))
        assert question.answers[0] == record["golden_answers"][0].strip()


def test_multihop_rag(data, tmp_path):
    queries = read_json(data / "multihop_rag/sample500_queries.json")["queries"]
    truth = list(read_json(data / "multihop_rag/sample500_ground_truth.json").values())
    ds = resolve_preset("multihop-rag-500", data)
    assert ds.format == "multihop-rag" and len(ds.questions) == 500 and ds.passages is None
    for query, answer, question in zip(queries, truth, ds.questions):
        assert (question.id, question.text) == (query["id"], query["question"])
        assert question.type == query["question_type"]
        assert question.answers[0] == answer["answer"]
    nulls = [q for q in ds.questions if q.type == "null_query"]
    # the null answer's aliases follow MultiHop-RAG's scoring (tests/test_multihop_rag.py)
    assert len(nulls) == 71 and {q.answers for q in nulls} == {
        ("Insufficient information.", "Insufficient information", "Insufficient")}
    assert all(len(q.answers) == 1 for q in ds.questions if q.type != "null_query")

    # The ground truth can be named; one whose keys disagree with the query ids is refused.
    shuffled = {str(i): entry for i, entry in reversed(list(enumerate(truth)))}
    bad = tmp_path / "truth.json"
    bad.write_text(json.dumps(shuffled))
    with pytest.raises(DataError, match="keyed '499' where query 0 has id '0'"):
        load_dataset(data / "multihop_rag/sample500_queries.json", ground_truth=bad)
    short = tmp_path / "short.json"
    short.write_text(json.dumps(truth[:10]))
    with pytest.raises(DataError, match="10 ground-truth entries for 500 queries"):
        load_dataset(data / "multihop_rag/sample500_queries.json", ground_truth=short)


def test_multihop_rag_needs_its_ground_truth(tmp_path):
    queries = tmp_path / "queries.json"
    query = {"id": "0", "question": "q?", "question_type": "inference_query"}
    queries.write_text(json.dumps({"queries": [query]}))
    with pytest.raises(DataError, match="no ground-truth file.*ground_truth.json"):
        load_dataset(queries)
    (tmp_path / "ground_truth.json").write_text(json.dumps({"0": {"answer": "yes", "evidence_list": []}}))
    assert load_dataset(queries).questions[0].answers == ("yes",)


@pytest.mark.parametrize("relative, expected", [
    ("hotpotqa/dev500_ircot.jsonl", "ircot"), ("hotpotqa/train100_official.json", "hotpotqa"),
    ("2wikimultihopqa/dev1000_hipporag_questions.json", "2wiki-hipporag"),
    ("2wikimultihopqa/dev38_official.jsonl", "2wiki"), ("musique/train100_official.json", "musique"),
    ("bamboogle/test125.jsonl", "flashrag"), ("nq/test1000.jsonl", "flashrag"),
    ("triviaqa/test1000.jsonl", "flashrag"), ("popqa/test1000.jsonl", "flashrag"),
    ("multihop_rag/sample500_queries.json", "multihop-rag")])
def test_format_detection(data, relative, expected):
    assert load_dataset(data / relative).format == expected


def test_undetectable_file_names_its_keys(data):
    with pytest.raises(DataError, match=r"dev7405_qa_only.json: record 0: cannot tell .*\(answer, question\)"):
        load_dataset(data / "hotpotqa/dev7405_qa_only.json")


def test_sha256_matches_readme(data):
    """The README lists each file's sha256 prefix; a dataset records its question file's full digest."""
    for name in ("hotpotqa-dev500", "musique-train100", "nq-1000"):
        ds = resolve_preset(name, data)
        assert ds.sha256 == hashlib.sha256(Path(ds.path).read_bytes()).hexdigest()
        row = next(line for line in (data / "README.md").read_text().splitlines()
                   if line.startswith(f"| {PRESETS[name].path} |"))
        assert ds.sha256.startswith(row.rstrip(" |").rsplit("|", 1)[1].strip())


def test_every_preset_resolves(data):
    for name, preset in PRESETS.items():
        ds = resolve_preset(name, data)
        assert ds.name == name and ds.format == preset.format and ds.questions
        assert all(q.answers for q in ds.questions)
        if ds.passages is not None:
            pool = pool_by_id(ds)
            assert all(i in pool for q in ds.questions for i in q.supporting_ids)


def test_a_corpus_given_with_a_preset_replaces_or_supplies_its_paragraphs(data):
    wiki = data / "wiki_sample/wiki18_sample1000.jsonl"
    bamboogle = resolve_preset("bamboogle", data, corpus=wiki)
    assert bamboogle.name == "bamboogle" and bamboogle.passages is not None and len(bamboogle.passages) == 1000
    assert resolve_preset("bamboogle", data).passages is None  # without it: no paragraphs of its own
    own = resolve_preset("hotpotqa-train100", data)
    swapped = resolve_preset("hotpotqa-train100", data, corpus=wiki)
    assert len(swapped.passages) == 1000 != len(own.passages)
    with pytest.raises(ConfigError, match="builds its own passages"):
        resolve_preset("multihop-rag-facts", data, corpus=wiki)
    with pytest.raises(ConfigError, match="demo dataset"):
        resolve_preset("demo", corpus=wiki)


# ------------------------------------------------------------------------------------ sampling
def test_sample_is_seeded_ordered_and_shrinks_the_pool(data):
    ds = load_dataset(data / "hotpotqa/dev500_ircot.jsonl")
    a, b, c = sample(ds, 20, seed=7), sample(ds, 20, seed=7), sample(ds, 20, seed=8)
    assert a == b and a.questions != c.questions
    position = {q.id: i for i, q in enumerate(ds.questions)}
    order = [position[q.id] for q in a.questions]
    assert order == sorted(order) and len(set(order)) == 20
    assert [ds.contexts[i] for i in order] == list(a.contexts)
    expected = distinct(pid for context in a.contexts for pid in context)
    assert [p.id for p in a.passages] == expected and len(expected) < len(ds.passages)
    pool = pool_by_id(a)
    assert all(i in pool for q in a.questions for i in q.supporting_ids)


def test_sample_keeps_a_corpus_pool(data):
    ds = resolve_preset("hotpotqa-train100", data)
    picked = sample(ds, 5, seed=0)
    assert picked.passages == ds.passages and len(picked.questions) == 5


def test_sample_limit_too_large(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "question": "q", "golden_answers": ["a"]}) + "\n"
                            for i in range(3)))
    ds = load_dataset(path)
    with pytest.raises(DataError, match="cannot sample 4 questions: qa has only 3"):
        sample(ds, 4, seed=0)
    assert sample(ds, 3, seed=1).questions == ds.questions


# --------------------------------------------------------------------------------- bad input
def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_json_line_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", '{"id": "1", "question": "q", "golden_answers": ["a"]}',
                       '{"id": "2", "question": "q", "golden_answers": ["a"]', "")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: malformed JSON line") as caught:
        load_dataset(path)
    assert caught.value.line == 2


def test_missing_field_names_line_and_field(tmp_path):
    path = write_lines(tmp_path / "missing.jsonl", '{"id": "1", "question": "q", "golden_answers": ["a"]}',
                       '{"id": "2", "golden_answers": ["a"]}')
    with pytest.raises(DataError, match=r"missing\.jsonl:2: missing field \(field 'question'\)"):
        load_dataset(path, "flashrag")


def test_answers_not_a_list(tmp_path):
    path = write_lines(tmp_path / "answers.jsonl", '{"id": "1", "question": "q", "golden_answers": "a"}')
    expected = r"answers\.jsonl:1: expected list, found str \(field 'golden_answers'\)"
    with pytest.raises(DataError, match=expected):
        load_dataset(path)


def test_json_array_error_names_record_and_field(tmp_path):
    good = {"_id": "a", "question": "q", "answer": "x", "context": [["T", ["s."]]],
            "supporting_facts": [["T", 0]]}
    bad = {**good, "_id": "b", "context": [["T", "not a list"]]}
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([good, bad]))
    expected = r"hotpot\.json: record 1: context\[0\] is not \[title, \[sentences\]\]"
    with pytest.raises(DataError, match=expected):
        load_dataset(path)
    path.write_text(json.dumps([good, {**good, "_id": "a"}]))
    with pytest.raises(DataError, match="record 1: duplicate question id 'a' \\(first at record 0\\)"):
        load_dataset(path)


def test_malformed_json_document_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"id": "1",\n   "question": }\n]')
    with pytest.raises(DataError, match=r"broken\.json:3: malformed JSON"):
        load_dataset(path)


def test_no_gold_answers(tmp_path):
    path = write_lines(tmp_path / "empty.jsonl", '{"id": "1", "question": "q", "golden_answers": []}',
                       '{"id": "2", "question": "q", "golden_answers": ["  "]}')
    with pytest.raises(DataError, match="no gold answers"):
        load_dataset(path)


def test_unknown_format_lists_valid_names(tmp_path):
    expected = r"unknown dataset format 'hotpot' \(did you mean hotpotqa"
    with pytest.raises(ConfigError, match=expected) as caught:
        load_dataset(tmp_path / "anything.json", "hotpot")
    assert all(name in str(caught.value) for name in FORMATS)


def test_supporting_title_missing_from_context_is_counted(tmp_path):
    record = {"_id": "a", "question": "q", "answer": "x", "type": "bridge",
              "context": [["T", ["One.", " Two."]], ["U", [" Three."]]],
              "supporting_facts": [["T", 1], ["T", 0], ["Nowhere", 0]]}
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([record]))
    ds = load_dataset(path)
    assert ds.questions[0].supporting_ids == (passage_id("T", "One. Two."),)
    assert [p.text for p in ds.passages] == ["One. Two.", "Three."]
    assert ds.unmapped_support == 1


# ----------------------------------------------------------------------------------- presets
def test_unknown_preset_suggests_close_names():
    expected = r"unknown dataset preset 'hotpotqa-dev50' \(did you mean hotpotqa-dev500"
    with pytest.raises(ConfigError, match=expected):
        resolve_preset("hotpotqa-dev50")


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("METARAG_DATA_DIR", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="METARAG_DATA_DIR .* is not a folder"):
        find_data_dir()
    monkeypatch.setenv("METARAG_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path
    with pytest.raises(ConfigError, match="nq/test1000.jsonl is not in the data folder.*METARAG_DATA_DIR"):
        resolve_preset("nq-1000")


def test_data_dir_found_beside_the_checkout(data, monkeypatch):
    monkeypatch.delenv("METARAG_DATA_DIR", raising=False)
    assert (find_data_dir() / "README.md").is_file()


def test_demo_preset():
    try:
        ds = resolve_preset(DEMO)
    except ConfigError as exc:
        pytest.skip(str(exc))
    assert ds.name == DEMO and ds.format == "hotpotqa" and len(ds.questions) == 100
    assert ds.unmapped_support == 0
    pool = pool_by_id(ds)
    assert all(len(q.supporting_ids) >= 2 and all(i in pool for i in q.supporting_ids) for q in ds.questions)


def test_a_runs_saved_settings_name_its_whole_dataset(data):
    from metarag.evaluate.harness import run_dataset

    # as the harness saves a preset: with the preset's own format, and the run's sample
    saved = {"dataset": {"preset": "musique-train100", "file": None, "format": "musique", "corpus": None,
                         "limit": 30, "seed": 0}}
    ds = run_dataset(saved)
    assert len(ds.questions) == 100 and {q.type for q in ds.questions} >= {"2hop", "3hop1"}
    with pytest.raises(DataError, match="settings.json: the run's settings name no dataset"):
        run_dataset({"method": "x"}, "settings.json")
