"""One row of a report per run: a run folder read back (`load_run`) and summarized (`summarize`: answer
metrics with their intervals, cost per question and per request, the judge's and the samples' columns),
its method named so that rows of one method tell apart."""
from __future__ import annotations

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
    mean_interval,
    wilson_interval,
)
from metarag.metrics import normalize_answer, r1_searcher_accuracy, search_o1_accuracy
from metarag.records import Decide, Judge, Rerank, to_plain


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
    """One answer judge's accuracy (percent of every question's answer), its agreement with EM and
    cover-EM (percent) and Cohen's kappa, over the run's answers (sample 0's of a sampled run); {} when
    no judge has judged the run. The judge is the newest one with the default prompt
    (`AnswerJudge().prompt`) when the run has one, else the newest: a run judged again with another
    prompt (the agentic table's runs were re-judged with `agentic-rag`) keeps the column comparable with
    the other rows of its table, whichever file a checkout happened to touch last. The "judge" column
    names the model and the prompt; `report` prints every judge of a run below the table."""
    from metarag.evaluate.answer_judge import judge_files, summarize_judge, unjudged_reasons
    from metarag.judges.correctness import AnswerJudge

    files = judge_files(run.path)
    if not files:
        return {}
    summaries = [(path, summarize_judge(path, run.results)) for path in files]
    default = [(path, s) for path, s in summaries if s.prompt == AnswerJudge().prompt]
    path, s = (default or summaries)[-1]
    failed = unjudged_reasons(path, run.results)["failed request"]  # marked on the row: see report_table

    def known(value: float, scale: float = 1.0) -> float | None:  # NaN (nothing judged, kappa undefined): "–"
        return None if math.isnan(value) else scale * value

    return {"judge": f"{s.judge_model} ({s.prompt})", "judge acc": known(s.accuracy, 100),
            "judge~EM": known(s.agree_em, 100), "kappa EM": known(s.kappa_em),
            "judge~Acc": known(s.agree_acc, 100), "kappa Acc": known(s.kappa_acc),
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


def _one_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"
