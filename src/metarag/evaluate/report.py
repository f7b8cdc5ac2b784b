"""`metarag report`: tables over finished runs, paired significance, verdict breakdowns, plots.

Every figure is computed from the per-question results a run wrote; nothing is kept on the side. A run's
row is summary.py's, the comparisons against a baseline paired.py's; this module lays them out (and
gives their names, as before the split).
"""
from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from metarag.errors import ConfigError, DataError
from metarag.evaluate.cost import Price
from metarag.evaluate.paired import (  # noqa: F401 (report's names before the split)
    BINARY_METRICS,
    COMPARED,
    TEST_NAMES,
    TESTS,
    compare,
    paired_scores,
    power_table,
    resolve_test,
    significance,
    test_header,
)
from metarag.evaluate.stats import format_p  # noqa: F401 (report's name before the move)
from metarag.evaluate.summary import (  # noqa: F401
    JUDGE_COLUMNS,
    PAPER_ACCURACIES,
    SAMPLE_COLUMNS,
    LoadedRun,
    departed,
    intervals,
    judged_columns,
    load_run,
    method_label,
    paper_accuracies,
    sample_columns,
    summarize,
    tell_apart,
)
from metarag.records import Decide, Judge

CI_MODES = ("inline", "columns", "none")


# requests, tokens and latency both as the papers count them (all requests) and as the model served them;
# the answer-form columns (cover-EM, words/answer, yes/no) beside EM, since EM moves with an answer's form
COLUMNS = ("method", "retriever", "model", "dataset", "n", "failed", "EM", "cover-EM", "F1", "words/answer", "yes/no",
           "req/q", "served req/q", "cached req/q", "tok/req", "served tok/q", "lat/req", "served lat/q", "retr/q",
           "USD")
# columns shown with their 95 % interval in the markdown table (`--ci inline`)
CI_COLUMNS = ("EM", "cover-EM", "F1", "Prec", "Rec", "words/answer", "yes/no", "served tok/q", "served lat/q",
              *PAPER_ACCURACIES)
FAILED_MARK = " !"  # on the `failed` cell of a run with failed questions; a note under the table names them


def report_table(runs: Sequence[LoadedRun], *, baseline: int | None = 0, tests: Sequence[str] = ("auto",),
                 prices: dict[str, Price] | None = None,
                 columns: Sequence[str] | None = None, ci: str = "inline") -> tuple[str, list[dict]]:
    """A markdown table (one row per run) and the rows. Each rate and mean carries its 95 % interval
    (`ci` "inline": "40.0 (33.5–46.8)"; "columns": its own lo / hi columns; "none": the value alone; the
    rows hold "<column> lo" / "<column> hi" either way). With a baseline, each other run is compared to
    it on EM, cover-EM and F1 (`compare`): differences, raw p of each test, Holm-adjusted p, and `*`
    on a cell only where the adjusted p < 0.05. `columns` picks the table's columns among the row's keys
    (default COLUMNS, with the reranker beside the retriever where a run has one); the comparison columns
    follow them either way. A run with failed questions gets FAILED_MARK on its `failed` cell and a line
    under the table with the count and its first error."""
    if ci not in CI_MODES:
        raise ConfigError(f"unknown interval display {ci!r}; valid: {', '.join(CI_MODES)}")
    rows = [summarize(r, prices) for r in runs]
    tell_apart(rows, runs)
    if columns is not None:
        # a judge or sample column is known before any run has one: its cells show "–" until then
        unknown = [c for c in columns
                   if c not in JUDGE_COLUMNS + SAMPLE_COLUMNS and not any(c in row for row in rows)]
        if unknown:
            known = sorted({k for row in rows for k in row})
            raise ConfigError(f"unknown report column(s) {', '.join(map(repr, unknown))}; "
                              f"valid: {', '.join(known)}")
    compared: list[str] = []
    if baseline is not None and len(runs) > 1:
        compared = compare(rows, runs, baseline, tests)
    if columns is None:
        columns = list(COLUMNS) + [c for c in JUDGE_COLUMNS + SAMPLE_COLUMNS if any(c in row for row in rows)]
        if any(row["reranker"] != "–" for row in rows):  # a table that reranks says with what, beside the retriever
            columns.insert(columns.index("retriever") + 1, "reranker")
    if ci == "columns":
        columns = [x for c in columns for x in ((c, f"{c} lo", f"{c} hi") if c in CI_COLUMNS else (c,))]
    columns = list(columns) + compared
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            text = _fmt(value)
            if ci == "inline" and c in CI_COLUMNS and value is not None and f"{c} lo" in row:
                text = f"{value:.1f} ({row[c + ' lo']:.1f}–{row[c + ' hi']:.1f})"
            if c.startswith("p ") and isinstance(value, float):
                text = format_p(value)
            if c.startswith("Δ ") and value is not None:
                text = f"{value:+.1f}"
                if f"{c} lo" in row:
                    text += f" ({row[c + ' lo']:+.1f}, {row[c + ' hi']:+.1f})"
            text += row.get(f"{c}*", "")
            if c in ("n",) and not row["complete"]:
                text += " (partial)"
            if c == "failed" and row["failed"] or c == "judge acc" and row.get("judge failed"):
                text += FAILED_MARK
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"{FAILED_MARK.strip()} {row['run']}: {row['failed']} of {row['n']} questions failed "
             f"({row['retryable failed']} retryable); first: {row['first error']}" for row in rows if row["failed"]]
    notes += [f"{FAILED_MARK.strip()} {row['run']}: judge acc: the judge's requests failed on {row['judge failed']} "
              f"of {row['n']} answers, counted as not correct; re-run to ask again" for row in rows
              if row.get("judge failed")]
    notes += [incomplete_note(run) for run in runs if run.missing_shards]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines), rows


