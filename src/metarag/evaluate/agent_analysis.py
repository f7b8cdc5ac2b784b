"""The belief-action paper's measures of a search agent's finished run (Qi et al., 2026, §4, Figure 3,
Table 8): Acc (EM), searches per question, the belief-based over- and under-search rates (runs with
the probe on) and the under-search rate an external LLM judge gives (Appendix G). All of it is read
from the traces (`policy.agent_trace.agent_steps`); `format_agent_analysis` is what
`metarag report RUN --analysis agent` prints.

The judge runs through the runner like any model call (`judges.under_search.UnderSearchAudit` over
`run_many`), only when asked (`--judge-llm SPEC`); its traces are kept in the run folder,
`under-search-<id>.jsonl` with `under-search-<id>.json` naming the judge model, so a later report
shows them without asking again, and a re-judge asks only about questions not judged yet.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import DataError
from metarag.evaluate.report import LoadedRun
from metarag.judges.under_search import (
    NOT_UNDER_SEARCH,
    UNDER_SEARCH,
    UNDER_SEARCH_TASK,
    UnderSearchAudit,
    UnderSearchJudge,
    under_search_inputs,
)
from metarag.policy.agent_trace import ANSWER, INVALID, SEARCH, AgentStep, agent_steps, gap_rates
from metarag.records import Judge, Question, Retrieve, Trace, to_plain
from metarag.settings import settings_hash

JUDGE_PREFIX = "under-search-"


def run_steps(run: LoadedRun) -> list[tuple[AgentStep, ...]]:
    """Each question's agent steps, in run order (empty for a question of another method)."""
    out = []
    for r in run.results:
        try:
            out.append(agent_steps(r.trace))
        except DataError as exc:
            raise DataError(f"run {run.name}: {exc}", path=str(run.path)) from None
    return out


def agent_summary(run: LoadedRun, margin: float = 0.0) -> dict[str, Any]:
    """One run's row: questions, Acc (mean EM, %, the paper's "Acc."), searches (an agent's SEARCH
    actions; a baseline's retrieval calls), invalid actions and
    forced answers per question, the share of questions ending with an ANSWER step, and the
    belief-based rates (NaN without probed steps) with their step counts."""
    n = len(run.results)
    if n == 0:
        raise DataError("the run has no finished questions yet", path=str(run.path))
    steps = run_steps(run)
    rates = gap_rates(steps, margin)
    flat = [s for trajectory in steps for s in trajectory]
    agent = any(steps)
    # a baseline row beside the agents (Standard RAG) searches too: its retrieval calls count as searches
    searches = (sum(s.action == SEARCH for s in flat) if agent
                else sum(isinstance(step, Retrieve) for r in run.results for step in r.trace.steps))
    return {"run": run.name, "method": run.settings.get("method"), "n": n,
            "acc": 100 * sum(r.scores.em for r in run.results) / n,
            "searches": searches / n,
            "invalid": sum(s.action == INVALID for s in flat) / n,
            "forced": sum(s.forced for s in flat) / n,
            "answered": sum(bool(t) and t[-1].action == ANSWER for t in steps) / n,
            "agent": agent, "margin": margin,
            "under_search_rate": rates.under_search_rate, "over_search_rate": rates.over_search_rate,
            "answer_steps": rates.answer_steps, "search_steps": rates.search_steps, "unprobed": rates.unprobed}


# ------------------------------------------------------------------------------- the judge
@dataclass(frozen=True)
class JudgedRate:
    """The judge's verdicts over a run: under-search share of the judged answers (NaN if none),
    with how many were judged, how many were not (an unreadable reply or a failed request) and
    which trajectories had no final answer to judge. `groups`: (group, under-search, judged) for the
    judged answers split by trajectory (GROUPS: searched or not, answer right or wrong by EM), the
    check of what the judge measures: one that measures under-search flags wrong answers given
    without searching most, and a right answer from retrieved evidence least."""

    judge_model: str
    judged: int
    under_search: int
    unjudged: int
    no_answer: int
    groups: tuple[tuple[str, int, int], ...] = ()

    @property
    def rate(self) -> float:
        return self.under_search / self.judged if self.judged else math.nan


