"""Paired comparisons of runs over the same questions: each run against a baseline on EM, cover-EM and F1
(the test that fits the score, Holm-corrected across the table) and what the sample could detect."""
from __future__ import annotations

from collections.abc import Sequence

from metarag.errors import ConfigError, DataError
from metarag.evaluate.stats import (
    TestResult,
    approximate_randomization,
    format_p,
    holm,
    mcnemar_exact,
    paired_bootstrap,
    paired_difference_ci,
    paired_t_test,
    power_analysis,
    significance_mark,
)
from metarag.evaluate.summary import LoadedRun, method_label

# "auto": the test that fits the score, exact McNemar on 0/1 scores (EM, cover-EM), a paired permutation
# (sign flips) on continuous ones (F1); "t-test" is the MetaRAG study's choice (its Tables 1, 4 and 5)
TESTS = ("auto", "mcnemar", "t-test", "bootstrap", "randomization")
# per-question answer metrics a table compares: (row key, QuestionResult.scores field, 0/1 score?)
COMPARED = (("EM", "em", True), ("cover-EM", "acc", True), ("F1", "f1", False))
BINARY_METRICS = frozenset({"em", "acc"})
# the header names of the tests (a column says which test gave its p)
TEST_NAMES = {"mcnemar": "McNemar", "t-test": "t-test", "bootstrap": "bootstrap", "randomization": "permutation"}


def paired_scores(baseline: LoadedRun, other: LoadedRun, metric: str,
                  partial: bool = False) -> tuple[list[float], list[float]]:
    """Per-question scores of two runs over the same questions, aligned by question id: (other's,
    baseline's). Both runs must be finished, unless `partial`: then the questions both have finished
    (a table of rows still running compares what it can)."""
    if set(baseline.question_ids) != set(other.question_ids):
        raise DataError(f"runs {baseline.name} and {other.name} are over different question sets "
                        f"({len(baseline.question_ids)} vs {len(other.question_ids)} questions); "
                        "significance needs the same questions")
    if not partial and not (baseline.complete and other.complete):
        raise DataError(f"run {baseline.name if not baseline.complete else other.name} is not finished: "
                        "resume it before testing significance")
    a = {r.question_id: getattr(r.scores, metric) for r in baseline.results}
    b = {r.question_id: getattr(r.scores, metric) for r in other.results}
    shared = [i for i in baseline.question_ids if i in a and i in b]
    if not shared:
        raise DataError(f"runs {baseline.name} and {other.name} have no finished question in common yet")
    return [b[i] for i in shared], [a[i] for i in shared]


def resolve_test(test: str, metric: str) -> str:
    """The test `test` means for `metric`: "auto" is the exact McNemar test on a 0/1 score and the
    paired permutation test on a continuous one; McNemar on a continuous score is a ConfigError."""
    if test not in TESTS:
        raise ConfigError(f"unknown test {test!r}; valid: {', '.join(TESTS)}")
    if test == "auto":
        return "mcnemar" if metric in BINARY_METRICS else "randomization"
    if test == "mcnemar" and metric not in BINARY_METRICS:
        raise ConfigError(f"the exact McNemar test is for 0/1 scores (em, acc), not {metric!r}")
    return test


def significance(baseline: LoadedRun, other: LoadedRun, metric: str, test: str = "auto",
                 n_resamples: int = 10_000, seed: int = 0, partial: bool = False) -> TestResult:
    """Paired test of `other` against `baseline` on one per-question metric (em, acc, f1, ...); `test`
    as `resolve_test` reads it; `partial`: over the questions both have finished."""
    test = resolve_test(test, metric)
    mine, theirs = paired_scores(baseline, other, metric, partial)
    if test == "mcnemar":
        result = mcnemar_exact(mine, theirs)
        return TestResult(statistic=float(result.gained - result.lost), p_value=result.p_value,
                          mean_diff=result.mean_diff, n=result.n)
    if test == "t-test":
        return paired_t_test(mine, theirs)
    if test == "bootstrap":
        return paired_bootstrap(mine, theirs, n_resamples=n_resamples, seed=seed)
    return approximate_randomization(mine, theirs, n_resamples=n_resamples, seed=seed)