def comparison_legend(runs: Sequence[LoadedRun], baseline: int, tests: Sequence[str]) -> str:
    """The line under a compared table: its reference, its tests and its correction."""
    first = tests[0]
    how = (f"EM and cover-EM by the {test_header(first, 'em')} test, F1 by the {test_header(first, 'f1')} test"
           if first == "auto" else f"all three by the paired {test_header(first, 'f1')}")
    return (f"\nAgainst {runs[baseline].name}, on the same questions: Δ in points (F1's with a paired bootstrap "
            f"95 % CI, 10,000 resamples); p two-sided, {how}; * where p adjusted by Holm over the table's "
            f"{len(runs) - 1} comparisons (per metric) is < 0.05. Rates carry Wilson 95 % intervals, means "
            "bootstrap ones.")


def incomplete_note(run: LoadedRun) -> str:
    """The line saying a sharded run is not whole: which shards are missing, and over how many of its
    questions its row is scored."""
    shards = ", ".join(run.missing_shards)
    return (f"incomplete {run.name}: shard{'s' if len(run.missing_shards) > 1 else ''} {shards} missing, so its row "
            f"scores {len(run.results)} of {len(run.question_ids)} questions; run the missing shards to finish it")


# A judge whose one verdict takes this share of its checks decides nothing (issue 13: MetaRAG's
# sufficiency judges said "sufficient" on 41 of 41 checks); the breakdown says so on its row.
DEGENERATE_SHARE = 0.95
DEGENERATE_NOTE = "degenerate: one verdict >= 95 %"


