"""The retrieval service: one loaded index answering many workers over HTTP (FastAPI + uvicorn).

`POST /retrieve` takes `{"queries": [...], "topk": k, "exclude": [[ids...], ...]}` ("exclude"
optional, one list per query) and answers `{"retriever": name, "result": [[hit, ...], ...]}`, one
list per query, best first. Each hit answers in two shapes at once: ours, `{id, title, text, score}`,
and Search-R1's (`search_r1/search/retrieval_server.py`, which verl's search tool and the other RL
trainers call): `document: {id, contents}` with `score` beside it, as it answers `return_scores:
true`, and `contents` at the top as it answers without scores. `contents` is the passage's title
and text joined by a newline, the FlashRAG / Search-R1 corpus field their clients split back into
title and text. `GET /health` says which retriever, how many passages and which corpus (its
fingerprint, so a client over another corpus refuses it). `retrieve/remote.py` is our client.
Requests arriving together are searched as one batch; `ServiceSettings` holds the batching and the
limits on what one request may ask.
"""
# No `from __future__ import annotations` here: FastAPI reads the endpoint's annotations at runtime,
# and they name classes imported inside `make_app`.
import asyncio
import json
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from metarag.data.corpus import corpus_fingerprint
from metarag.errors import BackendError, ConfigError, DataError, MetaRAGError, MissingDependency
from metarag.records import Hit, Passage
from metarag.retrieve.base import Retriever
from metarag.retrieve.fusion import batch_search
from metarag.settings import check_ranges, setting

DEFAULT_TOPK = 3  # Search-R1's retrieval server answers 3 passages when topk is not given
REQUEST_FIELDS = ("queries", "topk", "exclude", "return_scores")


@dataclass(frozen=True)
class ServiceSettings:
    """The retrieval service's batching and limits.

    Searches run one batch at a time in a worker thread: the requests that arrived while the last
    batch was searched (up to `max_batch_queries` queries; a request is never split) form the next,
    and `batch_window_s` > 0 waits that long for more before searching. The default 0 measured best
    (docs/notes/2026-12-04-serving-throughput-and-the-retrieval-service.md): a lone client waits for
    nothing, and under load the batches form anyway.
    `max_batch_queries` = 1 searches one request at a time (the service before batching). A request
    over a limit is refused with one line: a body over `max_body_bytes` with 413; more than
    `max_queries` queries, a query over `max_query_chars` characters, a topk over `max_topk`, or
    more than `max_hits` hits in all (queries x topk, which bounds the answer's size) with 422.
    The defaults take what an evaluation or a Search-R1 trainer sends (a few passages for each of up
    to 1,024 queries) and keep an answer under ~16 MB (a hit is ~1.5 KB: its text is sent thrice).
    """

    batch_window_s: float = setting(0.0, ge=0)
    max_batch_queries: int = setting(1024, ge=1)
    max_body_bytes: int = setting(1_000_000, ge=1)
    max_queries: int = setting(1024, ge=1)
    max_query_chars: int = setting(2_000, ge=1)
    max_topk: int = setting(1000, ge=1)
    max_hits: int = setting(10_000, ge=1)

    def __post_init__(self):
        check_ranges(self)


LIMITS = ServiceSettings()


class Refused(DataError):
    """A well-formed request over one of the service's limits: answered `status` (413 or 422)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RetrieveRequest:
    """A checked `POST /retrieve` body: the queries, k, and each query's excluded ids."""

    queries: tuple[str, ...]
    topk: int
    exclude: tuple[frozenset[str], ...]


