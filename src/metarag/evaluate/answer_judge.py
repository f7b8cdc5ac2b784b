"""LLM-as-judge accuracy of a run's answers (`eval --judge-llm`), kept in the run folder, and its agreement
with EM and cover-EM (`Acc`), which `metarag report` shows.

The judge (`judges.correctness.AnswerJudge`) runs through the runner like any model call
(`AnswerAudit` over `run_many`). Its verdicts go to `answer-judge-<id>.jsonl`, one line per judged answer
(question, sample, the prediction judged, the verdict and the judge's own trace: its prompt and reply),
written as each verdict comes, beside `answer-judge-<id>.json` naming the judge model, its settings and
its prompt's text. The id hashes all three, so another judge model, prompt or setting writes a file of
its own and never reuses these verdicts; a re-run asks only about answers without a verdict yet (a
failed request is asked again; an unreadable reply stays `unjudged`, as greedy decoding would give it
again) and about answers that changed since they were judged (a retried question).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError
from metarag.evaluate.cost import model_name
from metarag.evaluate.runs import QuestionResult
from metarag.evaluate.stats import cohen_kappa
from metarag.judges.correctness import (
    CORRECT,
    GOLD_SEPARATOR,
    INCORRECT,
    UNJUDGED,
    AnswerAudit,
    AnswerJudge,
)
from metarag.records import Judge, Question, Trace, from_plain, to_plain
from metarag.settings import settings_hash

PREFIX = "answer-judge-"
SELF_MARK = " (self)"  # after a judge that is the judged run's own model
_RUN_OPTIONS = re.compile(r":prefix_chunk=\d+")
JUDGE_WINDOW = 32  # answers judged in lockstep: one batch of at most this many prompts for the judge model


@dataclass(frozen=True)
class JudgedAnswer:
    """One verdict: which answer (question, sample, the prediction as judged) and what the judge said,
    with the judge's trace (its prompt and reply, or the error of a failed request)."""

    question_id: str
    prediction: str
    verdict: str
    trace: Trace
    sample: int = field(default=0, metadata={"omit_default": True})


def judge_id(model_identity: str, judge: AnswerJudge) -> str:
    """The id of one judge set-up: its model, its settings and its prompt's text."""
    return settings_hash(model_identity, judge, judge.task)


