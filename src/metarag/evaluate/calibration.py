"""`metarag calibrate-judges`: decision thresholds for MetaRAG's sufficiency judges, chosen on a run
over TRAINING questions, for a judge whose verdicts at the paper's rule (P(Yes) >= 0.5) are all one
label (study Table 2; the 1.5B model said "sufficient" on 41 of 41 checks).

Each judge's recorded P(Yes) is compared with what the judge is asked about, known on a training set:
- external sufficiency ("do the passages hold all that is needed?"): every supporting passage of the
  question is among the passages retrieved before that check;
- internal sufficiency ("can you answer from your own knowledge?"): the closed-book run over the same
  questions answers it exactly (EM), when such a run is given.
The threshold kept is the one with the highest balanced accuracy (mean of the recall of both target
classes: a judge that always says one thing scores 0.5 whatever the class balance), ties going to the
threshold nearest 0.5, the paper's rule. Candidates are the midpoints between consecutive distinct
scores, plus 0.5 itself. The run must be over training questions (`data.datasets.check_training_split`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metarag.errors import ConfigError
from metarag.metrics import support_recall
from metarag.records import Judge, Question, Retrieve, Trace

JUDGES = ("internal-sufficiency", "external-sufficiency")
SETTING = {"internal-sufficiency": "internal_threshold", "external-sufficiency": "external_threshold"}
PAPER_RULE = 0.5


@dataclass(frozen=True)
class Sample:
    """One judge check: its P(Yes) and whether the true answer to the judge's question is yes."""

    judge: str
    score: float
    target: bool


@dataclass(frozen=True)
class Calibration:
    """One judge's threshold: the paper's rule against the balanced-accuracy choice."""

    judge: str
    n: int
    positives: int
    yes_share_rule: float       # share of "sufficient" verdicts at P(Yes) >= 0.5
    balanced_rule: float
    threshold: float
    yes_share: float
    balanced: float
    note: str = ""

    @property
    def setting(self) -> str:
        return SETTING[self.judge]


def judge_samples(traces: Sequence[Trace], questions: Mapping[str, Question],
                  closed_book_em: Mapping[str, float] | None = None) -> list[Sample]:
    """Every sufficiency check of the traces with its target (see the module docstring)."""
    samples: list[Sample] = []
    for trace in traces:
        question = questions.get(trace.question_id)
        if question is None or trace.error is not None:
            continue
        seen: list[str] = []
        for step in trace.steps:
            if isinstance(step, Retrieve):
                seen += [h.passage.id for h in step.hits]
            elif isinstance(step, Judge) and step.name in JUDGES and step.score is not None:
                if step.name == "external-sufficiency":
                    recall = support_recall(seen, question.supporting_ids)
                    if recall is not None:
                        samples.append(Sample(step.name, step.score, recall == 1.0))
                elif closed_book_em is not None and trace.question_id in closed_book_em:
                    samples.append(Sample(step.name, step.score, closed_book_em[trace.question_id] == 1.0))
    return samples


def balanced_accuracy(samples: Sequence[Sample], threshold: float) -> float:
    """Mean recall of the two target classes when "yes" is P(Yes) >= threshold (0.5 with one class)."""
    pos = [s for s in samples if s.target]
    neg = [s for s in samples if not s.target]
    recalls = []
    if pos:
        recalls.append(sum(s.score >= threshold for s in pos) / len(pos))
    if neg:
        recalls.append(sum(s.score < threshold for s in neg) / len(neg))
    return sum(recalls) / len(recalls) if recalls else 0.0


def calibrate(samples: Sequence[Sample], judge: str) -> Calibration:
    """The balanced-accuracy threshold for `judge` over its samples."""
    mine = [s for s in samples if s.judge == judge]
    if not mine:
        raise ConfigError(f"no {judge} checks with a known target in the run; calibrate-judges needs a MetaRAG "
                          "run over training questions" + (" and --closed-book RUN" if judge ==
                                                           "internal-sufficiency" else ""))
    positives = sum(s.target for s in mine)
    scores = sorted({s.score for s in mine})
    candidates = {PAPER_RULE, *((a + b) / 2 for a, b in zip(scores, scores[1:]))}
    if scores:
        candidates |= {scores[0], scores[-1] + 1e-9}
    best = max(sorted(candidates), key=lambda t: (round(balanced_accuracy(mine, t), 12), -abs(t - PAPER_RULE)))
    note = ""
    if positives in (0, len(mine)):
        note = "one target class only: no threshold can be chosen, the paper's rule is kept"
        best = PAPER_RULE
    return Calibration(judge, len(mine), positives, _yes_share(mine, PAPER_RULE), balanced_accuracy(mine, PAPER_RULE),
                       round(best, 6), _yes_share(mine, best), balanced_accuracy(mine, best), note)


def calibration_table(results: Sequence[Calibration]) -> str:
    lines = ["| judge | checks | target yes | sufficient at 0.5 | bal. acc at 0.5 | threshold | sufficient at it "
             "| bal. acc at it | note |", "|---|---|---|---|---|---|---|---|---|"]
    for c in results:
        lines.append(f"| {c.judge} | {c.n} | {c.positives} | {100 * c.yes_share_rule:.1f} % | {c.balanced_rule:.3f} "
                     f"| {c.threshold:.4f} | {100 * c.yes_share:.1f} % | {c.balanced:.3f} | {c.note} |")
    return "\n".join(lines)


def _yes_share(samples: Sequence[Sample], threshold: float) -> float:
    return sum(s.score >= threshold for s in samples) / len(samples)


def calibrate_run(run_path: str, closed_book_path: str | None = None, *,
                  allow_any: bool = False) -> list[Calibration]:
    """MetaRAG's judge thresholds chosen on a finished `metarag` run over training questions (and, for
    the internal judge, a closed-book run over the same questions): `calibrate-judges`. A run folder
    that is not one, a run of another method or an evaluation split is refused before anything is read
    further (`data.datasets.check_training_split`'s rule)."""
    from pathlib import Path

    from metarag.data.datasets import check_training_split
    from metarag.evaluate.harness import run_dataset
    from metarag.evaluate.report import load_run

    for path in filter(None, [run_path, closed_book_path]):
        if not (Path(path) / "settings.json").is_file():
            raise ConfigError(f"{path!r} is not a run folder (runs/<run-id>, holding the settings.json that metarag "
                              "eval writes)")
    run = load_run(run_path)
    if run.settings.get("method") != "metarag":
        raise ConfigError(f"{run_path!r} is a {run.settings.get('method')!r} run; calibrate-judges reads a metarag run")
    dataset = run_dataset(run.settings, str(Path(run_path) / "settings.json"), sampled=True)
    check_training_split(dataset, allow_any, trained="judge thresholds are chosen")
    questions = {q.id: q for q in dataset.questions}
    closed_em = None
    if closed_book_path:
        closed_em = {r.question_id: r.scores.em for r in load_run(closed_book_path).results}
    samples = judge_samples([r.trace for r in run.results], questions, closed_em)
    return [calibrate(samples, j) for j in JUDGES if j == "external-sufficiency" or closed_em is not None]