def parse_request(body: bytes, *, max_topk: int = LIMITS.max_topk, max_queries: int = LIMITS.max_queries,
                  max_query_chars: int = LIMITS.max_query_chars, max_hits: int = LIMITS.max_hits) -> RetrieveRequest:
    """The request in a `POST /retrieve` body; DataError saying what is wrong with it otherwise
    (`Refused` when it is well-formed but over a limit, see `ServiceSettings`).

    "return_scores" (sent by Search-R1 clients) is accepted and ignored: scores are always returned.
    """
    try:
        payload = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both
        raise DataError(f"the request body is not JSON: {exc}") from None
    except RecursionError:  # nesting deeper than the parser's stack: no request is shaped like that
        raise DataError("the request body is nested too deeply to be a retrieve request") from None
    if not isinstance(payload, dict):
        raise DataError(f'the request body must be a JSON object {{"queries": [...], "topk": k}}, '
                        f"not {type(payload).__name__}")
    unknown = sorted(set(payload) - set(REQUEST_FIELDS))
    if unknown:
        raise DataError(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(REQUEST_FIELDS)}")
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise DataError('"queries" must be a list of strings')
    if len(queries) > max_queries:
        raise Refused(f'at most {max_queries} queries per request, got {len(queries)}')
    longest = max(map(len, queries), default=0)
    if longest > max_query_chars:
        raise Refused(f"a query may have at most {max_query_chars} characters, got one of {longest}")
    topk = payload.get("topk", DEFAULT_TOPK)
    # bool is an int subclass, but `true` is no k.
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise DataError(f'"topk" must be an integer from 1 to {max_topk}, got {topk!r}')
    if topk > max_topk:
        raise Refused(f'"topk" must be an integer from 1 to {max_topk}, got {topk!r}')
    if len(queries) * topk > max_hits:
        raise Refused(f"at most {max_hits} hits per request (queries x topk), asked {len(queries)} x {topk}")
    if not isinstance(payload.get("return_scores", False), bool):
        raise DataError(f'"return_scores" must be true or false, got {payload["return_scores"]!r}')
    exclude = payload.get("exclude")
    if exclude is None:
        excluded: tuple[frozenset[str], ...] = (frozenset(),) * len(queries)
    else:
        if (not isinstance(exclude, list) or len(exclude) != len(queries)
                or not all(isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in exclude)):
            raise DataError('"exclude" must be a list with one list of passage ids (strings) per query')
        excluded = tuple(frozenset(ids) for ids in exclude)
    return RetrieveRequest(tuple(queries), topk, excluded)


def _hit_json(hit: Hit) -> dict[str, Any]:
    """One hit in our shape and Search-R1's (see the module docstring)."""
    contents = hit.passage.contents()
    return {"id": hit.passage.id, "title": hit.passage.title, "text": hit.passage.text, "score": hit.score,
            "contents": contents, "document": {"id": hit.passage.id, "contents": contents}}


def searched_passages(retriever: Retriever) -> Sequence[Passage] | None:
    """The passages `retriever` searches, where it says (fused ones: their first retriever's)."""
    passages = getattr(retriever, "passages", None)
    if passages is not None:
        return passages
    inner = getattr(retriever, "retrievers", None)
    return searched_passages(inner[0]) if inner else None


def passage_count(retriever: Retriever) -> int | None:
    """How many passages `retriever` searches, where it says."""
    passages = searched_passages(retriever)
    return None if passages is None else len(passages)


def _import_server() -> tuple[ModuleType, ModuleType]:
    try:
        import fastapi
        import uvicorn
    except ModuleNotFoundError as exc:
        if exc.name not in ("fastapi", "uvicorn"):  # installed but broken: not a missing extra
            raise
        raise MissingDependency(exc.name, "server") from None
    return fastapi, uvicorn


def answer_json(retriever: Retriever, requests: list[RetrieveRequest]) -> list[bytes | Exception]:
    """The JSON answer body of each of `requests`, their queries searched together: one batch per
    (topk, exclude set). If the batch fails, each request is searched alone, so that only a request
    whose own search fails fails (its place holds the exception)."""
    groups: dict[tuple[int, frozenset[str]], list[tuple[int, int]]] = {}
    for r, request in enumerate(requests):
        for q, excluded in enumerate(request.exclude):
            groups.setdefault((request.topk, excluded), []).append((r, q))
    rows: list[list[list[dict[str, Any]]]] = [[[] for _ in request.queries] for request in requests]
    try:
        for (topk, excluded), places in groups.items():
            found = batch_search(retriever, [requests[r].queries[q] for r, q in places], topk, excluded)
            for (r, q), hits in zip(places, found):
                rows[r][q] = [_hit_json(h) for h in hits]
    except Exception:  # tried alone below: each request fails on its own
        if len(requests) == 1:
            raise
        out: list[bytes | Exception] = []
        for request in requests:
            try:
                out.extend(answer_json(retriever, [request]))
            except Exception as exc:  # the request's place holds it, as its answer
                out.append(exc)
        return out
    name = retriever.name
    return [json.dumps({"retriever": name, "result": result}).encode() for result in rows]