def test_header(test: str, metric: str) -> str:
    """How a p-value column names its test, e.g. "McNemar", "permutation", "t-test"."""
    return TEST_NAMES[resolve_test(test, metric)]


def compare(rows: list[dict], runs: Sequence[LoadedRun], baseline: int, tests: Sequence[str]) -> list[str]:
    """Each run against the baseline run on EM, cover-EM and F1: the difference in points (F1's with its
    paired bootstrap 95 % CI), the p of each test in `tests`, and the first test's p adjusted by Holm
    over the table's comparisons, one family per metric; `<metric>*` is "*" where the adjusted p < 0.05.
    A run not finished (or a baseline not finished) is compared on the questions both have finished, and
    its row's "pairs" says on how many. Returns the names of the columns added, in table order."""
    base = runs[baseline]
    others = [i for i in range(len(runs)) if i != baseline]
    added: list[str] = []
    rows[baseline]["vs"] = "reference"
    partial = not all(run.complete for run in runs)
    for column, metric, binary in COMPARED:
        first = test_header(tests[0], metric)
        raw = []
        for i in others:
            mine, theirs = paired_scores(base, runs[i], metric, partial=True)
            rows[i]["vs"] = base.name
            rows[i]["pairs"] = len(mine)
            rows[i][f"Δ {column}"] = 100 * (sum(mine) - sum(theirs)) / len(mine)
            if not binary:
                ci = paired_difference_ci(mine, theirs)
                rows[i][f"Δ {column} lo"], rows[i][f"Δ {column} hi"] = 100 * ci.low, 100 * ci.high
            for test in tests:
                rows[i][f"p {column} ({test_header(test, metric)})"] = significance(
                    base, runs[i], metric, test, partial=True).p_value
            raw.append(rows[i][f"p {column} ({first})"])
        for i, adjusted in zip(others, holm(raw)):
            rows[i][f"p {column} (Holm)"] = adjusted
            rows[i][f"{column}*"] = significance_mark(adjusted)
        added += [f"Δ {column}"] + list(dict.fromkeys(f"p {column} ({test_header(t, metric)})" for t in tests))
        added.append(f"p {column} (Holm)")
    return (["pairs"] if partial else []) + added


def power_table(runs: Sequence[LoadedRun], baseline: int, power: float = 0.8, alpha: float = 0.05,
                names: Sequence[str] | None = None) -> str:
    """Per comparison against the baseline, what the sample could tell on EM (exact McNemar at `alpha`):
    the discordant pairs, the observed difference, the smallest difference detectable with probability
    `power` at this n and the observed discordance, and the n the observed difference would need. `names`:
    how the table names each run (its report row's method; default the run folders' names)."""
    names = list(names) if names is not None else [run.name for run in runs]
    base = runs[baseline]
    lines = [f"### Power on EM against {names[baseline]} (exact McNemar, alpha {alpha}, power {100 * power:.0f} %)", "",
             "| run | n | discordant (gained / lost) | Δ EM observed | Δ EM detectable | n for the observed Δ |",
             "|---|---:|---:|---:|---:|---:|"]
    for i, run in enumerate(runs):
        if i == baseline:
            continue
        mine, theirs = paired_scores(base, run, "em", partial=True)
        test = mcnemar_exact(mine, theirs)
        p = power_analysis(test.gained, test.lost, test.n, power=power, alpha=alpha)
        detectable = "–" if p.detectable is None else f"±{100 * p.detectable:.1f}"
        needed = "–" if p.n_needed is None else str(p.n_needed)
        lines.append(f"| {names[i]} | {p.n} | {test.gained + test.lost} ({test.gained} / {test.lost}) | "
                     f"{100 * p.observed:+.1f} | {detectable} | {needed} |")
    lines += ["", "Δ EM detectable: the smallest difference in EM points the test finds with that power, given "
              "the observed share of discordant questions; n for the observed Δ: the questions it would need "
              "(– where no difference was observed, or none is detectable)."]
    return "\n".join(lines)


