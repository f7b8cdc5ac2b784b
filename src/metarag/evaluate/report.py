"""`metarag report`: tables over finished runs, paired significance, verdict breakdowns, plots.

Every figure is computed from the per-question results a run wrote; nothing is kept on the side.
"""
from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metarag.errors import ConfigError, DataError
from metarag.evaluate.cost import Price, model_name, price_for, served_usage
from metarag.evaluate.runs import QuestionResult, RunStore
from metarag.evaluate.stats import (
    Interval,
    TestResult,
    approximate_randomization,
    holm,
    mcnemar_exact,
    mean_interval,
    paired_bootstrap,
    paired_difference_ci,
    paired_t_test,
    power_analysis,
    significance_mark,
    wilson_interval,
)
from metarag.metrics import normalize_answer, r1_searcher_accuracy, search_o1_accuracy
from metarag.records import Decide, Judge, Rerank, to_plain

# "auto": the test that fits the score, exact McNemar on 0/1 scores (EM, cover-EM), a paired permutation
# (sign flips) on continuous ones (F1); "t-test" is the MetaRAG study's choice (its Tables 1, 4 and 5)
TESTS = ("auto", "mcnemar", "t-test", "bootstrap", "randomization")
# per-question answer metrics a table compares: (row key, QuestionResult.scores field, 0/1 score?)
COMPARED = (("EM", "em", True), ("cover-EM", "acc", True), ("F1", "f1", False))
BINARY_METRICS = frozenset({"em", "acc"})
# the header names of the tests (a column says which test gave its p)
TEST_NAMES = {"mcnemar": "McNemar", "t-test": "t-test", "bootstrap": "bootstrap", "randomization": "permutation"}
CI_MODES = ("inline", "columns", "none")


@dataclass(frozen=True)
class LoadedRun:
    """A finished (or partial) run read back from its folder; a sharded run's shards merged, and
    `missing_shards` naming those that have not written their whole slice ("3/4 (not started)")."""

    name: str
    path: Path
    settings: dict
    manifest: dict
    question_ids: tuple[str, ...]
    results: tuple[QuestionResult, ...]
    missing_shards: tuple[str, ...] = ()
    samples: tuple[QuestionResult, ...] = ()  # a sampled run's every (question, sample), else empty

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.question_ids)


def load_run(path: str | Path) -> LoadedRun:
    store = RunStore(path)
    settings = store.read_json("settings.json")
    ids = tuple(store.read_json("questions.json"))
    manifest = store.read_json("manifest.json") if store.manifest_path.exists() else {}
    by_sample = store.load_samples()
    by_id = {q: r for (q, sample), r in by_sample.items() if sample == 0}
    order = {q: n for n, q in enumerate(ids)}
    sampled = () if all(sample == 0 for _, sample in by_sample) else tuple(
        r for _, r in sorted(((order[q], i), r) for (q, i), r in by_sample.items() if q in order))
    return LoadedRun(store.path.name, store.path, settings, manifest, ids,
                     tuple(by_id[i] for i in ids if i in by_id), tuple(store.missing_shards(ids, by_id)), sampled)