GROUPS = ("searched", "never searched", "right (EM)", "wrong")


def judge_files(run: LoadedRun) -> list[Path]:
    """The judge verdict files kept in the run folder, in name order."""
    return sorted(run.path.glob(f"{JUDGE_PREFIX}*.jsonl"))


def judge_id(model_identity: str, judge: UnderSearchJudge) -> str:
    """The id of one judge set-up: its model, its settings and its prompt."""
    return settings_hash(model_identity, judge, UNDER_SEARCH_TASK)


def judge_run(run: LoadedRun, llm: Any, judge: UnderSearchJudge = UnderSearchJudge(), *,
              workers: int = 1) -> Path:
    """Judge every final ANSWER step of `run` with `llm` (the runner's loop, `run_many`), keeping the
    verdicts of questions judged before by the same set-up; returns the verdict file."""
    from metarag.methods.runner import Runtime, run_many

    identity = str(getattr(llm, "identity", type(llm).__name__))
    path = run.path / f"{JUDGE_PREFIX}{judge_id(identity, judge)}.jsonl"
    kept = {t.question_id: t for t in _load_traces(path) if t.error is None}
    inputs = {}
    for r in run.results:
        found = under_search_inputs(r.trace, r.golds)
        if found is not None and r.question_id not in kept:
            inputs[r.question_id] = found
    if inputs:
        questions = [Question(qid, values["question"]) for qid, values in inputs.items()]
        traces = run_many(UnderSearchAudit(inputs, judge), questions, Runtime(llm, workers=workers))
        kept.update((t.question_id, t) for t in traces)
    order = {r.question_id: i for i, r in enumerate(run.results)}
    lines = [kept[q].to_json() for q in sorted(kept, key=lambda q: order.get(q, len(order)))]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps({"judge_model": identity, "judge": to_plain(judge)}, indent=1))
    return path


