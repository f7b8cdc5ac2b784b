"""The viewer's FastAPI application: the page (static/, shipped in the package, no internet resource)
and the JSON it reads, read-only over the run folders named on the command line.

- GET /api/runs: each run (manifest, settings, problems or the error that makes it no run) and the
  report table, computed by `evaluate/report.py` as `metarag report` computes it.
- GET /api/questions: one page of the question list (every run's answer, EM/F1, requests, tokens,
  latency), filtered and sorted, with the paired wins and losses of run b against run a.
- GET /api/question?id=ID: one question's traces in every run, read from disk only now, each step
  raw as written (a step kind this metarag does not know carries a `_note` instead of failing).

A bad parameter gets 400 with `{"error": message}`; an unknown question 404.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metarag.errors import BackendError, ConfigError, MissingDependency
from metarag.view.loading import RunView, clean_json, expand_paths, read_step, runs_table

STATIC = Path(__file__).resolve().parent / "static"
FILTERS = ("all", "wrong-any", "flip", "differ", "failed", "over-search", "under-search")
METRICS = ("em", "f1", "requests", "tokens", "latency", "retrievals", "steps")
MAX_PAGE = 500


class Viewer:
    """The runs behind one page, refreshed when their files change, and the answers to the API."""

    def __init__(self, paths: Sequence[str | Path]):
        folders = expand_paths(paths)
        names = [p.name for p in folders]
        # one run id under two runs folders: name each by its parent folder too
        self.views = [RunView(p, f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else None) for p in folders]
        self._table_key: tuple | None = None
        self._table: dict | None = None
        self._lock = threading.Lock()

    def refresh(self) -> None:
        for view in self.views:
            view.refresh()

    # ------------------------------------------------------------------------------------ runs
    def runs(self) -> dict:
        self.refresh()
        with self._lock:
            key = tuple(v._stamp for v in self.views)
            if key != self._table_key:
                try:
                    self._table = runs_table(self.views)
                except Exception as exc:  # the page must still list the runs and say why there is no table
                    self._table = {"columns": [], "cells": [], "rows": [], "runs": [], "markdown": "",
                                   "notes": [f"the report table could not be computed: {type(exc).__name__}: {exc}"]}
                self._table_key = key
            table = self._table
        return {"runs": [self._run_json(i, v) for i, v in enumerate(self.views)], "table": table,
                "filters": list(FILTERS), "metrics": list(METRICS)}

    def _run_json(self, index: int, view: RunView) -> dict:
        out: dict[str, Any] = {"index": index, "name": view.name, "path": str(view.path), "error": view.error,
                               "problems": view.problems}
        if view.run is not None:
            settings = view.run.settings
            out.update(
                method=settings.get("method"), settings=clean_json(settings), manifest=clean_json(view.run.manifest),
                n_questions=len(view.run.question_ids), n_results=len(view.results),
                failed=sum(r.failed for r in view.results.values()),
                decides=any(c["over_search"] is not None for c in view.cells.values()))
        return out

    # ------------------------------------------------------------------------------- questions
    def question_ids(self) -> list[str]:
        ids: dict[str, None] = {}
        for view in self.views:
            if view.run is not None:
                ids.update(dict.fromkeys(view.run.question_ids))
        return list(ids)

    def _info(self) -> tuple[dict, dict, list[str]]:
        types: dict[str, str | None] = {}
        hops: dict[str, int | None] = {}
        notes = []
        for view in self.views:
            if view.run is None:
                continue
            info = view.dataset()
            if info.note:
                notes.append(f"{view.name}: {info.note}")
            for q, t in info.types.items():
                types.setdefault(q, t)
            for q, h in info.hops.items():
                hops.setdefault(q, h)
        return types, hops, notes

    def questions(self, *, offset: int = 0, limit: int = 50, filter: str = "all", a: int = 0, b: int | None = None,
                  type: str = "", q: str = "", sort: str = "order", order: str = "asc") -> dict:
        self.refresh()
        if filter not in FILTERS:
            raise BadRequest(f"unknown filter {filter!r}; valid: {', '.join(FILTERS)}")
        if not 0 <= offset:
            raise BadRequest(f"offset must be 0 or more, got {offset}")
        if not 1 <= limit <= MAX_PAGE:
            raise BadRequest(f"limit must be 1..{MAX_PAGE}, got {limit}")
        if order not in ("asc", "desc"):
            raise BadRequest(f"order must be asc or desc, got {order!r}")
        n = len(self.views)
        b = min(1, max(n - 1, 0)) if b is None else b
        for name, value in (("a", a), ("b", b)):
            if not 0 <= value < max(n, 1):
                raise BadRequest(f"run {name}={value} is not one of the {n} runs (0..{n - 1})")
        sort_run, sort_metric = None, None
        if sort != "order":
            run_text, _, sort_metric = sort.partition(":")
            if not run_text.isdigit() or int(run_text) >= n or sort_metric not in METRICS:
                raise BadRequest(f"sort must be 'order' or RUN:METRIC with RUN in 0..{n - 1} and METRIC one of "
                                 f"{', '.join(METRICS)}, got {sort!r}")
            sort_run = int(run_text)
        types, hops, notes = self._info()
        rows = []
        for qid in self.question_ids():
            cells = [v.cells.get(qid) for v in self.views]
            first = next((v.results[qid] for v in self.views if qid in v.results), None)
            rows.append({"id": qid, "question": first.trace.question if first else "",
                         "golds": list(first.golds) if first else [], "type": types.get(qid),
                         "hops": hops.get(qid), "runs": cells})
        counts = {name: sum(_keep(r, name, a, b) for r in rows) for name in FILTERS}
        kept = [r for r in rows if _keep(r, filter, a, b)]
        if type:
            kept = [r for r in kept if (r["type"] or "") == type]
        if q.strip():
            needle = q.strip().lower()
            kept = [r for r in kept if needle in r["question"].lower() or needle in r["id"].lower()
                    or any(c and needle in (c["answer"] or "").lower() for c in r["runs"])]
        if sort_run is not None:
            present = [r for r in kept if r["runs"][sort_run] is not None]
            absent = [r for r in kept if r["runs"][sort_run] is None]
            present.sort(key=lambda r: r["runs"][sort_run][sort_metric], reverse=order == "desc")
            kept = present + absent  # questions the run has no result for go last either way
        elif order == "desc":
            kept.reverse()
        return clean_json({"total": len(kept), "offset": offset, "limit": limit, "items": kept[offset:offset + limit],
                           "counts": counts, "types": sorted({t for t in types.values() if t}),
                           "pairs": pairs(rows, a, b) if n > 1 else None, "notes": notes,
                           "runs": [v.name for v in self.views]})

    # -------------------------------------------------------------------------------- question
    def question(self, question_id: str) -> dict:
        self.refresh()
        if question_id not in set(self.question_ids()):
            raise NotFound(f"no run has a question with id {question_id!r}")
        types, hops, notes = self._info()
        supporting: tuple[str, ...] = ()
        golds: list[str] = []
        text = ""
        runs = []
        for index, view in enumerate(self.views):
            entry: dict[str, Any] = {"index": index, "name": view.name, "error": None}
            if view.run is None:
                entry["error"] = view.error
                runs.append(entry)
                continue
            supporting = supporting or view.dataset().supporting.get(question_id, ())
            entry["method"] = view.run.settings.get("method")
            entry["method_settings"] = view.run.settings.get("method_settings") or {}
            result = view.results.get(question_id)
            if result is None:
                entry["error"] = (f"{view.name} has no result for this question yet" if question_id in
                                  view.run.question_ids else f"{view.name} does not ask this question")
                runs.append(entry)
                continue
            golds = golds or list(result.golds)
            text = text or result.trace.question
            raw, why = view.raw_trace(question_id)
            entry["cell"] = view.cells[question_id]
            entry["result"] = {"prediction": result.prediction, "scores": vars(result.scores),
                               "support_recall": result.support_recall,
                               "first_support_recall": result.first_support_recall, "error": result.error,
                               "retryable": result.retryable}
            if raw is None:
                entry["error"] = why
            else:
                trace = raw.get("trace") if isinstance(raw.get("trace"), dict) else {}
                steps = trace.get("steps") if isinstance(trace.get("steps"), list) else []
                entry["trace"] = {**trace, "steps": [_annotated(s) for s in steps]}
            runs.append(entry)
        return clean_json({"id": question_id, "question": text, "golds": golds, "type": types.get(question_id),
                           "hops": hops.get(question_id), "supporting": list(supporting), "runs": runs,
                           "notes": notes})


def _annotated(raw: Any) -> Any:
    """A raw step with `_note` where this metarag cannot read it (the page shows it as raw JSON)."""
    _, note = read_step(raw)
    if note is None:
        return raw
    return {**raw, "_note": note} if isinstance(raw, dict) else {"kind": None, "_raw": raw, "_note": note}


def _right(cell: dict | None) -> bool:
    return cell is not None and not cell["failed"] and cell["em"] >= 1.0


def _wrong(cell: dict | None) -> bool:
    return cell is not None and (cell["failed"] or cell["em"] < 1.0)


def _keep(row: dict, name: str, a: int, b: int) -> bool:
    cells = row["runs"]
    present = [c for c in cells if c is not None]
    if name == "all":
        return True
    if name == "wrong-any":
        return any(_wrong(c) for c in present)
    if name == "flip":  # wrong in run a, right in run b
        return a < len(cells) and b < len(cells) and _wrong(cells[a]) and _right(cells[b])
    if name == "differ":
        return any(_wrong(c) for c in present) and any(_right(c) for c in present)
    if name == "failed":
        return any(c["failed"] for c in present)
    if name == "over-search":
        return any(c["over_search"] for c in present)
    if name == "under-search":
        return any(c["under_search"] for c in present)
    raise BadRequest(f"unknown filter {name!r}")


def pairs(rows: list[dict], a: int, b: int) -> dict:
    """Paired wins and losses of run b against run a over the questions both answered: by EM (b right
    where a is wrong, and the reverse) and by F1 (higher, lower, equal)."""
    both = [(r["runs"][a], r["runs"][b]) for r in rows if r["runs"][a] is not None and r["runs"][b] is not None]
    return {"a": a, "b": b, "n": len(both),
            "em": {"wins": sum(_right(y) and _wrong(x) for x, y in both),
                   "losses": sum(_right(x) and _wrong(y) for x, y in both),
                   "ties": sum(_right(x) == _right(y) for x, y in both)},
            "f1": {"wins": sum(y["f1"] > x["f1"] for x, y in both), "losses": sum(y["f1"] < x["f1"] for x, y in both),
                   "ties": sum(y["f1"] == x["f1"] for x, y in both)}}


class BadRequest(Exception):
    status = 400


class NotFound(Exception):
    status = 404


def _import_server():
    try:
        import fastapi
        import uvicorn
    except ModuleNotFoundError as exc:
        if exc.name not in ("fastapi", "uvicorn"):
            raise
        raise MissingDependency(exc.name, "view") from None
    return fastapi, uvicorn


def create_app(paths: Sequence[str | Path]) -> Any:
    """The FastAPI application over the run folders `paths` (a folder of runs stands for each run in it)."""
    fastapi, _ = _import_server()
    from fastapi import Query, Request
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles

    viewer = Viewer(paths)
    app = fastapi.FastAPI(title="metarag view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.viewer = viewer

    @app.exception_handler(BadRequest)
    @app.exception_handler(NotFound)
    async def _bad(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)  # type: ignore[attr-defined]

    @app.exception_handler(fastapi.exceptions.RequestValidationError)
    async def _invalid(request: Request, exc: Exception) -> JSONResponse:
        errors = getattr(exc, "errors", lambda: [])()
        where = "; ".join(f"{'.'.join(map(str, e.get('loc', ())[1:]))}: {e.get('msg')}" for e in errors)
        return JSONResponse({"error": f"bad parameter: {where or exc}"}, status_code=400)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/api/runs")
    def runs() -> dict:
        return viewer.runs()

    @app.get("/api/questions")
    def questions(offset: int = 0, limit: int = 50, filter: str = "all", a: int = 0, b: int | None = None,
                  type: str = "",
                  q: str = "", sort: str = "order", order: str = "asc") -> dict:
        return viewer.questions(offset=offset, limit=limit, filter=filter, a=a, b=b, type=type, q=q, sort=sort,
                                order=order)

    @app.get("/api/question")
    def question(id: str = Query(..., min_length=1)) -> dict:
        return viewer.question(id)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0: a free port) and listening, or BackendError saying why not."""
    from metarag.retrieve.service import listen as bind_and_listen

    return bind_and_listen(host, port, "the viewer")


