"""MultiHop-RAG: the offline evidence-fact pool, the news corpus chunked as its authors did, and its
null queries scored as its own evaluation scores them."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from metarag.data.corpus import (
    CHUNK_OVERLAP_TOKENS,
    CHUNK_TOKENS,
    chunk_article,
    count_tokens,
    load_corpus,
    passage_id,
)
from metarag.data.datasets import EVIDENCE_FACTS, PRESETS, load_dataset, resolve_preset, sample
from metarag.errors import ConfigError, DataError
from metarag.metrics import score_answer, support_recall

SHARED_DATA = Path(os.environ.get("METARAG_DATA_DIR")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture
def data() -> Path:
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


def test_evidence_fact_pool_holds_every_fact_once_and_maps_support_to_own_facts(data):
    truth = json.loads((data / "multihop_rag/sample500_ground_truth.json").read_text())
    facts = [(e["title"], e["fact"]) for entry in truth.values() for e in entry["evidence_list"]]
    assert len(facts) == 1153
    ds = resolve_preset("multihop-rag-facts", data)
    assert PRESETS["multihop-rag-facts"].pool == EVIDENCE_FACTS
    assert len(ds.questions) == 500 and ds.unmapped_support == 0 and ds.contexts is None
    # every fact once (438 distinct of the 1,153 citations), under its article's title
    assert sorted((p.title, p.text) for p in ds.passages) == sorted(set(facts))
    assert len(ds.passages) == 438
    by_id = {p.id: p for p in ds.passages}
    for entry, question in zip(truth.values(), ds.questions):
        own = {(e["title"], e["fact"]) for e in entry["evidence_list"]}
        assert {(by_id[i].title, by_id[i].text) for i in question.supporting_ids} == own
        assert (question.type == "null_query") == (not question.supporting_ids)
    # a sample still retrieves over the whole pool: every query's facts are everyone's distractors
    assert sample(ds, 50, 0).passages == ds.passages


def test_null_queries_are_right_only_when_the_answer_says_insufficient(data):
    ds = resolve_preset("multihop-rag-facts", data)
    null = next(q for q in ds.questions if q.type == "null_query")
    assert score_answer("Insufficient information", null.answers).em == 1.0
    assert score_answer("Insufficient Information.", null.answers).em == 1.0
    # MultiHop-RAG's qa_evaluate.py: right when a word is shared with the gold; "insufficient" is that word
    assert score_answer("The information is insufficient to answer.", null.answers).acc == 1.0
    assert (score_answer("NBC", null.answers).em, score_answer("NBC", null.answers).acc) == (0.0, 0.0)
    assert score_answer("unknown", null.answers).acc == 0.0
    answered = next(q for q in ds.questions if q.type != "null_query")
    assert "Insufficient" not in answered.answers
    assert score_answer("Insufficient information", answered.answers).acc == 0.0


def _article(title: str, sentences: int, word: str) -> dict:
    body = " ".join(f"{word} sentence {i} reports one more detail of the story today." for i in range(sentences))
    return {"title": title, "author": "A. Writer", "source": "The Daily", "published_at": "2023-10-01T00:00:00+00:00",
            "category": "news", "url": f"https://example.org/{word}", "body": body}


def test_news_corpus_is_chunked_at_256_tokens_with_overlap_and_support_found_in_its_chunk(tmp_path):
    articles = [_article("Long story", 60, "alpha"), _article("Short story", 3, "beta")]
    (tmp_path / "corpus.json").write_text(json.dumps(articles))
    passages = load_corpus(tmp_path / "corpus.json")
    long = [p for p in passages if p.title == "Long story"]
    assert len(long) > 2 and len([p for p in passages if p.title == "Short story"]) == 1
    assert all(count_tokens(p.text) <= CHUNK_TOKENS for p in passages)
    assert max(count_tokens(p.text) for p in long) > CHUNK_TOKENS - 20  # packed, not one sentence each
    for before, after in zip(long, long[1:]):  # each chunk starts with the previous one's last sentences
        overlap = next(s for s in after.text.split(". ") if s)  # its first sentence
        assert overlap in before.text and count_tokens(overlap) <= CHUNK_OVERLAP_TOKENS
    assert len({p.id for p in passages}) == len(passages)
    # every sentence of the body is in some chunk
    for i in range(60):
        assert any(f"alpha sentence {i} reports" in p.text for p in long)

    fact = "alpha sentence 41 reports one more detail of the story today."
    queries = {"queries": [{"id": "0", "question": "What did the story report?", "question_type": "inference_query"},
                           {"id": "1", "question": "What else?", "question_type": "null_query"}]}
    truth = {"0": {"answer": "detail", "evidence_list": [{"title": "Long story", "fact": fact},
                                                          {"title": "Short story", "fact": "beta sentence 1"}]},
             "1": {"answer": "Insufficient information.", "evidence_list": []}}
    (tmp_path / "queries.json").write_text(json.dumps(queries))
    (tmp_path / "ground_truth.json").write_text(json.dumps(truth))
    ds = load_dataset(tmp_path / "queries.json", corpus=tmp_path / "corpus.json")
    first, null = ds.questions
    by_id = {p.id: p for p in passages}
    assert ds.unmapped_support == 0 and len(first.supporting_ids) == 2
    holding = by_id[first.supporting_ids[0]]
    assert holding.title == "Long story" and fact in holding.text
    assert support_recall([holding.id], first.supporting_ids) == 0.5
    assert null.answers[0] == "Insufficient information." and null.supporting_ids == ()


def test_chunker_cuts_an_overlong_sentence_at_words_and_checks_its_sizes():
    long_sentence = " ".join(f"w{i}" for i in range(600))
    chunks = chunk_article(long_sentence, 100, 10)
    assert all(count_tokens(c) <= 100 for c in chunks)
    assert " ".join(chunks).split() == long_sentence.split()  # no overlap inside one sentence's pieces
    with pytest.raises(ValueError, match="overlap"):
        chunk_article("x.", 10, 10)


def test_bad_multihop_inputs_name_what_is_wrong(tmp_path, data):
    bad = [_article("A", 2, "a"), {"title": "B", "author": "x"}]
    (tmp_path / "c.json").write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"record 1: missing article body"):
        load_corpus(tmp_path / "c.json")
    with pytest.raises(ConfigError, match="give it no corpus"):
        load_dataset(data / "multihop_rag/sample500_queries.json", corpus=tmp_path / "c.json", pool=EVIDENCE_FACTS)
    with pytest.raises(ConfigError, match="unknown passage pool 'facts'"):
        load_dataset(data / "multihop_rag/sample500_queries.json", pool="facts")
    queries = {"queries": [{"id": "0", "question": "q?", "question_type": "inference_query"}]}
    (tmp_path / "queries.json").write_text(json.dumps(queries))
    (tmp_path / "ground_truth.json").write_text(json.dumps({"0": {"answer": "yes", "evidence_list": ["a fact"]}}))
    with pytest.raises(DataError, match=r"record 0: evidence_list\[0\] is not an object"):
        load_dataset(tmp_path / "queries.json")
    (tmp_path / "ground_truth.json").write_text(json.dumps({"0": {"answer": "yes", "evidence_list": []}}))
    with pytest.raises(DataError, match="no supporting facts"):
        load_dataset(tmp_path / "queries.json", pool=EVIDENCE_FACTS)


def test_fact_ids_are_the_passage_ids_of_title_and_fact(data):
    ds = resolve_preset("multihop-rag-facts", data)
    assert all(p.id == passage_id(p.title, p.text) for p in ds.passages)
    cited = Counter(i for q in ds.questions for i in q.supporting_ids)
    assert max(cited.values()) > 1  # facts shared by several queries are one passage