def summarize(run: LoadedRun, prices: dict[str, Price] | None = None) -> dict:
    """One table row: answer metrics (percent), efficiency per question and per request, cost."""
    results = run.results
    n = len(results)
    if n == 0:
        raise DataError("the run has no finished questions yet", path=str(run.path))
    usages = [r.trace.usage for r in results]
    requests = sum(u.llm_requests for u in usages)
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    # latency per request counts requests the model really served: a response-cache hit's latency is
    # a lookup's, which would make a resumed or repeated run look faster than the model is
    fresh = [s.usage for r in results for s in r.trace.steps if s.usage.llm_requests and not s.usage.cache_hits]
    llm_latency = sum(u.latency_s for u in fresh)
    # what the model served: the requests metarag's response cache answered (a repeated prompt, a
    # resumed run) left out of requests, tokens and latency; the totals above are the papers' counts
    served = [served_usage(r.trace.steps) for r in results]
    identity = run.manifest.get("model_identity") or ""
    price = price_for(identity, prices) if identity else None
    recall = [r.support_recall for r in results if r.support_recall is not None]
    first = [r.first_support_recall for r in results if r.first_support_recall is not None]
    decisions = Counter(s.name for r in results for s in r.trace.steps if isinstance(s, Decide))
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    words = [len(r.prediction.split()) for r in results]
    yes_no = [normalize_answer(r.prediction) in ("yes", "no") for r in results]
    return {
        "run": run.name,
        "method": method_label(run.settings),
        "retriever": run.settings.get("retriever") or "–",
        "reranker": (run.settings.get("reranker") or {}).get("spec", "–"),
        "model": model_name(identity) if identity else run.settings.get("llm", {}).get("backend"),
        "model identity": identity,
        "dataset": run.settings.get("dataset", {}).get("name"),
        "n": n,
        "complete": run.complete,
        "errors": sum(r.error is not None for r in results),
        # questions whose newest result is a failure (an earlier failure a retry fixed is not counted)
        "failed": sum(r.failed for r in results),
        "retryable failed": sum(r.retryable for r in results),
        "first error": next((f"{r.question_id}: {_one_line(r.error)}" for r in results if r.failed), None),
        "judge fallbacks": sum(1 for r in results for s in r.trace.steps if isinstance(s, Judge) and s.fallback),
        "rerank fallbacks": sum(1 for r in results for s in r.trace.steps if isinstance(s, Rerank) and s.fallback),
        "EM": 100 * mean([r.scores.em for r in results]),
        "F1": 100 * mean([r.scores.f1 for r in results]),
        "Prec": 100 * mean([r.scores.precision for r in results]),
        "Rec": 100 * mean([r.scores.recall for r in results]),
        "cover-EM": 100 * mean([r.scores.acc for r in results]),
        # the agentic papers' own accuracies, from each stored prediction and its golds (`--columns`)
        **{column: 100 * mean(scores) for column, scores in paper_accuracies(results).items()},
        "words/answer": mean(words),
        "yes/no": 100 * mean(yes_no),
        "req/q": requests / n,
        "served req/q": sum(u.llm_requests for u in served) / n,
        "cached req/q": sum(u.cache_hits for u in usages) / n,
        "tok/req": (prompt + completion) / requests if requests else 0.0,
        "tok/q": (prompt + completion) / n,
        "prompt tok/q": prompt / n,
        "completion tok/q": completion / n,
        "cached tok/q": sum(u.cached_tokens for u in usages) / n,
        "cache hits/q": sum(u.cache_hits for u in usages) / n,
        "served tok/q": sum(u.total_tokens for u in served) / n,
        "served prompt tok/q": sum(u.prompt_tokens for u in served) / n,
        "served completion tok/q": sum(u.completion_tokens for u in served) / n,
        "lat/req": llm_latency / len(fresh) if fresh else None,
        "lat/q": sum(u.latency_s for u in usages) / n,
        # a question's time without the cache's lookups: served requests, retrieval, judges that compute
        "served lat/q": sum(u.latency_s for u in served) / n,
        # the run's whole time as the model served it, in hours (what a table row cost on this machine)
        "served h": sum(u.latency_s for u in served) / 3600,
        "steps/q": sum(len(r.trace.steps) for r in results) / n,
        "retr/q": sum(u.retrieval_calls for u in usages) / n,
        # distinct passages, as the EvoCtx paper's Table 5 counts them (a passage retrieved again counts once)
        "passages/q": sum(len(r.trace.retrieved_ids()) for r in results) / n,
        "support recall": None if not recall else 100 * mean(recall),
        "first recall": None if not first else 100 * mean(first),
        "USD": None if price is None else price.cost(prompt, completion),
        "served USD": None if price is None else price.cost(sum(u.prompt_tokens for u in served),
                                                            sum(u.completion_tokens for u in served)),
        **{f"{name}/q": count / n for name, count in sorted(decisions.items())},
        # each method setting, so `--columns set:threshold` tells apart runs of one method
        **{f"set:{key}": value for key, value in (run.settings.get("method_settings") or {}).items()
           if isinstance(value, (str, int, float, bool))},
        **judged_columns(run),
        **sample_columns(run),
        **intervals(results, served),
    }


def intervals(results: Sequence[QuestionResult], served: Sequence) -> dict:
    """Each per-question metric's 95 % interval as "<column> lo" / "<column> hi": Wilson for the rates
    (EM, cover-EM, yes/no answers), a seeded percentile bootstrap for the means (F1, precision, recall,
    answer length, served tokens and seconds per question)."""
    n = len(results)
    out: dict = {}

    def put(column: str, ci: Interval, scale: float = 1.0) -> None:
        out[f"{column} lo"], out[f"{column} hi"] = scale * ci.low, scale * ci.high

    for column, field_name in (("EM", "em"), ("cover-EM", "acc")):
        put(column, wilson_interval(int(round(sum(getattr(r.scores, field_name) for r in results))), n), 100)
    put("yes/no", wilson_interval(sum(normalize_answer(r.prediction) in ("yes", "no") for r in results), n), 100)
    for column, scores in paper_accuracies(results).items():
        put(column, wilson_interval(int(sum(scores)), n), 100)
    for column, field_name in (("F1", "f1"), ("Prec", "precision"), ("Rec", "recall")):
        put(column, mean_interval([getattr(r.scores, field_name) for r in results]), 100)
    put("words/answer", mean_interval([len(r.prediction.split()) for r in results]))
    put("served tok/q", mean_interval([float(u.total_tokens) for u in served]))
    put("served lat/q", mean_interval([u.latency_s for u in served]))
    return out


