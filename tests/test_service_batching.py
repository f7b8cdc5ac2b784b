"""The retrieval service under load: requests arriving together are searched as one batch with the
same hits as one at a time, each limit is refused with a 4xx while the service stays healthy, and
/health answers while a long search runs."""
from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import CITIES

from metarag.errors import BackendError
from metarag.records import Hit
from metarag.retrieve.memory import MemoryRetriever

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="fastapi or uvicorn not installed")


class Recording(MemoryRetriever):
    """The in-memory retriever, recording the size of each batch it is asked; `slow_s` per batch,
    and a query containing "explode" fails its whole batch."""

    def __init__(self, passages, slow_s: float = 0.0):
        super().__init__(passages, "memory")
        self.batches: list[int] = []
        self.slow_s = slow_s

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        self.batches.append(len(queries))
        time.sleep(self.slow_s)
        if any("explode" in q for q in queries):
            raise BackendError("the index cannot take that query")
        return [self.search(q, k, exclude) for q in queries]


def post(url: str, body: bytes, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/retrieve", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def healthy(url: str, timeout: float = 10) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=timeout) as response:
        return response.status == 200 and json.loads(response.read())["status"] == "ok"


def test_requests_arriving_together_are_one_batch_with_the_same_hits():
    from metarag.retrieve.service import BackgroundService, ServiceSettings

    local = MemoryRetriever(CITIES, "memory")
    recording = Recording(CITIES)
    words = ["Paris", "capital", "Germany", "France city", "museum", "planet", "Rhine", "tower"]
    bodies = [{"queries": [words[i % len(words)], words[(i + 3) % len(words)]], "topk": 1 + i % 3,
               "exclude": [["p1"] if i % 2 else [], []]} for i in range(24)]
    settings = ServiceSettings(batch_window_s=0.2)  # long enough that the 24 requests meet on a loaded machine
    with BackgroundService.start(recording, settings=settings) as service:
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda body: post(service.url, json.dumps(body).encode()), bodies))
    for body, (status, answer) in zip(bodies, answers):
        assert status == 200
        for query, excluded, rows in zip(body["queries"], body["exclude"], answer["result"]):
            assert [row["id"] for row in rows] == [h.passage.id for h in local.search(query, body["topk"], excluded)]
            assert [row["score"] for row in rows] == [h.score for h in local.search(query, body["topk"], excluded)]
    # 48 queries asked; batched, the back-end saw far fewer, larger calls than one per request
    assert sum(recording.batches) == 48
    assert len(recording.batches) < len(bodies) and max(recording.batches) > 2


def test_a_failing_request_fails_alone_in_its_batch():
    from metarag.retrieve.service import BackgroundService, ServiceSettings

    with BackgroundService.start(Recording(CITIES), settings=ServiceSettings(batch_window_s=0.2)) as service:
        bodies = [{"queries": ["Paris"], "topk": 1}, {"queries": ["explode now"], "topk": 1},
                  {"queries": ["Mars"], "topk": 1}]
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda body: post(service.url, json.dumps(body).encode()), bodies))
    assert [status for status, _ in answers] == [200, 500, 200]
    assert "the index cannot take that query" in answers[1][1]["error"]
    assert answers[0][1]["result"][0][0]["id"] == "p1" and answers[2][1]["result"][0][0]["id"] == "p7"


@pytest.mark.parametrize("body, status, message", [
    (json.dumps({"queries": ["x" * 40] * 60, "topk": 1}).encode(), 413, "request body is"),
    (json.dumps({"queries": ["Paris"] * 5, "topk": 1}).encode(), 422, "at most 4 queries per request, got 5"),
    (json.dumps({"queries": ["Paris " * 20], "topk": 1}).encode(), 422, "at most 50 characters, got one of 120"),
    (json.dumps({"queries": ["Paris"], "topk": 6}).encode(), 422, '"topk" must be an integer from 1 to 5, got 6'),
    (json.dumps({"queries": ["Paris"] * 3, "topk": 4}).encode(), 422, "at most 10 hits per request"),
])
def test_each_limit_is_refused_with_a_4xx_and_the_service_stays_healthy(body, status, message):
    from metarag.retrieve.service import BackgroundService, ServiceSettings

    settings = ServiceSettings(max_body_bytes=2000, max_queries=4, max_query_chars=50, max_topk=5, max_hits=10)
    with BackgroundService.start(MemoryRetriever(CITIES, "memory"), settings=settings) as service:
        got, answer = post(service.url, body)
        assert got == status and message in answer["error"] and "\n" not in answer["error"]
        assert healthy(service.url)
        assert post(service.url, b'{"queries": ["Mars"], "topk": 1}')[1]["result"][0][0]["id"] == "p7"