def url_of(host: str, sock: socket.socket) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"http://{where}:{sock.getsockname()[1]}/"


def serve(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8100, *,
          on_listening: Callable[[str, Viewer], None] | None = None) -> None:
    """Serve the page over `paths` until interrupted; `on_listening(url, viewer)` once the socket is bound.
    A path that does not exist is refused before anything is served (a typo would otherwise leave a page
    saying so running); a folder that exists but is still empty (a run starting) is served."""
    for path in paths:
        if not Path(path).exists():
            raise ConfigError(f"{path}: no such folder (metarag view takes run folders, runs/<run-id>, or a folder "
                              "of them)")
    _, uvicorn = _import_server()
    app = create_app(paths)
    sock = listen(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    if on_listening is not None:
        on_listening(url_of(host, sock), app.state.viewer)
    uvicorn.Server(config).run(sockets=[sock])


class ViewServer:
    """The viewer on a thread of this process, for tests and benchmarks: `with ViewServer.start(paths) as s`."""

    def __init__(self, server: Any, thread: threading.Thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    @classmethod
    def start(cls, paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 0,
              timeout_s: float = 30.0) -> ViewServer:
        _, uvicorn = _import_server()
        sock = listen(host, port)
        config = uvicorn.Config(create_app(paths), log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="metarag-view")
        thread.start()
        waited = 0.0
        while not server.started:
            if not thread.is_alive() or waited >= timeout_s:
                server.should_exit = True
                raise BackendError(f"the viewer did not start on {url_of(host, sock)} within {timeout_s} s")
            thread.join(0.02)
            waited += 0.02
        return cls(server, thread, url_of(host, sock))

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def __enter__(self) -> ViewServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