# The accuracy each agentic paper reports where it is not cover-EM, by the paper's name (`report --columns`):
# R1-Searcher's ACC_R (every gold token among the answer's), Search-o1's (the gold a substring of the answer).
PAPER_ACCURACIES = {"Acc (R1-Searcher)": r1_searcher_accuracy, "Acc (Search-o1)": search_o1_accuracy}


def paper_accuracies(results: Sequence[QuestionResult]) -> dict[str, list[float]]:
    """Each question's score by each paper's accuracy (`PAPER_ACCURACIES`), computed from the stored
    prediction and golds, so a run written before the metric existed reads too; a failed question 0."""
    return {column: [0.0 if r.failed or not r.golds else metric(r.prediction, r.golds) for r in results]
            for column, metric in PAPER_ACCURACIES.items()}


# Shown after the default columns when a run has them: the LLM judge's accuracy and its agreement with
# EM and cover-EM (Acc), and a sampled run's avg@k / pass@k (`eval --judge-llm`, `eval --samples k`).
JUDGE_COLUMNS = ("judge acc", "judge~EM", "kappa EM", "judge~Acc", "kappa Acc")
SAMPLE_COLUMNS = ("k", "avg@k EM", "pass@k EM", "avg@k judge", "pass@k judge")


def judged_columns(run: LoadedRun) -> dict:
    """The newest answer judge's accuracy (percent of every question's answer), its agreement with EM and
    cover-EM (percent) and Cohen's kappa, over the run's answers (sample 0's of a sampled run); {} when
    no judge has judged the run. `report` prints every judge of a run below the table."""
    from metarag.evaluate.answer_judge import judge_files, summarize_judge, unjudged_reasons

    files = judge_files(run.path)
    if not files:
        return {}
    s = summarize_judge(files[-1], run.results)
    failed = unjudged_reasons(files[-1], run.results)["failed request"]  # marked on the row: see report_table

    def known(value: float, scale: float = 1.0) -> float | None:  # NaN (nothing judged, kappa undefined): "–"
        return None if math.isnan(value) else scale * value

    return {"judge": s.judge_model, "judge acc": known(s.accuracy, 100), "judge~EM": known(s.agree_em, 100),
            "kappa EM": known(s.kappa_em), "judge~Acc": known(s.agree_acc, 100), "kappa Acc": known(s.kappa_acc),
            "judge failed": failed}


def sample_columns(run: LoadedRun) -> dict:
    """A sampled run's avg@k and pass@k (percent) of EM, and of the newest answer judge's verdicts when it
    judged them: per question, avg@k the share of its n samples right, pass@k the unbiased estimator
    (`stats.pass_at_k`; with n = k, whether any sample is right), k the fewest samples any question has;
    averaged over questions. {} for a run of one answer per question."""
    if not run.samples:
        return {}
    from metarag.evaluate.answer_judge import judge_files, verdicts_for
    from metarag.evaluate.stats import pass_at_k

    by_question: dict[str, list[int]] = {}
    for n, r in enumerate(run.samples):
        by_question.setdefault(r.question_id, []).append(n)
    k = min(len(v) for v in by_question.values())
    files = judge_files(run.path)
    judged = verdicts_for(files[-1], run.samples) if files else None

    def at_k(right: list[bool]) -> tuple[float, float]:
        avg = pass_ = 0.0
        for members in by_question.values():
            c = sum(right[n] for n in members)
            avg += c / len(members)
            pass_ += pass_at_k(len(members), c, k)
        return 100 * avg / len(by_question), 100 * pass_ / len(by_question)

    row: dict = {"k": k}
    row["avg@k EM"], row["pass@k EM"] = at_k([bool(r.scores.em) for r in run.samples])
    if judged is not None:
        row["avg@k judge"], row["pass@k judge"] = at_k([v is True for v in judged])
    return row