class _Batcher:
    """Gathers the requests that arrive together into one search, run in a worker thread, one
    batch at a time (the back-ends are not all thread-safe, and each uses the cores it is given)."""

    def __init__(self, retriever: Retriever, settings: ServiceSettings):
        self.retriever, self.settings = retriever, settings
        self.waiting: deque[tuple[RetrieveRequest, asyncio.Future]] = deque()
        self.drainer: asyncio.Task | None = None

    async def search(self, request: RetrieveRequest) -> bytes:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append((request, future))
        if self.drainer is None or self.drainer.done():
            self.drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        from starlette.concurrency import run_in_threadpool

        settings = self.settings
        while self.waiting:
            if settings.batch_window_s > 0 and self._queued() < settings.max_batch_queries:
                await asyncio.sleep(settings.batch_window_s)  # let the requests arriving together join
            batch, queries = [], 0
            while self.waiting and (not batch or queries + len(self.waiting[0][0].queries)
                                    <= settings.max_batch_queries):
                batch.append(self.waiting.popleft())
                queries += len(batch[-1][0].queries)
            try:
                answers = await run_in_threadpool(answer_json, self.retriever, [r for r, _ in batch])
            except Exception as exc:  # each request of the batch is answered with it
                answers = [exc] * len(batch)
            for (_, future), answer in zip(batch, answers):
                if future.done():  # the client went away
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)

    def _queued(self) -> int:
        return sum(len(request.queries) for request, _ in self.waiting)


def make_app(retriever: Retriever, settings: ServiceSettings = LIMITS) -> Any:
    """The FastAPI application serving `retriever` (see the module docstring for the interface).

    A malformed request gets 400 with `{"error": message}`, one over a limit 413 or 422 (see
    `ServiceSettings`); a retrieval that fails with a metarag error gets 500 with its message. None
    stops the server. Parsing is bounded by the limits and searching and encoding the answer run in
    a worker thread, so the event loop stays free: /health answers while a batch is being searched.
    """
    fastapi, _ = _import_server()
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    app = fastapi.FastAPI(title="metarag retrieval service", docs_url=None, redoc_url=None, openapi_url=None)
    passages = searched_passages(retriever)
    count = None if passages is None else len(passages)
    # which corpus is served, by content (`data.corpus.corpus_fingerprint`, as a run's settings hold it),
    # so an evaluation over another corpus is refused instead of searching this one
    fingerprint = None if passages is None else corpus_fingerprint(passages)
    batcher = _Batcher(retriever, settings)
    limits = {"max_topk": settings.max_topk, "max_queries": settings.max_queries,
              "max_query_chars": settings.max_query_chars, "max_hits": settings.max_hits}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # the limits too, so a client splits a batch over them instead of being refused (remote.py)
        return {"status": "ok", "retriever": retriever.name, "passages": count, "corpus_fingerprint": fingerprint,
                "limits": {**limits, "max_body_bytes": settings.max_body_bytes}}

    @app.post("/retrieve")
    async def retrieve(http_request: Request) -> Any:
        try:
            request = parse_request(await _body(http_request, settings.max_body_bytes), **limits)
        except Refused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except DataError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        try:
            body = await batcher.search(request)
        except MetaRAGError as exc:
            return JSONResponse({"error": f"retrieval failed: {exc}"}, status_code=500)
        return Response(body, media_type="application/json")

    return app


