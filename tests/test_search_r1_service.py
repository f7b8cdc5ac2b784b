"""The retrieval service speaks Search-R1's schema: a client written to that schema (Search-R1's
`generation.py` and verl's search tool read `result[i][j]["document"]["contents"]` and `["score"]`
after posting `{queries, topk, return_scores: true}`; without scores they read the documents
themselves) gets what those clients expect, over real HTTP, and our own fields stay."""
from __future__ import annotations

import importlib.util
import json
import urllib.request

import pytest
from conftest import CITIES

from metarag.errors import DataError
from metarag.records import Hit, Passage
from metarag.retrieve.memory import MemoryRetriever
from metarag.retrieve.remote import RemoteRetriever
from metarag.retrieve.service import _hit_json, parse_request

needs_server = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="fastapi or uvicorn not installed")


def search_r1_client(url: str, queries: list[str], topk: int, return_scores: bool = True) -> list:
    """What a Search-R1-style trainer does: POST the batch, take `result`."""
    body = json.dumps({"queries": queries, "topk": topk, "return_scores": return_scores}).encode()
    request = urllib.request.Request(url + "/retrieve", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["result"]


def passages_to_string(retrieval_result: list[dict]) -> str:
    """Search-R1's rendering of one query's documents: the first line of `contents` is the title."""
    lines = []
    for idx, item in enumerate(retrieval_result, 1):
        content = item["document"]["contents"]
        title, _, text = content.partition("\n")
        lines.append(f"Doc {idx}(Title: {title}) {text}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def local():
    return MemoryRetriever(CITIES, "memory")


@pytest.fixture(scope="module")
def service(local):
    from metarag.retrieve.service import BackgroundService

    with BackgroundService.start(local) as running:
        yield running


@needs_server
def test_a_search_r1_client_reads_documents_and_scores(service, local):
    queries = ["capital of France", "fourth planet"]
    result = search_r1_client(service.url, queries, topk=3)
    assert len(result) == 2
    for query, items in zip(queries, result):
        expected = local.search(query, 3)
        assert [item["document"]["id"] for item in items] == [h.passage.id for h in expected]
        assert [item["score"] for item in items] == pytest.approx([h.score for h in expected])
        assert all(isinstance(item["document"]["contents"], str) for item in items)
    rendered = passages_to_string(result[0])
    assert rendered.splitlines()[0] == "Doc 1(Title: Paris) Paris is the capital and largest city of France."


@needs_server
def test_without_scores_the_documents_read_as_search_r1_answers_them(service, local):
    items = search_r1_client(service.url, ["Rhine Germany"], topk=2, return_scores=False)[0]
    expected = local.search("Rhine Germany", 2)
    assert [(item["id"], item["contents"]) for item in items] == \
        [(h.passage.id, f"{h.passage.title}\n{h.passage.text}") for h in expected]


@needs_server
def test_our_own_client_still_reads_the_service(service, local):
    remote = RemoteRetriever(service.url)
    got, expected = remote.search("Paris museum", 3), local.search("Paris museum", 3)
    assert [(h.passage, h.score) for h in got] == [(h.passage, h.score) for h in expected]


def test_a_hit_in_both_shapes():
    row = _hit_json(Hit(Passage("d7", "Mars", "Mars is red."), 2.5, "bm25"))
    assert row == {"id": "d7", "title": "Mars", "text": "Mars is red.", "score": 2.5, "contents": "Mars\nMars is red.",
                   "document": {"id": "d7", "contents": "Mars\nMars is red."}}


def test_return_scores_must_be_a_boolean():
    assert parse_request(b'{"queries": ["a"], "topk": 2, "return_scores": false}').topk == 2
    with pytest.raises(DataError, match='"return_scores" must be true or false'):
        parse_request(b'{"queries": ["a"], "return_scores": "yes"}')