def judge_files(run_path: str | Path) -> list[Path]:
    """The answer-judge verdict files of a run folder, oldest first (the last is the newest judge)."""
    return sorted(Path(run_path).glob(f"{PREFIX}*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name))


def judge_answers(run_path: str | Path, results: Sequence[QuestionResult], judge_llm: Any,
                  judge: AnswerJudge = AnswerJudge(), *, workers: int = 1) -> Path:
    """Judge every answer of `results` (each question's newest result per sample) that has no verdict
    from this judge set-up yet; returns the verdict file. `judge_llm`: the judge model as a spec string
    (`embedded`, `openai:MODEL@URL` ..., built only when something is left to judge; the spec names the
    set-up) or an LLM object (its `identity` names it). A failed question or an empty prediction is not
    asked: no answer is never right. Verdicts are appended as they come, so a killed judge keeps them."""
    from metarag.methods.runner import Runtime, build_named_llm, run_many

    name = judge_llm if isinstance(judge_llm, str) else str(getattr(judge_llm, "identity", type(judge_llm).__name__))
    path = Path(run_path) / f"{PREFIX}{judge_id(name, judge)}.jsonl"
    kept = {(v.question_id, v.sample): v for v in load_verdicts(path, repair=True) if v.trace.error is None}
    todo = [r for r in results if r.prediction.strip() and not r.failed
            and getattr(kept.get((r.question_id, r.sample)), "prediction", None) != r.prediction]
    manifest = path.with_suffix(".json")
    saved = json.loads(manifest.read_text()) if manifest.exists() else {}
    saved.update({"judge_model": name, "judge": to_plain(judge), "prompt": judge.task})
    if todo:
        llm = build_named_llm(judge_llm) if isinstance(judge_llm, str) else judge_llm
        identity = str(getattr(llm, "identity", name))
        if saved.get("model_identity", identity) != identity:  # the same spec, other weights behind it
            raise ConfigError(f"the judge {name} is now {identity}, but its verdicts in {path} came from "
                              f"{saved['model_identity']}: remove that file to judge anew, or name the judge "
                              "differently")
        saved["model_identity"] = identity
    manifest.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    path.touch()
    if not todo:
        return path
    inputs = {str(i): {"question": r.trace.question, "golds": GOLD_SEPARATOR.join(r.golds),
                       "prediction": r.prediction} for i, r in enumerate(todo)}
    questions = [Question(str(i), r.trace.question) for i, r in enumerate(todo)]  # the audit's ids: positions
    with open(path, "a", encoding="utf-8") as handle:
        def settled(i: int, trace: Trace) -> None:
            result = todo[i]
            verdict = UNJUDGED if trace.error is not None else trace.answer or UNJUDGED
            record = JudgedAnswer(result.question_id, result.prediction, verdict, trace, result.sample)
            handle.write(json.dumps(to_plain(record), ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

        run_many(AnswerAudit(inputs, judge), questions, Runtime(llm, workers=workers), window=JUDGE_WINDOW,
                 on_trace=settled)
    return path


def load_verdicts(path: Path, *, repair: bool = False) -> list[JudgedAnswer]:
    """Every complete verdict line of a file, in the order written (a line cut short by a kill is
    skipped; with `repair`, cut off the file)."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
    if repair and len(keep) != len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(keep))
    verdicts = []
    for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                verdicts.append(from_plain(JudgedAnswer, json.loads(line)))
            except (ValueError, TypeError, KeyError) as exc:
                raise DataError(f"not an answer-judge verdict: {exc}", path=str(path), line=number) from None
    return verdicts


def verdicts_for(path: Path, results: Sequence[QuestionResult]) -> list[bool | None]:
    """Each result's judged correctness: True / False from a verdict on that very prediction, False
    for no answer (a failed question, an empty prediction), None when the judge gave no verdict
    (unjudged, a failed request) or has not judged it yet."""
    latest = {(v.question_id, v.sample): v for v in load_verdicts(path)}
    out: list[bool | None] = []
    for r in results:
        if r.failed or not r.prediction.strip():
            out.append(False)
            continue
        v = latest.get((r.question_id, r.sample))
        if v is None or v.prediction != r.prediction or v.verdict not in (CORRECT, INCORRECT):
            out.append(None)
        else:
            out.append(v.verdict == CORRECT)
    return out


@dataclass(frozen=True)
class JudgeSummary:
    """One judge over one run's answers. `accuracy`: share judged correct of all `n` answers (no answer
    and no verdict count as not correct: the denominator never shrinks). Agreement with EM and with
    cover-EM (`Acc`) is over the `judged` answers, those the judge was asked about and gave a verdict
    on: the share of equal calls and Cohen's kappa (NaN when undefined, one call throughout on both
    sides). `em_table`: (judge right & EM 1, judge right & EM 0, judge wrong & EM 1, judge wrong & EM 0).
    `judge_identity`: the judge model's identity (its weights), None before it judged anything."""

    judge_model: str
    prompt: str
    n: int
    correct: int
    judged: int
    unjudged: int
    no_answer: int
    agree_em: float
    agree_acc: float
    kappa_em: float
    kappa_acc: float
    em_table: tuple[int, int, int, int]
    judge_identity: str | None = None

    def judges_itself(self, run_identity: str | None) -> bool:
        """Whether this judge is the model whose answers it judges: the same identity as the run's once
        the options that leave the weights alone are dropped (llama.cpp's `prefix_chunk`)."""
        return bool(self.judge_identity and run_identity) and weights(self.judge_identity) == weights(run_identity)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else math.nan


def weights(identity: str) -> str:
    """A model identity without the run options that leave its weights alone (llama.cpp's
    ":prefix_chunk=N", which only changes how the prompt's states are reused)."""
    return _RUN_OPTIONS.sub("", identity)


def summarize_judge(path: Path, results: Sequence[QuestionResult]) -> JudgeSummary:
    """The judge of verdict file `path` over `results`."""
    manifest = path.with_suffix(".json")
    saved = json.loads(manifest.read_text()) if manifest.exists() else {}
    calls = verdicts_for(path, results)
    asked = [(c, r) for c, r in zip(calls, results) if c is not None and r.prediction.strip() and not r.failed]
    judge = [float(c) for c, _ in asked]
    em = [r.scores.em for _, r in asked]
    acc = [r.scores.acc for _, r in asked]
    agree = lambda xs: sum(a == b for a, b in zip(judge, xs)) / len(judge) if judge else math.nan  # noqa: E731
    table = (sum(j and e for j, e in zip(judge, em)), sum(j and not e for j, e in zip(judge, em)),
             sum(not j and e for j, e in zip(judge, em)), sum(not j and not e for j, e in zip(judge, em)))
    return JudgeSummary(
        judge_model=saved.get("judge_model", "?"), prompt=(saved.get("judge") or {}).get("prompt", "?"),
        n=len(results), correct=sum(c is True for c in calls), judged=len(asked),
        unjudged=sum(c is None for c in calls), no_answer=sum(r.failed or not r.prediction.strip() for r in results),
        agree_em=agree(em), agree_acc=agree(acc), kappa_em=cohen_kappa(judge, em), kappa_acc=cohen_kappa(judge, acc),
        em_table=tuple(int(x) for x in table), judge_identity=saved.get("model_identity"))


def unjudged_reasons(path: Path, results: Sequence[QuestionResult]) -> dict[str, int]:
    """Why answers have no verdict: `unjudged` (the reply gave none), `failed request`, `not judged yet`."""
    latest = {(v.question_id, v.sample): v for v in load_verdicts(path)}
    counts = {"unjudged reply": 0, "failed request": 0, "not judged yet": 0}
    for r in results:
        if r.failed or not r.prediction.strip():
            continue
        v = latest.get((r.question_id, r.sample))
        if v is None or v.prediction != r.prediction:
            counts["not judged yet"] += 1
        elif v.trace.error is not None:
            counts["failed request"] += 1
        elif v.verdict == UNJUDGED:
            counts["unjudged reply"] += 1
    return counts


def judge_steps(verdict: JudgedAnswer) -> list[Judge]:
    """The Judge steps of one verdict's trace (the answer judge's, with any fallback it recorded)."""
    return [s for s in verdict.trace.steps if isinstance(s, Judge) and s.name == AnswerJudge.name]


def format_answer_judges(runs: Sequence[Any]) -> str:
    """Each run's answer judges (every verdict file in its folder): which model judged (SELF_MARK where it
    is the run's own model, judging its own answers), judged accuracy, agreement and Cohen's kappa with
    EM and cover-EM, and the judge-versus-EM counts; '' when no run has one."""
    lines = []
    own = False
    for run in runs:
        for path in judge_files(run.path):
            s = summarize_judge(path, run.results)
            why = unjudged_reasons(path, run.results)
            missing = ", ".join(f"{v} {k}" for k, v in why.items() if v)
            itself = s.judges_itself(run.manifest.get("model_identity"))
            own |= itself
            named = (f"{s.judge_model}: {model_name(s.judge_identity)}"  # a spec ("embedded"): the model behind it
                     if s.judge_identity and s.judge_identity != s.judge_model else s.judge_model)
            lines.append(f"| {run.name} | {named}{SELF_MARK if itself else ''} | {s.prompt} "
                         f"| {_pct(s.accuracy)} | {s.judged} "
                         f"| {s.unjudged}{' (' + missing + ')' if missing else ''} | {s.no_answer} "
                         f"| {_pct(s.agree_em)} | {_num(s.kappa_em)} | {_pct(s.agree_acc)} | {_num(s.kappa_acc)} "
                         f"| {' / '.join(map(str, s.em_table))} |")
    if not lines:
        return ""
    return "\n".join(["### LLM-as-judge accuracy", "",
                      "| run | judge | prompt | judged acc | judged | no verdict | no answer | agree EM | κ EM "
                      "| agree Acc | κ Acc | judge+EM+ / judge+EM− / judge−EM+ / judge−EM− |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|", *lines, "",
                      "judged acc: share of all answers the judge called correct (no answer and no verdict count "
                      "as not correct); agreement and Cohen's κ with EM and cover-EM (Acc) over the judged answers."
                      + (f" {SELF_MARK.strip()}: the judge is the run's own model (the same identity), judging its own "
                         "answers." if own else "")])


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}%"


def _num(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"