def test_the_client_names_a_refused_limit_and_does_not_retry():
    from metarag.retrieve.remote import RemoteRetriever
    from metarag.retrieve.service import BackgroundService, ServiceSettings

    with BackgroundService.start(MemoryRetriever(CITIES, "memory"), settings=ServiceSettings(max_topk=5)) as service:
        with pytest.raises(BackendError, match=r"HTTP 422: \"topk\" must be an integer from 1 to 5, got 6") as caught:
            RemoteRetriever(service.url, max_retries=3, backoff_s=0.01).search("Paris", 6)
    assert not caught.value.retryable


def test_the_client_splits_a_batch_over_the_limits_into_requests_that_fit():
    from metarag.retrieve.remote import RemoteRetriever
    from metarag.retrieve.service import BackgroundService, ServiceSettings

    local = MemoryRetriever(CITIES, "memory")
    queries = [f"capital {city} {i}" for i, city in enumerate(["Paris", "Berlin", "Mars", "Rhine", "Lyon",
                                                                 "France", "Germany", "museum", "planet"])]
    settings = ServiceSettings(max_body_bytes=600, max_queries=4, max_hits=9)
    recording = Recording(CITIES)
    with BackgroundService.start(recording, settings=settings) as service:
        remote = RemoteRetriever(service.url)
        # refused for its size (9 x 3 hits), then sent again in pieces that fit, in order
        assert remote.search_many(queries, 3) == [local.search(q, 3) for q in queries]
        sizes = list(recording.batches)
        assert sum(sizes) == 9 and max(sizes) <= 3  # 9 hits // topk 3 = 3 queries a request
        assert remote.limits() == {"max_queries": 4, "max_hits": 9, "max_body_bytes": 600}  # learned once
        exclude = {f"p{i}-" + "x" * 30 for i in range(8)}  # each query carries its copy: the body limit binds
        remote.search_many([q + " again" for q in queries], 1, exclude=exclude)
        assert len(recording.batches) - len(sizes) >= 3  # cut before sending, now that the limits are known
        with pytest.raises(BackendError, match="topk"):  # a limit no split mends is named, not split
            remote.search("Paris", 10)
        assert healthy(service.url)


def test_health_answers_while_a_long_search_runs():
    from metarag.retrieve.service import BackgroundService

    slow = Recording(CITIES, slow_s=3.0)
    with BackgroundService.start(slow) as service:
        searching = threading.Thread(target=post, args=(service.url, b'{"queries": ["Paris"], "topk": 1}'))
        searching.start()
        deadline = time.monotonic() + 10
        while not slow.batches and time.monotonic() < deadline:  # until the 3 s search has started
            time.sleep(0.01)
        start = time.perf_counter()
        assert healthy(service.url, timeout=2.5)
        assert time.perf_counter() - start < 2.5
        assert searching.is_alive()  # /health was answered while the search was still running
        searching.join()


def test_serve_retriever_refuses_a_bad_setting_before_loading_the_index(tmp_path, capsys):
    from metarag.cli import main

    assert main(["serve-retriever", "--index", str(tmp_path / "none"), "--set", "max_tpk=5"]) != 0
    assert "no setting 'max_tpk' (did you mean max_topk" in capsys.readouterr().err
    assert main(["serve-retriever", "--index", str(tmp_path / "none"), "--set", "max_topk=0"]) != 0
    assert "setting 'max_topk' must be >= 1, got 0" in capsys.readouterr().err
