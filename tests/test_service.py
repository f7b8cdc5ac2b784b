"""The retrieval service and its client: batches over real HTTP on a free loopback port, 4xx for bad
requests (and still answering after them), the remote retriever equal to in-process, retries with
backoff then a BackendError naming the URL."""
from __future__ import annotations

import importlib.util
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Collection

import pytest
from conftest import CITIES
from servers import free_port

from metarag.errors import BackendError, DataError, MissingDependency
from metarag.records import Hit
from metarag.retrieve.fusion import FusionRetriever
from metarag.retrieve.memory import MemoryRetriever
from metarag.retrieve.remote import RemoteRetriever
from metarag.retrieve.service import parse_request

needs_server = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="fastapi or uvicorn not installed")
QUERIES = ["capital of France", "Paris museum", "Rhine Germany", "fourth planet", "nothing zzz"]


class Failing:
    """A retriever whose back-end is down: every search raises BackendError."""

    name = "failing"

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        raise BackendError("the index is gone")


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/retrieve", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def local():
    return MemoryRetriever(CITIES, "memory")


@pytest.fixture(scope="module")
def service(local):
    from metarag.retrieve.service import BackgroundService

    with BackgroundService.start(local) as running:
        yield running


# ------------------------------------------------------------------------------------ service
@needs_server
def test_health_names_the_retriever(service):
    from metarag.data.corpus import corpus_fingerprint

    assert service.url.startswith("http://127.0.0.1:") and service.port > 0
    with urllib.request.urlopen(service.url + "/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok", "retriever": "memory", "passages": 7,
                                               "corpus_fingerprint": corpus_fingerprint(CITIES), "limits": {
            "max_topk": 1000, "max_queries": 1024, "max_query_chars": 2000, "max_hits": 10000,
            "max_body_bytes": 1_000_000}}


@needs_server
def test_a_batch_is_answered_in_one_call(service, local):
    status, answer = post(service.url, json.dumps({"queries": QUERIES[:3], "topk": 2}).encode())
    assert status == 200 and answer["retriever"] == "memory"
    assert len(answer["result"]) == 3
    for query, rows in zip(QUERIES, answer["result"]):
        expected = local.search(query, 2)
        assert rows == [{"id": h.passage.id, "title": h.passage.title, "text": h.passage.text, "score": h.score,
                         "contents": h.passage.contents(),
                         "document": {"id": h.passage.id, "contents": h.passage.contents()}} for h in expected]
    assert [row["id"] for row in answer["result"][0]] == ["p1", "p2"]


@needs_server
def test_exclude_is_per_query(service):
    body = {"queries": ["capital of France", "capital of France"], "topk": 2, "exclude": [["p1"], []],
            "return_scores": True}  # Search-R1 clients send return_scores
    status, answer = post(service.url, json.dumps(body).encode())
    assert status == 200
    assert [[row["id"] for row in rows] for rows in answer["result"]] == [["p2", "p3"], ["p1", "p2"]]


@needs_server
@pytest.mark.parametrize("body, message", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"queries": ["a"], "topk": 0}', '"topk" must be an integer'),
    (b'{"queries": ["a"], "topk": -3}', '"topk" must be an integer'),
    (b'{"queries": ["a"], "topk": "5"}', '"topk" must be an integer'),
    (b'{"queries": "capital", "topk": 2}', '"queries" must be a list of strings'),
    (b'{"topk": 2}', '"queries" must be a list of strings'),
    (b'{"queries": ["a", "b"], "topk": 2, "exclude": [["p1"]]}', "one list of passage ids"),
    (b'{"queries": ["a"], "top_k": 2}', "unknown field(s) top_k"),
])
def test_bad_requests_get_400_and_the_server_keeps_answering(service, body, message):
    status, answer = post(service.url, body)
    assert status == 400 and message in answer["error"]
    status, answer = post(service.url, b'{"queries": ["Mars"], "topk": 1}')
    assert status == 200 and answer["result"][0][0]["id"] == "p7"


@needs_server
def test_a_failing_back_end_gets_500_with_its_message():
    from metarag.retrieve.service import BackgroundService

    with BackgroundService.start(Failing()) as running:
        status, answer = post(running.url, b'{"queries": ["a"], "topk": 1}')
        assert status == 500 and "the index is gone" in answer["error"]
        with urllib.request.urlopen(running.url + "/health", timeout=10) as response:
            assert response.status == 200
        # The client retries a 5xx, then says which URL failed and why.
        with pytest.raises(BackendError, match=rf"{running.url}/retrieve failed after 2 tries.*the index is gone"):
            RemoteRetriever(running.url, max_retries=1, backoff_s=0.01).search("a", 1)


