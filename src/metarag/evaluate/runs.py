"""A run folder on disk: resolved settings, manifest, and one result line per attempt at a question.

Results are appended and flushed as each question finishes, so a killed run loses at most the
question in flight; a line cut short by the kill is dropped when the run is reopened. A question
whose attempt failed with a retryable error is tried again by the next run, and that attempt is
appended: the failed line stays as evidence, and every reader takes the newest line per question.
One process writes a run at a time: it holds an OS lock (`flock`) on the folder's `run.lock`, which
the kernel releases when the process ends, however it ends, so a kill -9 leaves no stale lock.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError
from metarag.metrics import AnswerScores
from metarag.records import Trace, from_plain, to_plain


@dataclass(frozen=True)
class QuestionResult:
    """One question's outcome: its trace, the scores of its answer and of its retrieval.

    A question whose method failed has `error` set and scores 0 everywhere: it stays in the
    denominator."""

    question_id: str
    golds: tuple[str, ...]
    prediction: str
    scores: AnswerScores
    support_recall: float | None
    first_support_recall: float | None
    trace: Trace
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def retryable(self) -> bool:
        """Failed in a way another try may fix (a back-end timed out, refused, answered 5xx)."""
        return self.error is not None and self.trace.retryable


class RunStore:
    """The files of one run: settings.json, manifest.json, questions.json, results.jsonl, run.lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.settings_path = self.path / "settings.json"
        self.manifest_path = self.path / "manifest.json"
        self.questions_path = self.path / "questions.json"
        self.results_path = self.path / "results.jsonl"
        self.lock_path = self.path / "run.lock"

    def exists(self) -> bool:
        return self.settings_path.exists()

    def read_json(self, name: str) -> Any:
        path = self.path / name
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError("not a metarag run folder (file missing)", path=str(path)) from None
        except ValueError as exc:
            raise DataError(f"unreadable JSON: {exc}", path=str(path)) from None

    def write_json(self, name: str, value: Any) -> None:
        """Write atomically: a reader never sees half a file."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, self.path / name)

    def load_attempts(self, *, repair: bool = False) -> list[QuestionResult]:
        """Every complete result line, in the order written. A torn last line (a kill mid-write) is
        skipped; with `repair` (only the lock holder may) it is also cut off the file."""
        if not self.results_path.exists():
            return []
        raw = self.results_path.read_bytes()
        keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
        if repair and len(keep) != len(raw):
            with open(self.results_path, "r+b") as f:  # drop the line a kill cut short
                f.truncate(len(keep))
        attempts = []
        for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                attempts.append(from_plain(QuestionResult, json.loads(line)))
            except (ValueError, TypeError, KeyError) as exc:
                raise DataError(f"corrupt result line: {exc}", path=str(self.results_path), line=number) from None
        return attempts

    def load_results(self, *, repair: bool = False) -> dict[str, QuestionResult]:
        """The newest result of each question, by question id (a retry's line replaces the failure
        before it)."""
        return {r.question_id: r for r in self.load_attempts(repair=repair)}

    def append(self, result: QuestionResult, handle) -> None:
        """Write one result line and push it to disk before the next question is counted done."""
        handle.write(json.dumps(to_plain(result), ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())

    def open_for_append(self):
        self.path.mkdir(parents=True, exist_ok=True)
        return open(self.results_path, "a", encoding="utf-8")

    @contextlib.contextmanager
    def lock(self, *, wait: bool = False, command: Sequence[str] | None = None,
             on_wait=None) -> Iterator[dict]:
        """Hold the run's writer lock for the body; yields the holder record written into run.lock
        (pid, host, start time, command). Held already by another process: ConfigError naming that
        holder, or, with `wait`, block until it is released (`on_wait(holder)` is called first)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataError(f"cannot create the run's lock file: {exc.strerror or exc}",
                            path=str(self.lock_path)) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self.lock_holder()
                if not wait:
                    raise ConfigError(f"run folder {self.path} is being written by {describe_holder(holder)}; "
                                      "wait for it to finish, or add --wait") from None
                if on_wait is not None:
                    on_wait(holder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:  # e.g. ENOLCK: a file system without locks
                raise DataError(f"cannot lock the run folder ({exc.strerror or exc}); put --runs-dir on a local "
                                "file system", path=str(self.lock_path)) from None
            holder = {"pid": os.getpid(), "host": socket.gethostname(),
                      "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      "command": " ".join(command if command is not None else sys.argv)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
            yield holder
        finally:
            os.close(fd)  # releases the lock; the file stays (deleting it would race a waiting writer)

    def lock_holder(self) -> dict | None:
        """Who holds (or last held) the writer lock, as recorded in run.lock; None if unreadable."""
        try:
            holder = json.loads(self.lock_path.read_text())
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None


def describe_holder(holder: dict | None) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')} "
            f"({holder.get('command')!r})")