def _load_traces(path: Path) -> list[Trace]:
    if not path.exists():
        return []
    traces = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                traces.append(Trace.from_json(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"not a judge trace: {exc}", path=str(path), line=number) from None
    return traces


def judged_rate(run: LoadedRun, path: Path) -> JudgedRate:
    """The judged under-search rate of `run` from one verdict file."""
    manifest = path.with_suffix(".json")
    model = json.loads(manifest.read_text())["judge_model"] if manifest.exists() else "?"
    verdicts = {}
    for trace in _load_traces(path):
        judges = [s for s in trace.steps if isinstance(s, Judge) and s.name == UnderSearchJudge.name]
        verdicts[trace.question_id] = judges[-1].verdict if judges and trace.error is None else None
    judged = under = unjudged = no_answer = 0
    groups = {name: [0, 0] for name in GROUPS}
    for r in run.results:
        if under_search_inputs(r.trace, r.golds) is None:
            no_answer += 1
            continue
        verdict = verdicts.get(r.question_id)
        if verdict in (UNDER_SEARCH, NOT_UNDER_SEARCH):
            judged += 1
            under += verdict == UNDER_SEARCH
            searched = any(True for _ in r.trace.retrieval_rounds())
            for name in (GROUPS[0] if searched else GROUPS[1], GROUPS[2] if r.scores.em else GROUPS[3]):
                groups[name][0] += verdict == UNDER_SEARCH
                groups[name][1] += 1
        else:
            unjudged += 1
    return JudgedRate(model, judged, under, unjudged, no_answer,
                      tuple((name, u, n) for name, (u, n) in groups.items()))


# ---------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class SearchByKnowledge:
    """A run's searches per question on the questions the model does not know (its closed-book answer
    is wrong, EM 0) and on those it does, and the difference with a bootstrap 95 % interval (the two
    groups resampled on their own, `stats.mean_shift`): the belief-action paper's claim is that an
    aligned agent searches when it does not know."""

    run: str
    unknown: int
    known: int
    searches_unknown: float
    searches_known: float
    difference: float
    low: float
    high: float


def search_by_knowledge(run: LoadedRun, closed_book: LoadedRun) -> SearchByKnowledge:
    """`SearchByKnowledge` of an agent run, split by a closed-book run of the same model over the same
    questions (the questions both finished)."""
    from metarag.evaluate.stats import mean_shift

    knows = {r.question_id: bool(r.scores.em) for r in closed_book.results}
    counts = _searches(run)
    shared = [q for q in run.question_ids if q in knows and q in counts]
    unknown = [float(counts[q]) for q in shared if not knows[q]]
    known = [float(counts[q]) for q in shared if knows[q]]
    if not unknown or not known:
        raise DataError(f"{run.name}: the closed-book run {closed_book.name} knows {'all' if not unknown else 'none'} "
                        f"of the {len(shared)} shared questions: nothing to split")
    shift = mean_shift(known, unknown)
    return SearchByKnowledge(run.name, len(unknown), len(known), sum(unknown) / len(unknown),
                             sum(known) / len(known), shift.diff, shift.low, shift.high)


@dataclass(frozen=True)
class AlignmentShift:
    """How much more a run's searches lean toward the questions the model does not know than a
    baseline run's, on the same questions: the run's gap (searches per question on the questions the
    closed-book model gets wrong, minus those on the questions it gets right) minus the baseline's gap.
    Positive: the run searches where the model does not know more selectively than the baseline (the
    belief-action paper's claim for its consistency reward against Search-R1's outcome reward). The 95 %
    interval bootstraps the questions within each of the two groups on their own (`stats.mean_shift`
    over each question's run-minus-baseline searches), so the two runs stay paired question by
    question."""

    run: str
    baseline: str
    unknown: int
    known: int
    run_gap: float
    baseline_gap: float
    difference: float
    low: float
    high: float


def _searches(run: LoadedRun) -> dict[str, float]:
    return {r.question_id: float(sum(s.action == SEARCH for s in agent_steps(r.trace))) for r in run.results}


def alignment_shift(run: LoadedRun, baseline: LoadedRun, closed_book: LoadedRun) -> AlignmentShift:
    """`AlignmentShift` of `run` against `baseline`, both split by one closed-book run of the untrained
    model over the same questions (the questions all three finished)."""
    from metarag.evaluate.stats import mean_shift

    knows = {r.question_id: bool(r.scores.em) for r in closed_book.results}
    mine, theirs = _searches(run), _searches(baseline)
    shared = [q for q in run.question_ids if q in knows and q in mine and q in theirs]
    unknown = [q for q in shared if not knows[q]]
    known = [q for q in shared if knows[q]]
    if not unknown or not known:
        raise DataError(f"{run.name}: the closed-book run {closed_book.name} knows {'all' if not unknown else 'none'} "
                        f"of the {len(shared)} questions it shares with {baseline.name}: nothing to split")
    mean = lambda counts, ids: sum(counts[q] for q in ids) / len(ids)  # noqa: E731
    shift = mean_shift([mine[q] - theirs[q] for q in known], [mine[q] - theirs[q] for q in unknown])
    return AlignmentShift(run.name, baseline.name, len(unknown), len(known),
                          mean(mine, unknown) - mean(mine, known), mean(theirs, unknown) - mean(theirs, known),
                          shift.diff, shift.low, shift.high)


def alignment_table(shifts: Sequence[AlignmentShift]) -> str:
    """`AlignmentShift`s as a markdown table, with its legend."""
    lines = ["### Searches where the model does not know: run against run", "",
             "Gap: searches per question on the questions the closed-book model gets wrong minus on those it gets "
             "right. Difference: the run's gap minus the other's (positive: the run's searches lean more toward what "
             "the model does not know), with a bootstrap 95 % CI over questions within each group, paired across "
             "the two runs (10,000 resamples).", "",
             "| run | against | unknown | known | run's gap | other's gap | difference | 95 % CI |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r.run} | {r.baseline} | {r.unknown} | {r.known} | {r.run_gap:+.2f} | {r.baseline_gap:+.2f} | "
              f"{r.difference:+.2f} | {r.low:+.2f}, {r.high:+.2f} |" for r in shifts]
    return "\n".join(lines)


def format_alignment_shift(runs: Sequence[LoadedRun], baseline: int, closed_book: LoadedRun) -> str:
    """The `AlignmentShift` table of every run against `runs[baseline]`."""
    return alignment_table([alignment_shift(run, runs[baseline], closed_book)
                            for i, run in enumerate(runs) if i != baseline])


def format_search_by_knowledge(runs: Sequence[LoadedRun], closed_book: LoadedRun) -> str:
    rows = [search_by_knowledge(run, closed_book) for run in runs]
    lines = [f"### Searches by what the model knows (closed book: {closed_book.name})", "",
             "| run | unknown (CB wrong) | known (CB right) | searches/q unknown | searches/q known | "
             "difference | 95 % CI |", "|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r.run} | {r.unknown} | {r.known} | {r.searches_unknown:.2f} | {r.searches_known:.2f} | "
              f"{r.difference:+.2f} | {r.low:+.2f}, {r.high:+.2f} |" for r in rows]
    return "\n".join(lines)


def format_agent_analysis(runs: Sequence[LoadedRun], margin: float = 0.0) -> str:
    """The agent table of the runs, then each run's judged under-search rates (from its verdict files)."""
    rows = [agent_summary(run, margin) for run in runs]
    lines = ["### Search-agent analysis", "",
             "| run | method | n | Acc (EM) | searches/q | invalid/q | forced/q | belief over-search "
             "| belief under-search | judged under-search |", "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    checks = []
    for run, row in zip(runs, rows):
        judged = [judged_rate(run, path) for path in judge_files(run)]
        checks += [f"| {row['run']} | {j.judge_model} | "
                   + " | ".join(f"{u} of {n}" for _, u, n in j.groups) + " |" for j in judged]
        judged_cell = "; ".join(f"{_pct(j.rate)} of {j.judged} ({j.judge_model})" for j in judged) or "–"
        over = f"{_pct(row['over_search_rate'])} of {row['search_steps']}" if row["search_steps"] else "–"
        under = f"{_pct(row['under_search_rate'])} of {row['answer_steps']}" if row["answer_steps"] else "–"
        lines.append(f"| {row['run']} | {row['method']} | {row['n']} | {row['acc']:.1f} | {row['searches']:.2f} "
                     f"| {row['invalid']:.2f} | {row['forced']:.2f} | {over} | {under} | {judged_cell} |")
        if not row["agent"]:
            notes.append(f"{row['run']}: no search-agent steps (not a search-r1 / belief-agent run)")
        elif not row["answer_steps"] and not row["search_steps"]:
            notes.append(f"{row['run']}: not probed; belief-based rates need --set probe=true")
        for j in judged:
            if j.unjudged or j.no_answer:
                notes.append(f"{row['run']}: judge {j.judge_model}: {j.unjudged} answers unjudged (no verdict or "
                             f"a failed request), {j.no_answer} trajectories without a final answer")
        if row["agent"] and not judged:
            notes.append(f"{row['run']}: no judged under-search rate yet (add --judge-llm SPEC)")
    lines += ["", f"Belief-based rates at margin m = {margin:g}: over-search = share of SEARCH steps with b > m, "
                  "under-search = share of ANSWER steps with b < −m (probed steps, pooled over questions). "
                  "Judged: share of final answers the external judge says needed another search (Appendix G)."]
    if checks:
        lines += ["", "Judged under-search by trajectory (what the judge measures: one that measures under-search "
                      "flags wrong answers given without searching most):", "",
                  "| run | judge | " + " | ".join(GROUPS) + " |", "|---|---|" + "---|" * len(GROUPS)] + checks
    if notes:
        lines += [""] + notes
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}%"