# What a claim that the reference row beats the claimed rows on EM comes to (`verdict`), from the outcomes
# of its comparisons: every claimed row beaten; one beating the reference; some beaten, none beating it.
VERDICTS = {"all": "reproduced", "lost": "refuted", "some": "partly reproduced", "none": "inconclusive at this power"}


def row_name(run: LoadedRun) -> str:
    """How a verdict names a run: its method as the report's row does."""
    return method_label(run.settings) or str(run.settings.get("method") or run.name)


def verdict(runs: Sequence[LoadedRun], baseline: int, claimed: Sequence[int], *, dataset: str = "",
            missing: Sequence[str] = (), power: float = 0.8, alpha: float = 0.05,
            names: Sequence[str] | None = None) -> str:
    """A paper's claim that its method (the table's reference row, `baseline`) beats the `claimed` rows, read
    off the table: per claimed row, the reference's EM minus the row's, the exact McNemar p and its Holm
    adjustment over all the table's comparisons against the reference (the family `compare` corrects, so
    the verdict and the table's `*` agree), and the smallest difference the test would detect at `power`
    with the observed discordance. "reproduced" when the reference beats every claimed row (adjusted
    p < `alpha`); "refuted" when a claimed row beats the reference; "partly reproduced" when it beats some
    and no difference is found against the rest; "inconclusive at this power" when no difference is found
    (each comparison says what it could have detected). Rows still running, or claimed rows without a
    run yet (`missing`), make it provisional. `names`: what to call each run (default `row_name`, its
    method: runs of one method, a trained checkpoint against its base, need names of their own)."""
    if names is not None and len(names) != len(runs):
        raise ConfigError(f"verdict: {len(names)} names for {len(runs)} runs")
    label = (lambda i: names[i]) if names is not None else (lambda i: row_name(runs[i]))  # noqa: E731
    base = runs[baseline]
    others = [i for i in range(len(runs)) if i != baseline]
    if not claimed and not missing:
        raise ConfigError("a verdict needs the rows the reference is claimed to beat")
    tests = {i: mcnemar_exact(*paired_scores(base, runs[i], "em", partial=True)) for i in others}
    adjusted = dict(zip(others, holm([tests[i].p_value for i in others])))
    lines, beaten, lost = [], [], []
    for i in claimed:
        test = tests[i]  # a: the claimed row, b: the reference; gained = the row right where the reference is not
        diff = 100 * (test.lost - test.gained) / test.n
        seen = power_analysis(test.gained, test.lost, test.n, power=power, alpha=alpha)
        if adjusted[i] < alpha:
            (beaten if diff > 0 else lost).append(label(i))
        outcome = ("beats" if diff > 0 else "loses to") if adjusted[i] < alpha else "no significant difference from"
        detectable = "none" if seen.detectable is None else f"±{100 * seen.detectable:.1f}"
        lines.append(f"- {outcome} {label(i)}: Δ EM {diff:+.1f} points on {test.n} questions (reference "
                     f"right alone on {test.lost}, the row alone on {test.gained}); exact McNemar p "
                     f"{format_p(test.p_value)}, Holm {format_p(adjusted[i])}; detectable at {100 * power:.0f} % "
                     f"power: {detectable}")
    lines += [f"- {name}: no run yet" for name in missing]
    word = VERDICTS["lost" if lost else "all" if len(beaten) == len(claimed) and claimed else
                    "some" if beaten else "none"]
    running = [label(i) for i, r in enumerate(runs) if not r.complete]
    provisional = running or missing
    head = (f"**Verdict{' on ' + dataset if dataset else ''}** (EM; {label(baseline)} against the rows the paper "
            f"claims it beats; Holm over the table's {len(others)} comparisons): **{word}**")
    if provisional:
        head += " — provisional: " + "; ".join(
            ([f"still running: {', '.join(running)}"] if running else []) + ([f"not run yet: {', '.join(missing)}"]
                                                                             if missing else []))
    return "\n".join([head, *lines])