def test_parse_request_reads_the_search_r1_shape():
    request = parse_request(b'{"queries": ["a", "b"], "topk": 4, "exclude": [["x", "y"], []]}')
    assert request.queries == ("a", "b") and request.topk == 4
    assert request.exclude == (frozenset({"x", "y"}), frozenset())
    assert parse_request(b'{"queries": []}').topk == 3  # Search-R1's default
    with pytest.raises(DataError, match="at most 2 queries"):
        parse_request(b'{"queries": ["a", "b", "c"]}', max_queries=2)
    with pytest.raises(DataError, match="from 1 to 10"):
        parse_request(b'{"queries": ["a"], "topk": 11}', max_topk=10)
    with pytest.raises(DataError, match='"topk"'):
        parse_request(b'{"queries": ["a"], "topk": true}')


def test_missing_fastapi_names_the_extra(monkeypatch):
    from metarag.retrieve.service import make_app

    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes `import fastapi` fail as if absent
    with pytest.raises(MissingDependency, match=r"metarag\[server\]"):
        make_app(MemoryRetriever(CITIES))


# ------------------------------------------------------------------------------------- client
@needs_server
def test_remote_returns_the_same_hits_as_in_process(service, local):
    remote = RemoteRetriever(service.url + "/retrieve")  # the endpoint's URL works as well as the base
    assert remote.url == service.url
    assert remote.search_many(QUERIES, 3) == [local.search(q, 3) for q in QUERIES]
    assert remote.search("capital of France", 2, exclude={"p1"}) == local.search("capital of France", 2, {"p1"})
    assert remote.search("Paris", 0) == [] and remote.search_many([], 3) == []
    assert remote.health()["passages"] == 7


@needs_server
def test_remote_hybrid_equals_in_process_hybrid():
    from metarag.retrieve.service import BackgroundService

    hybrid = FusionRetriever([MemoryRetriever(CITIES, "a"), MemoryRetriever(CITIES, "b", k1=2.0, b=1.0)])
    with BackgroundService.start(hybrid) as running:
        assert RemoteRetriever(running.url).search_many(QUERIES, 4) == hybrid.search_many(QUERIES, 4)


@needs_server
def test_remote_caches_within_a_run(service, monkeypatch):
    remote = RemoteRetriever(service.url)
    calls = []
    real_urlopen = urllib.request.urlopen

    def counting(*args, **kwargs):
        calls.append(args[0].full_url)
        return real_urlopen(*args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", counting)
    first = remote.search_many(["capital of France", "Mars"], 2)
    again = remote.search_many(["Mars", "capital of France", "Lyon"], 2)
    assert again[:2] == first[::-1] and len(calls) == 2  # only "Lyon" went out the second time
    assert remote.cache.hits == 2


@needs_server
def test_a_4xx_is_not_retried(service, monkeypatch):
    calls = []
    real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **kw: calls.append(1) or real_urlopen(*a, **kw))
    with pytest.raises(BackendError, match=r"refused the request: HTTP 422: .*topk") as caught:
        RemoteRetriever(service.url, max_retries=3, backoff_s=0.01).search("Paris", 5000)
    assert len(calls) == 1 and not caught.value.retryable


def test_remote_retriever_that_is_down_retries_with_backoff_then_names_the_url(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # bound, then released: nothing listens there
    sleeps: list[float] = []
    attempts = []
    real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(time, "sleep", sleeps.append)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **kw: attempts.append(1) or real_urlopen(*a, **kw))
    remote = RemoteRetriever(url, timeout_s=2, max_retries=3, backoff_s=0.05)
    with pytest.raises(BackendError, match=rf"retrieval service at {url}/retrieve failed after 4 tries") as caught:
        remote.search("Paris", 3)
    assert "refused" in str(caught.value).lower() and caught.value.retryable
    assert len(attempts) == 4 and sleeps == pytest.approx([0.05, 0.1, 0.2])  # doubling backoff


def test_remote_rejects_a_url_that_is_not_http():
    from metarag.errors import ConfigError

    with pytest.raises(ConfigError, match="http://"):
        RemoteRetriever("127.0.0.1:8000")


@needs_server
def test_serve_names_a_port_it_cannot_listen_on():
    from metarag.retrieve.service import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BackendError, match=rf"cannot listen on 127.0.0.1:{port}"):
            serve(MemoryRetriever(CITIES), "127.0.0.1", port)


def test_retrying_tries_again_only_what_may_pass(monkeypatch):
    from metarag.errors import retrying

    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    answers = iter([BackendError("busy", retryable=True), BackendError("busy", retryable=True), "ok"])

    def flaky():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retrying(flaky, tries=3, backoff_s=0.5, failed="x failed") == "ok" and sleeps == [0.5, 1.0]
    calls = []

    def refused():
        calls.append(1)
        raise BackendError("HTTP 422", retryable=False)

    with pytest.raises(BackendError, match="HTTP 422") as caught:
        retrying(refused, tries=5, backoff_s=0.5, failed="x failed")
    assert len(calls) == 1 and not caught.value.retryable and sleeps == [0.5, 1.0]
