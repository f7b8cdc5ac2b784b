"""`metarag eval`: run a method over a dataset's questions, score each, write each result at once.

The harness drives the one runner loop (`methods.runner.run`) question by question; it adds
scoring, the run folder, resumption and concurrency, nothing method-specific. Re-running the same
command finds the same run folder (its id hashes the resolved settings) and skips what is done: a
question is done when it has a result that is not a retryable failure. Before the first question
the back-ends that can be down are checked (the judge's too); a run of consecutive retryable failures
stops the run. A run folder takes one model: one whose manifest names another is refused, not resumed.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from metarag import __version__
from metarag.errors import BackendError, ConfigError, DataError
from metarag.evaluate.config import (  # noqa: F401 (the run's description, imported from here as before)
    MAX_SAMPLES,
    DatasetSpec,
    EvalConfig,
    Samples,
    runs_dir_default,
    sample_seed,
)
from metarag.evaluate.resolve import Resolved, load_questions, resolve, run_dataset  # noqa: F401
from metarag.evaluate.runs import QuestionResult, RunStore, describe_holder
from metarag.llm.registry import BACKENDS, LLMSpec, expected_identity, make_llm, parse_llm_spec
from metarag.methods.registry import CLOSED_BOOK, build_method
from metarag.methods.runner import Method, Runtime, check_needs, run, run_many
from metarag.metrics import AnswerScores, score_answer, support_recall
from metarag.provenance import git_commit as _git_commit
from metarag.records import Question, Trace

log = logging.getLogger(__name__)
ZERO = AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0)


def prepare(config: EvalConfig):
    """Resolve a config into (run store, method, dataset, resolved settings), loading no model."""
    run = resolve(config)
    return RunStore(run.folder, config.shard), build_method(config.method, config.overrides), run.dataset, run.settings


def score(question: Question, trace: Trace, sample: int = 0) -> QuestionResult:
    """A trace (sample `sample` of the question's answers) scored against its question's gold answers
    and supporting passages."""
    rounds = trace.retrieval_rounds()
    supporting = question.supporting_ids
    first = [h.passage.id for h in rounds[0]] if rounds else []
    recall_all = support_recall(trace.retrieved_ids(), supporting)
    recall_first = support_recall(first, supporting)
    if trace.error is not None:
        return QuestionResult(question.id, question.answers, "", ZERO, recall_all, recall_first, trace,
                              trace.error, sample)
    return QuestionResult(question.id, question.answers, trace.answer or "",
                          score_answer(trace.answer or "", question.answers), recall_all, recall_first, trace,
                          sample=sample)


def evaluate(config: EvalConfig, *, progress: bool = True, llm=None, retriever=None, judge_llm=None,
             on_result: Callable[[QuestionResult], None] | None = None) -> tuple[RunStore, list[QuestionResult]]:
    """Run (or resume) the evaluation `config` describes; returns the store and every question's
    newest result in dataset order (with `config.shard`, its slice's). `llm` / `retriever` replace the
    built ones (tests, shared services), `judge_llm` the model `config.judge_llm` names (and, given,
    turns the answer judge on). With `config.samples.k` > 1 each question is answered k times, each
    answer resumable on its own; the results returned are sample 0's (`RunStore.load_samples` has all).
    The run folder is locked for the whole session: one writer per run, or per shard of a sharded run."""
    store, method, dataset, resolved = prepare(config)
    if dataset.unmapped_support:
        log.warning(f"{dataset.name}: {dataset.unmapped_support} supporting paragraphs have no passage in the pool "
                    "(support recall counts them as missed)")
    ids = [q.id for q in dataset.questions]
    if len(set(ids)) != len(ids):
        raise DataError("question ids are not unique", path=dataset.path)

    if judge_llm is not None:  # the judge is asked after the questions: a dead one fails now, not then
        check_backend(judge_llm, "judge LLM")
    elif config.judge_llm is not None:
        check_served(config.judge_llm, "judge LLM")

    def waiting(holder) -> None:
        log.info(f"waiting for {describe_holder(holder)} to finish with {store.path}")

    with store.lock(wait=config.wait, on_wait=waiting) as holder:
        with store.folder_lock():  # the shards of a run start together: one of them writes what they share
            if store.exists():
                if store.read_json("questions.json") != ids:
                    raise DataError("this run folder holds another question set; remove it or change --runs-dir",
                                    path=str(store.path))
            else:
                store.write_json("settings.json", resolved)
                store.write_json("questions.json", ids)
            store.check_layout()
        latest = store.load_samples(repair=True)  # by (question id, sample): sample 0 only unless sampled
        k = config.samples.k
        latest = {key: r for key, r in latest.items() if key[1] < k}  # a run that once had more samples
        retry = {key for key, r in latest.items() if r.failed and (config.retry_failed or r.retryable)}
        done = {key: r for key, r in latest.items() if key not in retry}
        mine = config.shard.take(dataset.questions) if config.shard else dataset.questions
        todo = [(q, i) for q in mine for i in range(k) if (q.id, i) not in done]
        if config.samples.until == "mixed":  # the questions decided already take no more samples
            seen = _outcomes(done)
            todo = [(q, i) for q, i in todo if len(seen.get(q.id, ())) < 2]
        if llm is not None:  # a model passed in: it answers whatever is left, or the run is read as its own
            check_model_identity(store, llm.identity)
        elif not todo:  # nothing to run: the model the spec builds, where that is known without loading it
            check_model_identity(store, expected_identity(config.llm))
        if todo:
            _session(config, store, method, dataset, resolved, todo, done, len(retry), holder,
                     progress, llm, retriever, on_result)
        if config.judge_llm is not None or judge_llm is not None:
            from metarag.evaluate.answer_judge import judge_answers

            answers = store.load_samples()
            mine_ids = {q.id: n for n, q in enumerate(mine)}
            judged = sorted((r for (q, i), r in answers.items() if q in mine_ids and i < k),
                            key=lambda r: (mine_ids[r.question_id], r.sample))
            path = judge_answers(store.path, judged, judge_llm if judge_llm is not None else config.judge_llm,
                                 config.answer_judge, workers=config.workers)
            if progress:
                print(f"answer judge: {path}", file=sys.stderr)
        results = store.load_results()
    return store, [results[i] for i in ids if i in results]


def _session(config: EvalConfig, store: RunStore, method: Method, dataset, resolved: dict,
             todo: list[tuple[Question, int]], done: dict, retrying: int, holder: dict, progress: bool, llm,
             retriever, on_result) -> None:
    """Build what is not given, check the back-ends, run `todo` (questions with the sample each answer
    is), and record the session in the manifest."""
    llm = llm if llm is not None else make_llm(config.llm, batch=config.batch)
    check_model_identity(store, llm.identity)
    check_backend(llm, "LLM")
    check_needs(method, llm)
    reranker = None
    if retriever is None and config.method not in CLOSED_BOOK:
        from metarag.pipeline import open_retriever

        retriever = open_retriever(list(dataset.passages), config.retriever)
    if config.method not in CLOSED_BOOK:
        check_backend(retriever, "retriever")
        check_corpus(retriever, resolved["corpus_fingerprint"], dataset)
        from metarag.rerank.registry import build_reranker

        reranker = build_reranker(config.reranker)
    manifest = _manifest(store, resolved)
    manifest["model_identity"] = llm.identity
    manifest["model_sha256"] = getattr(llm, "model_sha256", None)
    manifest["unmapped_support"] = dataset.unmapped_support
    total = len(store.shard.take(dataset.questions)) if store.shard else len(dataset.questions)
    of_shard = f" of shard {store.shard.label}" if store.shard else ""
    k = config.samples.k
    total = total * k if config.samples.until == "all" else len(done) + len(todo)  # "mixed": at most
    if done or retrying:
        again = f", retrying {retrying} failed" if retrying else ""
        what = f"answers ({k} per question)" if k > 1 else "questions"
        log.info(f"resuming {store.path}: {len(done)} of {total} {what}{of_shard} done{again}")
    session = {"started": _now(), "questions_todo": len(todo), "retrying": retrying, "argv": sys.argv,
               "pid": holder["pid"], "host": holder["host"]}
    if k > 1:
        session["samples"] = k
    if store.shard:
        session["shard"] = store.shard.label
    place = _save_session(store, resolved, manifest, session)
    runtime = Runtime(llm, retriever, reranker=reranker, rerank_depth=config.rerank_depth,
                      workers=config.workers if config.batch > 1 else 1, sampling=config.samples.sampling(),
                      seed=config.dataset.seed)
    seeds = ([sample_seed(config.dataset.seed, q.id, i) for q, i in todo] if runtime.sampling is not None
             else None)
    named = getattr(method, "named_models", None)  # models a method's settings name (EvoCtx's decision_llm)
    for spec in named() if named is not None else ():
        check_backend(runtime.llm_for(spec), f"model {spec}")
    try:
        _run_questions(method, todo, runtime, store, config.workers, done, total, progress,
                       on_result, config.max_consecutive_failures, config.batch, seeds,
                       until_mixed=config.samples.until == "mixed")
        session["outcome"] = "finished"
    except BaseException as exc:
        session["outcome"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise
    finally:
        session["ended"] = _now()
        _save_session(store, resolved, manifest, session, place)


def check_backend(backend, what: str, when: str = "before the first question") -> None:
    """Fail in seconds when a back-end that can be down is down or hung: anything with a `check()`
    verb (an OpenAI-compatible server, a remote retriever) is asked once; an embedded model or a
    local index has none and passes. Asked before the first question and after each retryable failure."""
    check = getattr(backend, "check", None)
    if check is None:
        return
    try:
        check()
    except BackendError as exc:
        raise BackendError(f"{what} health check failed {when}: {exc}", retryable=exc.retryable) from None


def check_served(spec: str | LLMSpec, what: str) -> None:
    """`check_backend` for the model a spec names, where building it loads nothing (a served model: an
    OpenAI-compatible server's client); a local model has nothing to ask."""
    parsed = parse_llm_spec(spec) if isinstance(spec, str) else spec
    if BACKENDS[parsed.backend].served:
        check_backend(make_llm(replace(parsed, response_cache=False)), what)


def check_model_identity(store: RunStore, identity: str | None) -> None:
    """Refuse, naming both, to add to or read as its own a run folder answered by another model than
    `identity` (the one answering now; None: not known, nothing checked): a run folder takes one model,
    so a scripted fake passed in never resumes as the embedded model, nor the other way round."""
    if identity is None or not store.manifest_path.exists():
        return
    recorded = store.read_json("manifest.json").get("model_identity")
    if recorded and recorded != identity:
        raise ConfigError(f"run folder {store.path} holds the answers of {recorded}, not of {identity} (the model "
                          "answering now): a run folder takes one model; give another runs folder, or remove "
                          "this one to run it anew")


def check_corpus(retriever, fingerprint: str | None, dataset) -> None:
    """Refuse a retriever that says it searches another corpus than the dataset's (a retrieval service
    reports its corpus's fingerprint in /health); one that does not say is noted and used."""
    served = getattr(retriever, "corpus_fingerprint", None)
    if served is None or fingerprint is None:
        return
    where = getattr(retriever, "url", getattr(retriever, "name", "the retriever"))
    theirs = served()
    if theirs is None:
        log.warning(f"the retrieval service at {where} does not say which corpus it serves (a service of an older "
                    f"metarag): its passages are taken to be {dataset.name}'s")
    elif theirs != fingerprint:
        raise ConfigError(f"the retrieval service at {where} serves another corpus (fingerprint {theirs[:12]}) than "
                          f"{dataset.name}'s ({len(dataset.passages)} passages, fingerprint {fingerprint[:12]}): serve "
                          "the dataset's corpus, or give --corpus the file the service was built from")


def judge_failure_summary(run_path: str | Path) -> str | None:
    """One line saying how many of the run's answers the newest answer judge's requests failed on, with the
    first error; None when none did (or the run has no judge)."""
    from metarag.evaluate.answer_judge import judge_files, load_verdicts

    files = judge_files(run_path)
    if not files:
        return None
    answers = {key: r.prediction for key, r in RunStore(run_path).load_samples().items()}
    latest = {(v.question_id, v.sample): v for v in load_verdicts(files[-1])}
    failed = [v for key, v in latest.items() if v.trace.error is not None and answers.get(key) == v.prediction]
    if not failed:
        return None
    return (f"{len(failed)} answer-judge request(s) failed, so those answers have no verdict (judge acc counts "
            f"them as not correct): re-run the same command to ask again; first: {failed[0].question_id}: "
            f"{failed[0].trace.error}")


def failure_summary(results: list[QuestionResult]) -> str | None:
    """One line saying how many questions have no successful result and the first error; None if none."""
    failed = [r for r in results if r.failed]
    if not failed:
        return None
    retryable = sum(r.retryable for r in failed)
    hint = (f"{retryable} retryable: re-run the same command to retry them" if retryable
            else "none retryable")
    return (f"{len(failed)} of {len(results)} questions have no successful result ({hint}; --retry-failed "
            f"retries every failed question); first: {failed[0].question_id}: {failed[0].error}")


class _Stopped(Exception):
    """Raised out of `run_many` by the harness when consecutive failures stop a batched run."""


def _outcomes(results: dict) -> dict[str, set[bool]]:
    """Per question, the outcomes (EM right or not) its finished samples in `results` (keyed by (question
    id, sample)) hold; a failed answer decides nothing (a retryable one runs again)."""
    seen: dict[str, set[bool]] = {}
    for (qid, _), result in results.items():
        if not result.failed:
            seen.setdefault(qid, set()).add(result.scores.em == 1.0)
    return seen


def _run_questions(method: Method, todo: list[tuple[Question, int]], runtime: Runtime, store: RunStore,
                   workers: int, done: dict, total: int, progress: bool, on_result, max_consecutive_failures: int,
                   batch: int = 1, seeds: list[int] | None = None, until_mixed: bool = False) -> None:
    """Run and write each (question, sample) of `todo`; `seeds`: the rollout seed of each, for a sampled run;
    `until_mixed`: skip a question's later samples once it has a right and a wrong one (those a batch has
    in flight then finish and are written)."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=len(done), disable=not progress, unit="q", dynamic_ncols=True)
    sums = {"em": sum(r.scores.em for r in done.values()), "f1": sum(r.scores.f1 for r in done.values())}
    count = len(done)
    lock = threading.Lock()
    seen = _outcomes(done) if until_mixed else {}
    streak: list[QuestionResult] = []  # the retryable failures since the last other outcome
    stopped: list[str] = []  # why the run stopped early, once it did
    recheck: list[QuestionResult] = []  # a retryable failure not yet followed by a health check

    def finish(*results: QuestionResult) -> None:
        nonlocal count
        with lock:
            store.append_many(results, handle)  # the questions that finished together: one fsync
            for result in results:
                count += 1
                sums["em"] += result.scores.em
                sums["f1"] += result.scores.f1
                if result.retryable:
                    streak.append(result)
                    recheck.append(result)
                else:
                    streak.clear()
            bar.set_postfix(EM=f"{100 * sums['em'] / count:.1f}", F1=f"{100 * sums['f1'] / count:.1f}")
            bar.update(len(results))
        if on_result is not None:
            for result in results:
                on_result(result)

    def stop() -> bool:
        # After a retryable failure, ask the back-ends again (seconds): a server that died or hung
        # mid-run stops the run now instead of costing each later question the client's own retries.
        if recheck and not stopped and max_consecutive_failures > 0:
            last = recheck[-1]
            recheck.clear()
            try:
                check_backend(runtime.llm, "LLM", f"after {last.question_id} failed")
                if runtime.retriever is not None:
                    check_backend(runtime.retriever, "retriever", f"after {last.question_id} failed")
                for spec, model in list(runtime.models.items()):
                    check_backend(model, f"model {spec}", f"after {last.question_id} failed")
            except BackendError as exc:
                own = (last.error or "").split(": ", 1)[-1]  # said already where the check repeats it
                stopped.append(f"stopped: {exc}" + ("" if own and own in str(exc) else f" (its error: {last.error})"))
        if not stopped and 0 < max_consecutive_failures <= len(streak):
            last = streak[-1]
            stopped.append(f"stopped after {len(streak)} consecutive questions failed with retryable errors, the "
                           f"back-end looks down (last: {last.question_id}: {last.error})")
        return bool(stopped)

    written = 0
    with store.open_for_append() as handle:
        try:
            if batch > 1:
                def settled(i: int, trace: Trace) -> None:
                    nonlocal written
                    result = score(todo[i][0], trace, todo[i][1])
                    finish(result)
                    if until_mixed and not result.failed:
                        seen.setdefault(result.question_id, set()).add(result.scores.em == 1.0)
                    written += 1
                    if stop():
                        raise _Stopped  # the questions in flight are not written: a re-run does them

                def decided(i: int) -> bool:  # a sample not yet started of a question decided meanwhile
                    if until_mixed and len(seen.get(todo[i][0].id, ())) == 2:
                        bar.total -= 1
                        return True
                    return False

                with contextlib.suppress(_Stopped):
                    run_many(method, [q for q, _ in todo], runtime, seeds=seeds, window=batch, on_trace=settled,
                             skip=decided)
            elif workers == 1:
                for n, (question, sample) in enumerate(todo):
                    if until_mixed and len(seen.get(question.id, ())) == 2:  # decided by an earlier sample
                        bar.total -= 1
                        continue
                    seed = None if seeds is None else seeds[n]
                    result = score(question, run(method, question, runtime, seed=seed), sample)
                    finish(result)
                    if until_mixed and not result.failed:
                        seen.setdefault(question.id, set()).add(result.scores.em == 1.0)
                    written += 1
                    if stop():
                        break
            else:
                # Finished questions come through a queue (not `wait` over every pending future, which
                # costs a pass over all of them per question) and each drained lot is written at once.
                settled_futures: queue.SimpleQueue = queue.SimpleQueue()
                with ThreadPoolExecutor(workers, thread_name_prefix="metarag-question") as pool:
                    pending = {}
                    for n, (q, sample) in enumerate(todo):
                        future = pool.submit(run, method, q, runtime, seed=None if seeds is None else seeds[n])
                        pending[future] = (q, sample)
                        future.add_done_callback(settled_futures.put)
                    try:
                        while pending:
                            finished = [settled_futures.get()]
                            with contextlib.suppress(queue.Empty):
                                while True:
                                    finished.append(settled_futures.get_nowait())
                            results = [score(pending[f][0], f.result(), pending[f][1])
                                       for f in finished if not f.cancelled()]
                            for future in finished:
                                del pending[future]
                            if results:
                                finish(*results)
                                written += len(results)
                            if stop():  # questions already running finish and are written; no new one starts
                                for future in pending:
                                    future.cancel()
                    except BaseException:
                        for future in pending:
                            future.cancel()
                        raise
        finally:
            bar.close()
    if stopped:
        raise BackendError(f"{stopped[0]}; {len(todo) - written} questions not tried: fix it and re-run the same "
                           "command to retry them (--max-consecutive-failures N sets the limit, 0 never stops)",
                           retryable=True)


def _save_session(store: RunStore, resolved: dict, manifest: dict, session: dict, place: int | None = None) -> int:
    """Put `session` into the run's manifest (at `place`, else at the end) with `manifest`'s other keys,
    and return its place. The shards of a run share one manifest: it is reread under the folder lock
    and changed, never overwritten with this writer's copy, so no shard's session is lost."""
    with store.folder_lock():
        saved = _manifest(store, resolved)
        sessions = list(saved.get("sessions", []))
        if place is None:
            place = len(sessions)
            sessions.append(session)
        else:
            sessions[place] = session
        store.write_json("manifest.json", {**saved, **{k: v for k, v in manifest.items() if k != "sessions"},
                                           "sessions": sessions})
    return place


def _manifest(store: RunStore, resolved: dict) -> dict:
    if store.manifest_path.exists():
        return store.read_json("manifest.json")
    return {"metarag_version": __version__, "git_commit": _git_commit(), "created": _now(),
            "dataset_sha256": resolved["dataset"]["sha256"], "seed": resolved["dataset"]["seed"],
            "model_identity": None, "sessions": []}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