async def _body(http_request: Any, max_bytes: int) -> bytes:
    """The request's body, or Refused (413) as soon as it is known to be over `max_bytes`."""
    declared = http_request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise Refused(f"the request body is {int(declared)} bytes; at most {max_bytes}", status=413)
    chunks, size = [], 0
    async for chunk in http_request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise Refused(f"the request body is over {max_bytes} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info",
          on_listening: Callable[[str], None] | None = None, settings: ServiceSettings = LIMITS) -> None:
    """Serve `retriever` on `host:port` until interrupted (loopback only unless `host` says otherwise).

    A host or port that cannot be listened on raises BackendError naming it (ConfigError for one
    that is no address: an empty host, a port outside 0..65535). `on_listening` is called with the
    service's URL once the socket is bound, before the first request is served. Requests are not
    logged one by one (an evaluation sends thousands); start-up and errors are, at `log_level`.
    """
    _, uvicorn = _import_server()
    sock = listen(host, port)
    config = uvicorn.Config(make_app(retriever, settings), log_level=log_level, access_log=False)
    # Given a bound socket uvicorn does not say where it listens; its Config has set up its logger.
    where = f"[{host}]" if ":" in host else host
    logging.getLogger("uvicorn.error").info("metarag retrieval service: %s over %s passages at http://%s:%d",
                                            retriever.name, passage_count(retriever), where,
                                            sock.getsockname()[1])
    if on_listening is not None:
        on_listening(f"http://{where}:{sock.getsockname()[1]}")
    uvicorn.Server(config).run(sockets=[sock])


def check_address(host: str, port: int) -> None:
    """ConfigError unless `host` is a non-empty host name or address and `port` is in 0..65535 (0: a
    free one). An empty host would bind every interface: that must be said ("0.0.0.0"), not implied."""
    if not isinstance(host, str) or not host.strip():
        raise ConfigError('the host is empty; give an address such as 127.0.0.1 (or 0.0.0.0 for every interface)')
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"the port must be an integer in 0..65535 (0: a free one), got {port!r}")


def listen(host: str, port: int, what: str = "the retrieval service") -> socket.socket:
    """A socket bound to `host:port` (port 0: a free one) and listening, or BackendError saying why
    `what` cannot listen there. Connections made before the server accepts wait in the backlog, so
    a caller may say "serving" as soon as this returns (the viewer uses it too)."""
    check_address(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it an answer written in two pieces (headers, body)
    # waits for the client's delayed ACK, 40 ms a request on Linux.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError, UnicodeError) as exc:  # gaierror for an unknown host name is an OSError
        sock.close()
        reason = getattr(exc, "strerror", None) or exc
        raise BackendError(f"{what} cannot listen on {host}:{port}: {reason}") from None
    sock.listen(128)
    return sock


class BackgroundService:
    """The service on a thread of this process, for tests, benchmarks and notebooks; use `start`."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int):
        self._server = server
        self._thread = thread
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    @classmethod
    def start(cls, retriever: Retriever, host: str = "127.0.0.1", port: int = 0, *,
              timeout_s: float = 30.0, settings: ServiceSettings = LIMITS) -> "BackgroundService":
        """Serve `retriever` on `host:port` (port 0: a free one, see `.port`) once it is listening."""
        _, uvicorn = _import_server()
        # Binding here, not in uvicorn, tells us the port the system chose for port 0.
        sock = listen(host, port)
        bound_port = sock.getsockname()[1]
        config = uvicorn.Config(make_app(retriever, settings), log_level="warning", access_log=False,
                                lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                  name=f"metarag-retriever-{bound_port}")
        thread.start()
        service = cls(server, thread, host, bound_port)
        if not service._wait_started(timeout_s):
            service.stop()
            sock.close()
            raise BackendError(f"the retrieval service did not start on {service.url} within {timeout_s} s")
        return service

    def _wait_started(self, timeout_s: float) -> bool:
        step = 0.02
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive() or waited >= timeout_s:
                return False
            self._thread.join(step)
            waited += step
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and wait for the thread to end."""
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> "BackgroundService":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