def format_report(runs: Sequence[LoadedRun], *, baseline: int | None = 0, tests: Sequence[str] = ("auto",),
                  prices: dict[str, Price] | None = None, columns: Sequence[str] | None = None,
                  breakdowns: bool = False, types: bool = False, changes: bool = False, power: bool = False,
                  ci: str = "inline") -> tuple[str, list[dict]]:
    """What `metarag report` prints for `runs` (and `metarag experiment` for each dataset): the table,
    the line naming the reference of its paired tests, the answer judge's table where a run has one,
    each run's breakdown (`breakdowns`), the by-question-type table (`types`) and the answers each run
    changed against the baseline (`changes`), what the comparisons could detect (`power`); and the table's
    rows."""
    from metarag.evaluate.answer_judge import format_answer_judges

    table, rows = report_table(runs, baseline=baseline, tests=tuple(tests), prices=prices, columns=columns, ci=ci)
    parts = [table]
    if len(runs) > 1 and baseline is not None:
        parts.append(comparison_legend(runs, baseline, tests))
    if power and len(runs) > 1 and baseline is not None:
        parts.append("\n" + power_table(runs, baseline, names=distinct_names(rows)))
    if judges := format_answer_judges(runs):
        parts.append("\n" + judges)
    if breakdowns:
        parts += ["\n" + breakdown(run) for run in runs]
    if types:
        parts.append("\n" + by_type(runs))
    if changes and len(runs) > 1 and baseline is not None:
        parts.append("\n" + answer_changes(runs, baseline))
    return "\n".join(parts), rows


