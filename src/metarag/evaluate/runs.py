"""A run folder on disk: resolved settings, manifest, and one result line per attempt at a question.

Results are appended and flushed as each question finishes, so a killed run loses at most the
question in flight; a line cut short by the kill is dropped when the run is reopened. A question
whose attempt failed with a retryable error is tried again by the next run, and that attempt is
appended: the failed line stays as evidence, and every reader takes the newest line per question.
One process writes a run at a time: it holds an OS lock (`flock`) on the folder's `run.lock`, which
the kernel releases when the process ends, however it ends, so a kill -9 leaves no stale lock.

A sharded run (`eval --shard i/n`) is one run folder written by n processes, each over a disjoint
slice of the questions: shard i writes `results.shard-i-of-n.jsonl` under `run.shard-i-of-n.lock`,
`shards.json` records n, and readers merge the shard files into the one run. What several writers
share (settings, questions, shards.json, the manifest) is changed only under `folder.lock`, held
for milliseconds.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError
from metarag.metrics import AnswerScores
from metarag.records import Trace, from_plain, to_plain


@dataclass(frozen=True)
class QuestionResult:
    """One question's outcome: its trace, the scores of its answer and of its retrieval.

    A question whose method failed has `error` set and scores 0 everywhere: it stays in the
    denominator. `sample`: which of a sampled run's k answers to the question (`eval --samples k`),
    0 in a run of one answer per question (and then not written)."""

    question_id: str
    golds: tuple[str, ...]
    prediction: str
    scores: AnswerScores
    support_recall: float | None
    first_support_recall: float | None
    trace: Trace
    error: str | None = None
    sample: int = field(default=0, metadata={"omit_default": True})

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def retryable(self) -> bool:
        """Failed in a way another try may fix (a back-end timed out, refused, answered 5xx)."""
        return self.error is not None and self.trace.retryable


@dataclass(frozen=True)
class Shard:
    """Slice `index` (1-based) of `count` of a run's questions: every count-th question of the run's
    seeded question order, starting at the index-th, so the slices are disjoint, cover the run, and
    stay put for a given dataset, limit and seed."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """"i/n" as `--shard` takes it, 1 <= i <= n."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise ConfigError(f"--shard {text!r}: give I/N, e.g. 2/4 (the second of four shards)")
        shard = cls(int(m.group(1)), int(m.group(2)))
        if not 1 <= shard.index <= shard.count:
            raise ConfigError(f"--shard {text!r}: I must be between 1 and N")
        return shard

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def name(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    def take(self, items: Sequence) -> list:
        return list(items[self.index - 1::self.count])


SHARD_FILE = re.compile(r"results\.shard-(\d+)-of-(\d+)\.jsonl")


class RunStore:
    """The files of one run: settings.json, manifest.json, questions.json, results.jsonl, run.lock;
    with `shard`, the store of that shard's writer (its own results file and lock)."""

    def __init__(self, path: str | Path, shard: Shard | None = None):
        self.path = Path(path)
        self.shard = shard
        self.settings_path = self.path / "settings.json"
        self.manifest_path = self.path / "manifest.json"
        self.questions_path = self.path / "questions.json"
        self.shards_path = self.path / "shards.json"
        self.results_path = self.path / (f"results.{shard.name}.jsonl" if shard else "results.jsonl")
        self.lock_path = self.path / (f"run.{shard.name}.lock" if shard else "run.lock")
        self.folder_lock_path = self.path / "folder.lock"

    def exists(self) -> bool:
        return self.settings_path.exists()

    def shard_count(self) -> int | None:
        """How many shards the run is split into (shards.json), None for an unsharded run."""
        if not self.shards_path.exists():
            return None
        saved = self.read_json("shards.json")
        count = saved.get("count") if isinstance(saved, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise DataError("shards.json names no shard count", path=str(self.shards_path))
        return count

    def result_files(self) -> list[tuple[Shard | None, Path]]:
        """Every results file in the folder: results.jsonl, then the shards' files in shard order."""
        files: list[tuple[Shard | None, Path]] = []
        if (self.path / "results.jsonl").exists():
            files.append((None, self.path / "results.jsonl"))
        shards = []
        for p in self.path.glob("results.shard-*-of-*.jsonl") if self.path.is_dir() else ():
            if m := SHARD_FILE.fullmatch(p.name):
                shards.append((Shard(int(m.group(1)), int(m.group(2))), p))
        return files + sorted(shards, key=lambda sp: (sp[0].count, sp[0].index))

    def check_layout(self) -> None:
        """Refuse to write a sharded run unsharded, an unsharded one sharded, or a run split n ways with
        another n; record the shard count for the first shard. Call under `folder_lock`, holding `lock`."""
        count = self.shard_count()
        strays = [s for s, _ in self.result_files() if s is not None and s.count != count]
        if strays:
            layout = f"sharded {count} ways" if count else "that is not sharded (no shards.json)"
            raise DataError(f"results of shard {strays[0].label} in a run folder {layout}: remove the stray file",
                            path=str(self.path))
        if self.shard is None:
            if count is not None:
                raise ConfigError(f"run folder {self.path} is sharded {count} ways: run it with --shard I/{count}, "
                                  "or change --runs-dir for an unsharded run")
            return
        if count is None:
            unsharded = (self.path / "results.jsonl").exists()
            if not unsharded:
                fd = os.open(self.path / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    unsharded = True  # an unsharded writer is at work on it now
                finally:
                    os.close(fd)
            if unsharded:
                raise ConfigError(f"run folder {self.path} holds an unsharded run; run it without --shard, or change "
                                  "--runs-dir for a sharded one")
            self.write_json("shards.json", {"count": self.shard.count})
        elif count != self.shard.count:
            raise ConfigError(f"run folder {self.path} is sharded {count} ways, not {self.shard.count}: give "
                              f"--shard I/{count}")

    def missing_shards(self, question_ids: Sequence[str], results: dict[str, Any]) -> list[str]:
        """The shards of a sharded run that have not written every question of their slice, each as
        "2/4 (not started)" or "2/4 (3 of 25 questions)"; [] when all are done or the run is unsharded."""
        count = self.shard_count()
        if count is None:
            return []
        if count > len(question_ids):  # written by a version that did not check; no shard of it can run
            raise DataError(f"shards.json splits the run {count} ways, more than its {len(question_ids)} questions "
                            "(no metarag writes that now): remove shards.json and the results.shard-* files, then "
                            "run the shards again", path=str(self.shards_path))
        started = {s for s, _ in self.result_files() if s is not None}
        missing = []
        for index in range(1, count + 1):
            shard = Shard(index, count)
            mine = shard.take(list(question_ids))
            have = sum(q in results for q in mine)
            if have < len(mine):
                state = "not started" if shard not in started else f"{have} of {len(mine)} questions"
                missing.append(f"{shard.label} ({state})")
        return missing

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
        """Every complete result line, in the order written: a shard's writer reads its own file, any
        other reader every results file of the folder (the shards' slices are disjoint). A torn last
        line (a kill mid-write) is skipped; with `repair` (only the lock holder may) it is also cut off
        the file."""
        if self.shard is not None:
            return _read_attempts(self.results_path, repair)
        return [r for _, path in self.result_files() for r in _read_attempts(path, repair)]

    def load_results(self, *, repair: bool = False) -> dict[str, QuestionResult]:
        """The newest result of each question, by question id (a retry's line replaces the failure
        before it); of a sampled run, of its sample 0 (`load_samples` has them all)."""
        return {r.question_id: r for r in self.load_attempts(repair=repair) if r.sample == 0}

    def load_samples(self, *, repair: bool = False) -> dict[tuple[str, int], QuestionResult]:
        """The newest result of each (question id, sample) of a sampled run (`eval --samples k`)."""
        return {(r.question_id, r.sample): r for r in self.load_attempts(repair=repair)}

    @contextlib.contextmanager
    def folder_lock(self) -> Iterator[None]:
        """Held while a writer changes what the shards of a run share: settings.json, questions.json,
        shards.json, manifest.json (milliseconds; a writer waits for it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder_lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append(self, result: QuestionResult, handle) -> None:
        """Write one result line and push it to disk before the next question is counted done."""
        self.append_many((result,), handle)

    def append_many(self, results: Sequence[QuestionResult], handle) -> None:
        """Write one line per result and push them to disk together (one fsync: a group commit, so
        the disk never paces a run whose questions finish hundreds a second)."""
        handle.write("".join(json.dumps(to_plain(r), ensure_ascii=False) + "\n" for r in results))
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
                    what = f"shard {self.shard.label} of run folder" if self.shard else "run folder"
                    raise ConfigError(f"{what} {self.path} is being written by {describe_holder(holder)}; "
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


def _read_attempts(path: Path, repair: bool) -> list[QuestionResult]:
    if not path.exists():
        return []
    raw = path.read_bytes()
    keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
    if repair and len(keep) != len(raw):
        with open(path, "r+b") as f:  # drop the line a kill cut short
            f.truncate(len(keep))
    attempts = []
    for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            attempts.append(from_plain(QuestionResult, json.loads(line)))
        except (ValueError, TypeError, KeyError) as exc:
            raise DataError(f"corrupt result line: {exc}", path=str(path), line=number) from None
    return attempts


def describe_holder(holder: dict | None) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')} "
            f"({holder.get('command')!r})")
