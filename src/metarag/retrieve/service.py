"""The retrieval service: one loaded index answering many workers over HTTP (FastAPI + uvicorn).

`POST /retrieve` takes `{"queries": [...], "topk": k, "exclude": [[ids...], ...]}` ("exclude"
optional, one list per query) and answers `{"retriever": name, "result": [[hit, ...], ...]}`, one
list per query, best first. Each hit answers in two shapes at once: ours, `{id, title, text, score}`,
and Search-R1's (`search_r1/search/retrieval_server.py`, which verl's search tool and the other RL
trainers call): `document: {id, contents}` with `score` beside it, as it answers `return_scores:
true`, and `contents` at the top as it answers without scores. `contents` is the passage's title
and text joined by a newline, the FlashRAG / Search-R1 corpus field their clients split back into
title and text. `GET /health` says which retriever and how many passages. `retrieve/remote.py` is
our client.
"""
# No `from __future__ import annotations` here: FastAPI reads the endpoint's annotations at runtime,
# and they name classes imported inside `make_app`.
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from metarag.errors import BackendError, ConfigError, DataError, MetaRAGError, MissingDependency
from metarag.records import Hit
from metarag.retrieve.base import Retriever
from metarag.retrieve.fusion import batch_search

DEFAULT_TOPK = 3  # Search-R1's retrieval server answers 3 passages when topk is not given
REQUEST_FIELDS = ("queries", "topk", "exclude", "return_scores")


@dataclass(frozen=True)
class RetrieveRequest:
    """A checked `POST /retrieve` body: the queries, k, and each query's excluded ids."""

    queries: tuple[str, ...]
    topk: int
    exclude: tuple[frozenset[str], ...]


def parse_request(body: bytes, *, max_topk: int = 1000, max_queries: int = 4096) -> RetrieveRequest:
    """The request in a `POST /retrieve` body; DataError saying what is wrong with it otherwise.

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
        raise DataError(f'at most {max_queries} queries per request, got {len(queries)}')
    topk = payload.get("topk", DEFAULT_TOPK)
    # bool is an int subclass, but `true` is no k.
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= max_topk:
        raise DataError(f'"topk" must be an integer from 1 to {max_topk}, got {topk!r}')
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


def answer(retriever: Retriever, request: RetrieveRequest) -> list[list[dict[str, Any]]]:
    """Each query's hits in both shapes (`_hit_json`); queries sharing an exclude set go in one batch."""
    groups: dict[frozenset[str], list[int]] = {}
    for i, excluded in enumerate(request.exclude):
        groups.setdefault(excluded, []).append(i)
    results: list[list[dict[str, Any]]] = [[] for _ in request.queries]
    for excluded, positions in groups.items():
        found = batch_search(retriever, [request.queries[i] for i in positions], request.topk, excluded)
        for i, hits in zip(positions, found):
            results[i] = [_hit_json(h) for h in hits]
    return results


def _hit_json(hit: Hit) -> dict[str, Any]:
    """One hit in our shape and Search-R1's (see the module docstring)."""
    contents = hit.passage.contents()
    return {"id": hit.passage.id, "title": hit.passage.title, "text": hit.passage.text, "score": hit.score,
            "contents": contents, "document": {"id": hit.passage.id, "contents": contents}}


def passage_count(retriever: Retriever) -> int | None:
    """How many passages `retriever` searches, where it says (fused ones: their first retriever's)."""
    passages = getattr(retriever, "passages", None)
    if passages is not None:
        return len(passages)
    inner = getattr(retriever, "retrievers", None)
    return passage_count(inner[0]) if inner else None


def _import_server() -> tuple[ModuleType, ModuleType]:
    try:
        import fastapi
        import uvicorn
    except ModuleNotFoundError as exc:
        if exc.name not in ("fastapi", "uvicorn"):  # installed but broken: not a missing extra
            raise
        raise MissingDependency(exc.name, "server") from None
    return fastapi, uvicorn


def make_app(retriever: Retriever, *, max_topk: int = 1000, max_queries: int = 4096) -> Any:
    """The FastAPI application serving `retriever` (see the module docstring for the interface).

    A bad request gets 400 with `{"error": message}`; a retrieval that fails with a metarag error
    gets 500 with its message. Neither stops the server. Searches run one at a time in a worker
    thread (the back-ends are not all thread-safe, and each already uses the cores it is given),
    so /health answers while a batch is being searched.
    """
    fastapi, _ = _import_server()
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    app = fastapi.FastAPI(title="metarag retrieval service", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    count = passage_count(retriever)

    def search(request: RetrieveRequest) -> list[list[dict[str, Any]]]:
        with lock:
            return answer(retriever, request)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "retriever": retriever.name, "passages": count}

    @app.post("/retrieve")
    async def retrieve(http_request: Request) -> Any:
        try:
            request = parse_request(await http_request.body(), max_topk=max_topk, max_queries=max_queries)
        except DataError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        try:
            result = await run_in_threadpool(search, request)
        except MetaRAGError as exc:
            return JSONResponse({"error": f"retrieval failed: {exc}"}, status_code=500)
        return {"retriever": retriever.name, "result": result}

    return app


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info",
          on_listening: Callable[[str], None] | None = None) -> None:
    """Serve `retriever` on `host:port` until interrupted (loopback only unless `host` says otherwise).

    A host or port that cannot be listened on raises BackendError naming it (ConfigError for one
    that is no address: an empty host, a port outside 0..65535). `on_listening` is called with the
    service's URL once the socket is bound, before the first request is served. Requests are not
    logged one by one (an evaluation sends thousands); start-up and errors are, at `log_level`.
    """
    _, uvicorn = _import_server()
    sock = listen(host, port)
    config = uvicorn.Config(make_app(retriever), log_level=log_level, access_log=False)
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
              timeout_s: float = 30.0) -> "BackgroundService":
        """Serve `retriever` on `host:port` (port 0: a free one, see `.port`) once it is listening."""
        _, uvicorn = _import_server()
        # Binding here, not in uvicorn, tells us the port the system chose for port 0.
        sock = listen(host, port)
        bound_port = sock.getsockname()[1]
        config = uvicorn.Config(make_app(retriever), log_level="warning", access_log=False, lifespan="off")
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