def breakdown(run: LoadedRun) -> str:
    """Counts and shares of every judge's verdicts and every decision's choices (study Table 2)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for r in run.results:
        for s in r.trace.steps:
            if isinstance(s, Judge):
                counts[("judge", s.name, s.verdict if s.name != "expert" else "(answer)")] += 1
                if s.fallback:
                    counts[("judge fallback", s.name, s.fallback.split(":")[0])] += 1
            elif isinstance(s, Decide):
                counts[("decision", s.name, s.choice)] += 1
    if not counts:
        return f"{run.name}: no judge or decision steps recorded"
    totals: Counter[tuple[str, str]] = Counter()
    for (kind, name, _), c in counts.items():
        totals[(kind, name)] += c
    lines = [f"### {run.name}", "", "| kind | name | verdict | count | % | note |", "|---|---|---|---|---|---|"]
    for (kind, name, verdict), c in sorted(counts.items()):
        share = c / totals[(kind, name)]
        note = DEGENERATE_NOTE if kind == "judge" and verdict != "(answer)" and share >= DEGENERATE_SHARE else ""
        lines.append(f"| {kind} | {name} | {verdict} | {c} | {100 * share:.1f} | {note} |")
    return "\n".join(lines)


def question_types(run: LoadedRun) -> dict[str, str]:
    """Each question's type as its dataset gives it (MuSiQue's hop count, e.g. "3hop1"; MultiHop-RAG's
    query type; HotpotQA's bridge / comparison), from the whole dataset the run names
    (`harness.run_dataset`); "(none)" where it has none."""
    from metarag.evaluate.harness import run_dataset

    dataset = run_dataset(run.settings, str(run.path / "settings.json"))
    types = {q.id: q.type or "(none)" for q in dataset.questions}
    missing = [q for q in run.question_ids if q not in types]
    if missing:
        raise DataError(f"{len(missing)} of the run's questions (first {missing[0]!r}) are not in its dataset "
                        f"{dataset.name!r} any more", path=str(run.path))
    return types


def by_type(runs: Sequence[LoadedRun], metric: str = "em") -> str:
    """A table of `metric` (percent) per question type, one row per run: where each method wins or
    loses (MuSiQue by hops, MultiHop-RAG by query type). Types come from the first run's dataset (the
    report's runs share their questions); the header gives each type's question count."""
    if not runs:
        return ""
    types = question_types(runs[0])
    order = Counter(types[q] for q in runs[0].question_ids)
    if set(order) == {"(none)"}:
        return f"{runs[0].name}: the dataset gives its questions no types"
    names = sorted(order)
    head = [f"{t} ({order[t]})" for t in names] + [f"all ({sum(order.values())})"]
    lines = [f"### {metric.upper()} by question type", "", "| method | " + " | ".join(head) + " |",
             "|---|" + "---|" * len(head)]
    labels = [{"method": method_label(run.settings) or run.name} for run in runs]
    tell_apart(labels, runs)  # the main table's row names
    for run, label in zip(runs, labels):
        scored: dict[str, list[float]] = {t: [] for t in names}
        for r in run.results:
            scored[types.get(r.question_id, "(none)")].append(getattr(r.scores, metric))
        cells = [_fmt(100 * sum(v) / len(v)) if v else "–" for v in scored.values()]
        done = [x for v in scored.values() for x in v]
        cells.append(_fmt(100 * sum(done) / len(done)) if done else "–")
        lines.append(f"| {label['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def distinct_names(rows: Sequence[dict]) -> list[str]:
    """How a table after the report names each row's run: its method, with its model where two rows share the
    method (a trained checkpoint against its base), and its run folder where those are shared too."""
    methods = [str(row["method"]) for row in rows]
    names = [f"{m} ({row['model']})" if methods.count(m) > 1 else m for m, row in zip(methods, rows)]
    return [f"{n} [{row['run']}]" if names.count(n) > 1 else n for n, row in zip(names, rows)]


def answer_changes(runs: Sequence[LoadedRun], baseline: int = 0) -> str:
    """How each run's answers differ from the baseline run's on the questions both finished: how many
    predictions changed, and of those how many went from wrong to right and from right to wrong
    (EM), with the net change in EM points; and how many changed only in form: EM moved while cover-EM
    (gold contained in the answer) did not ("Paris, France" -> "Paris"). What a fix to a method did,
    question by question."""
    base = {r.question_id: r for r in runs[baseline].results}
    lines = [f"### Answers changed against {runs[baseline].name}", "",
             "| run | shared questions | answers changed | EM 0 -> 1 | EM 1 -> 0 | net EM points | "
             "form only: EM 0 -> 1 | form only: EM 1 -> 0 | cover-EM 0 -> 1 | cover-EM 1 -> 0 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, run in enumerate(runs):
        if i == baseline:
            continue
        shared = [(base[r.question_id], r) for r in run.results if r.question_id in base]
        changed = [(b, r) for b, r in shared if b.prediction.strip() != r.prediction.strip()]
        gained = sum(b.scores.em < r.scores.em for b, r in shared)
        lost = sum(b.scores.em > r.scores.em for b, r in shared)
        net = 100 * (gained - lost) / len(shared) if shared else 0.0
        same_cover = [(b, r) for b, r in shared if b.scores.acc == r.scores.acc]
        form_gained = sum(b.scores.em < r.scores.em for b, r in same_cover)
        form_lost = sum(b.scores.em > r.scores.em for b, r in same_cover)
        cover_gained = sum(b.scores.acc < r.scores.acc for b, r in shared)
        cover_lost = sum(b.scores.acc > r.scores.acc for b, r in shared)
        lines.append(f"| {run.name} | {len(shared)} | {len(changed)} | {gained} | {lost} | {net:+.2f} | "
                     f"{form_gained} | {form_lost} | {cover_gained} | {cover_lost} |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str | Path) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    Path(path).write_text(buffer.getvalue())


def plot_runs(rows: list[dict], path: str | Path, *, x: str = "tok/req", y: str = "F1") -> Path:
    """Accuracy versus cost across runs, one labelled point per run, as a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        cost = row[x] * row["req/q"] if x == "tok/req" else row[x]
        ax.scatter(cost, row[y])
        label = row["method"] if row["retriever"] == "–" else f"{row['method']} ({row['retriever']})"
        ax.annotate(label, (cost, row[y]), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens per question" if x == "tok/req" else x)
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_sweep(values: Sequence, rows: list[dict], path: str | Path, key: str,
               metrics: Sequence[str] = ("EM", "F1")) -> Path:
    """Metrics versus a swept setting, as a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for metric in metrics:
        ax.plot([str(v) for v in values], [row[metric] for row in rows], marker="o", label=metric)
    ax.set_xlabel(key)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        from metarag.errors import MissingDependency

        raise MissingDependency("matplotlib", "eval") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) < 0.01 and value != 0:
            return f"{value:.2g}"
        return f"{value:.2f}"
    return str(value)
