"""A run folder on disk: resolved settings, manifest, and one result line per finished question.

Results are appended and flushed as each question finishes, so a killed run loses at most the
question in flight; a line cut short by the kill is dropped when the run is reopened, and a
resumed run skips every question already written, so no question is ever recorded twice.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import DataError
from metarag.evaluate.metrics import AnswerScores
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


class RunStore:
    """The files of one run: settings.json, manifest.json, questions.json, results.jsonl."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.settings_path = self.path / "settings.json"
        self.manifest_path = self.path / "manifest.json"
        self.questions_path = self.path / "questions.json"
        self.results_path = self.path / "results.jsonl"

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

    def load_results(self) -> dict[str, QuestionResult]:
        """Every complete result line, by question id; a torn last line is cut off the file."""
        if not self.results_path.exists():
            return {}
        raw = self.results_path.read_bytes()
        keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
        if len(keep) != len(raw):
            with open(self.results_path, "r+b") as f:  # drop the line a kill cut short
                f.truncate(len(keep))
        results: dict[str, QuestionResult] = {}
        for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                result = from_plain(QuestionResult, json.loads(line))
            except (ValueError, TypeError, KeyError) as exc:
                raise DataError(f"corrupt result line: {exc}", path=str(self.results_path), line=number) from None
            results.setdefault(result.question_id, result)
        return results

    def append(self, result: QuestionResult, handle) -> None:
        """Write one result line and push it to disk before the next question is counted done."""
        handle.write(json.dumps(to_plain(result), ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())

    def open_for_append(self):
        self.path.mkdir(parents=True, exist_ok=True)
        return open(self.results_path, "a", encoding="utf-8")