def method_label(settings: dict) -> str | None:
    """A run's method as its report row names it: "(oracle feedback)" after a method whose settings
    give it the gold answers (Reflexion's evaluator=gold), so no table passes it off as a fair row;
    Adaptive-RAG with the router that routed it ("(LLM classifier)", or the trained router's folder
    name), since the router decides what the row measures; a method whose settings depart from its
    authors' code (`departed`: Search-o1's forced answer or greedy decoding ...) with those departures."""
    method = settings.get("method")
    own = settings.get("method_settings") or {}
    if own.get("evaluator") == "gold":
        return f"{method} (oracle feedback)"
    if method == "adaptive-rag" and own.get("classifier"):
        classifier = str(own["classifier"])
        if own.get("route", "auto") != "auto":
            return f"{method} (route {own['route']})"
        return f"{method} ({'LLM classifier' if classifier == 'llm' else 'router ' + Path(classifier).name})"
    if departures := departed(method, own):
        return f"{method} ({', '.join(departures)})"
    return method


def departed(method: str | None, own: dict) -> list[str]:
    """The labels of a run's settings that depart from its method's authors where ours differ (a
    settings field whose metadata holds a "departure" label, e.g. Search-o1's `force_answer`:
    "forced answer"), for each such setting the run's record holds off its default."""
    import dataclasses

    from metarag.methods.registry import method_settings

    try:
        defaults = method_settings(method) if method else None
    except ConfigError:
        return []
    if not dataclasses.is_dataclass(defaults):
        return []
    return [f.metadata["departure"] for f in dataclasses.fields(defaults)
            if "departure" in f.metadata and f.name in own and own[f.name] != to_plain(getattr(defaults, f.name))]


def tell_apart(rows: list[dict], runs: Sequence[LoadedRun]) -> None:
    """Rows of one method in one table (a table's `method:key=value` rows, a sweep) name the method
    settings in which their runs differ, e.g. "belief-agent (probe=True)", so no two rows read the
    same; a path is named by its last part. Rows of a method that appears once are left as they are.
    A setting a run's record lacks (the run predates it) reads as the setting's default, the behaviour
    the run had; "–" for a method this version does not know, or for a run of an older revision of the
    method (it behaved as that revision did); rows of different revisions also name it ("rev=2")."""
    groups: dict[str | None, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["method"], []).append(i)
    for label, members in groups.items():
        if len(members) < 2:
            continue
        settings = [runs[i].settings.get("method_settings") or {} for i in members]
        revisions = [runs[i].settings.get("method_revision", 1) for i in members]
        known = {k for st in settings for k in st}
        for j, i in enumerate(members):
            if missing := known - settings[j].keys():
                # an older revision's run behaved as that revision did, not as today's default
                current = revisions[j] == max(revisions)
                defaults = _defaults(runs[i].settings.get("method")) if current else {}
                settings[j] = {**{k: defaults.get(k, "–") for k in missing}, **settings[j]}
        if len(set(revisions)) > 1:
            settings = [{**st, "rev": rev} for st, rev in zip(settings, revisions)]
        keys = sorted({k for st in settings for k in st if len({repr(other.get(k)) for other in settings}) > 1})
        for i, st in zip(members, settings):
            named = ", ".join(f"{k}={_short(st.get(k))}" for k in keys)
            if named:
                rows[i]["method"] = f"{label} ({named})"


def _defaults(method: str | None) -> dict:
    """Method `method`'s default settings as a run records them (`to_plain`, as the harness writes)."""
    from metarag.methods.registry import method_settings

    try:
        return to_plain(method_settings(method)) if method else {}
    except ConfigError:
        return {}


def _short(value) -> str:
    text = str(value)
    return Path(text).name if "/" in text else text


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


def power_table(runs: Sequence[LoadedRun], baseline: int, power: float = 0.8, alpha: float = 0.05) -> str:
    """Per comparison against the baseline, what the sample could tell on EM (exact McNemar at `alpha`):
    the discordant pairs, the observed difference, the smallest difference detectable with probability
    `power` at this n and the observed discordance, and the n the observed difference would need."""
    base = runs[baseline]
    lines = [f"### Power on EM against {base.name} (exact McNemar, alpha {alpha}, power {power:.0%})", "",
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
        lines.append(f"| {run.name} | {p.n} | {test.gained + test.lost} ({test.gained} / {test.lost}) | "
                     f"{100 * p.observed:+.1f} | {detectable} | {needed} |")
    lines += ["", "Δ EM detectable: the smallest difference in EM points the test finds with that power, given "
              "the observed share of discordant questions; n for the observed Δ: the questions it would need "
              "(– where no difference was observed, or none is detectable)."]
    return "\n".join(lines)


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
    (default COLUMNS); the comparison columns follow them either way. A run with failed questions gets
    FAILED_MARK on its `failed` cell and a line under the table with the count and its first error."""
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
        parts.append("\n" + power_table(runs, baseline))
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


def _one_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
