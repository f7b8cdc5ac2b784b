"""The Python face of metarag: run a method on a dataset and get its results and report table back,
the way `metarag eval` and `metarag report` do from the shell; write a method of your own as a
policy that yields actions, and register it so every front end runs it by name.

    import metarag
    run = metarag.run("standard-rag", "demo", limit=2)
    print(run.table())            # the table `metarag report` prints
    run.results                   # one row per question (a pandas DataFrame)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import MissingDependency


@dataclass(frozen=True)
class Run:
    """A run folder read back: its path, its resolved settings and every question's newest result,
    in dataset order (failed questions included: they score 0); of a sampled run (`samples=k`), sample
    0's, and `sampled` every (question, sample)'s."""

    path: Path
    settings: dict
    records: tuple[Any, ...]
    sampled: tuple[Any, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """The run in the folder `path` (one `metarag eval` wrote)."""
        from metarag.evaluate.report import load_run

        loaded = load_run(path)
        return cls(loaded.path, loaded.settings, loaded.results, loaded.samples)

    def judge(self, llm: str = "embedded", *, prompt: str = "equivalence", workers: int = 1,
              llm_instance: Any = None) -> Run:
        """Judge every answer of the run with an LLM (`eval --judge-llm`; a sharded run's too, once its
        shards have finished), keeping the verdicts in the run folder and asking only about answers not
        judged yet; returns the run read again, its table now with the judged accuracy. `llm`: the
        judge's spec string; `prompt`: the judge prompt's name (`judges.correctness.PROMPTS`);
        `llm_instance`: a model object to judge with instead (its identity names the judge)."""
        from metarag.evaluate.answer_judge import judge_answers
        from metarag.evaluate.runs import RunStore
        from metarag.judges.correctness import AnswerJudge
        from metarag.llm.registry import parse_llm_spec

        judge = AnswerJudge(prompt=prompt)
        if llm_instance is None:
            parse_llm_spec(llm)
        with RunStore(self.path).lock():  # no eval writes the run while it is judged
            judge_answers(self.path, self.sampled or self.records, llm_instance if llm_instance is not None else llm,
                          judge, workers=workers)
        return Run.load(self.path)

    def table(self, *others: Run, baseline: int | None = 0, columns: Sequence[str] | None = None) -> str:
        """The report table of this run and `others` (markdown, as `metarag report` prints it); with
        `baseline` (an index, 0 = this run) the others carry paired tests against it."""
        from metarag.evaluate.report import load_run, report_table

        table, _ = report_table([load_run(r.path) for r in (self, *others)],
                                baseline=baseline if others else None, columns=columns)
        return table

    @property
    def results(self) -> Any:
        """One row per question as a pandas DataFrame: id, gold answers, prediction, EM, F1, cover
        accuracy, supporting-passage recall, searches, model requests, tokens, latency and error."""
        try:
            import pandas
        except ModuleNotFoundError:
            raise MissingDependency("pandas", "eval") from None
        return pandas.DataFrame([_row(r) for r in self.records])


def _row(result: Any) -> dict[str, Any]:
    usage = result.trace.usage
    return {"question_id": result.question_id, "golds": list(result.golds), "prediction": result.prediction,
            "em": result.scores.em, "f1": result.scores.f1, "acc": result.scores.acc,
            "support_recall": result.support_recall, "searches": usage.retrieval_calls,
            "llm_requests": usage.llm_requests, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "latency_s": usage.latency_s, "error": result.error}


def run(method: str, dataset: str | Path, *, llm: str = "embedded", settings: Mapping[str, Any] | None = None,
        retriever: str = "bm25", reranker: str = "none", rerank_depth: int = 20, limit: int | None = None,
        seed: int = 0, questions: str | None = None, types: Sequence[str] = (), corpus: str | Path | None = None,
        format: str | None = None, allow_unanswerable: bool = False, runs_dir: str | Path | None = None,
        samples: int = 1, temperature: float | None = None, top_p: float | None = None,
        samples_until: str | None = None,
        judge_llm: str | None = None, judge_prompt: str | None = None, gguf: str | Path | None = None,
        base_url: str | None = None, model: str | None = None, api_key_env: str | None = None,
        threads: int | None = None, n_ctx: int | None = None, prefix_chunk: int = 0,
        lora: str | Path | None = None, response_cache: bool = True, workers: int = 1, batch: int = 1,
        shard: str | None = None, retry_failed: bool = False, max_consecutive_failures: int = 3,
        wait: bool = False, progress: bool = False, llm_instance: Any = None, retriever_instance: Any = None,
        judge_llm_instance: Any = None) -> Run:
    """Evaluate `method` on `dataset` (or resume that run) and return the run: `metarag eval` from Python,
    the same run folder, id and resume. (`run`, not `evaluate`: `metarag.evaluate` is the package of the
    harness, metrics and reports.)

    `method`: a name of `metarag methods` (ours, an installed package's, or one `register_method`
    added). `dataset`: a preset name (`hotpotqa-dev500`, `demo` ...) or a question file (its format
    detected, else `format`; `corpus` gives its passages). `llm`: a model spec as `--llm` takes it
    (`embedded`, `hf-0.5b`, `gguf:PATH`, `openai:MODEL@URL` ...). `settings`: the method's settings to
    change (`{"k": 3}`). Every other keyword but the last four is the `eval` option of that name
    (`metarag eval --help`; `evaluate.options.OPTIONS`), None its default: `retriever`, `reranker`,
    `rerank_depth`; `limit` / `seed` (a seeded sample), `questions` (a committed list of question ids),
    `types`, `allow_unanswerable`; `runs_dir` (default `$METARAG_RUNS`, else ./runs); `samples` k sampled
    answers a question (`temperature` / `top_p`: 0.6 / 0.95; `samples_until` "mixed" stops a question's
    samples at its first right and wrong pair, for a difficulty filter), avg@k and pass@k in the table; `judge_llm`
    judges every answer afterwards with `judge_prompt`; the model's `gguf`, `base_url`, `model`,
    `api_key_env`, `threads`, `n_ctx`, `prefix_chunk`, `lora` and `response_cache`; and how the session
    runs: `workers`, `batch` (questions in lockstep, each round's requests one batch), `shard` ("i/n":
    the i-th of n disjoint slices, into the same run folder as the other shards; the returned run holds
    every shard written so far), `retry_failed`, `max_consecutive_failures`, `wait`.
    `progress` shows a progress bar; `llm_instance` / `retriever_instance` / `judge_llm_instance`: objects
    to use instead of building them from the specs (a scripted model in a test, a shared retrieval
    service); the run id still names the specs, and a run folder takes one model's answers only."""
    options = dict(locals())  # every keyword named as an option of `eval` is read as that option
    from metarag.evaluate.harness import evaluate
    from metarag.evaluate.options import BY_NAME, config_from_options

    given = Path(str(dataset)).expanduser()
    is_file = given.suffix != "" or given.exists()
    options.update(dataset=None if is_file else str(dataset), dataset_file=str(given) if is_file else None)
    config = config_from_options({name: value for name, value in options.items() if name in BY_NAME})
    store, _ = evaluate(config, progress=progress, llm=llm_instance, retriever=retriever_instance,
                        judge_llm=judge_llm_instance)
    return Run.load(store.path)


def method_table(own: bool = False) -> list[dict[str, str]]:
    """Every method a user compares: its name, its paper (authors, year), what it does, what it needs
    beyond a model and a retriever, and what can be trained for it. Ours from their cards
    (`methods.catalog`); another package's from its class (the first line of its docstring, its
    module docstring's citation, its per-token `needs`). Helpers a training command runs are left out;
    `own`: metarag's methods only (the docs page), not those registered or installed beside them."""
    import re
    import sys

    from metarag.methods.catalog import CAPABILITY_WORDS, CARDS, HELPERS
    from metarag.methods.registry import method_classes, method_names

    rows = []
    for name in method_names():
        if name in HELPERS or (own and name not in CARDS):
            continue
        cls, _ = method_classes(name)
        needs = ", ".join(CAPABILITY_WORDS.get(k, k) for k in getattr(cls, "needs", {}) or {})
        card = CARDS.get(name)
        if card is not None:
            rows.append({"method": name, "paper": card.paper, "what": card.what,
                         "needs": card.requires or (needs and f"{needs} from the back-end"),
                         "training": card.training})
            continue
        module = sys.modules.get(cls.__module__)
        paper = " ".join(((module.__doc__ or "") if module is not None else "").split("\n\n")[0].split())
        cited = re.search(r"\(([^()]*?(?:19|20)\d\d)\)", paper)  # "ReAct (Yao et al., 2023)"
        rows.append({"method": name, "paper": cited.group(1) if cited else "",
                     "what": " ".join((cls.__doc__ or "").strip().split("\n")[0].split()),
                     "needs": needs and f"{needs} from the back-end", "training": ""})
    return rows


def methods_markdown() -> str:
    """docs/methods.md: the methods table, then each method's settings (`method_help`). What
    `metarag methods --markdown` prints; a test keeps the committed page equal to it."""
    rows = method_table(own=True)
    lines = ["# Methods", "", "Generated by `metarag methods --markdown` from the method registry "
             "(`src/metarag/methods/catalog.py` and each settings class); do not edit by hand.", "",
             "| method | paper | what it does | needs | training |", "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['paper']} | {r['what']} | {r['needs'] or '–'} | {r['training'] or '–'} |"
              for r in rows]
    for r in rows:
        lines += ["", f"## {r['method']}", "", method_help(r["method"])]
    return "\n".join(lines) + "\n"


def method_help(name: str) -> str:
    """Method `name`'s settings: each one's type, default and range or choices, then the settings
    class's docstring (where the paper and section of each default are named)."""
    import dataclasses
    import typing

    from metarag.methods.registry import method_classes
    from metarag.settings import Range

    _, settings_cls = method_classes(name)
    hints = typing.get_type_hints(settings_cls)
    lines = [f"{name} ({settings_cls.__name__})", "", "| setting | type | default | range or choices |",
             "|---|---|---|---|"]
    for field in dataclasses.fields(settings_cls):
        tp = hints.get(field.name, field.type)
        choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()
        bounds = field.metadata.get("range", Range())
        limits = ", ".join(map(str, choices)) if choices else bounds.describe() if bounds != Range() else ""
        kind = "one of" if choices else getattr(tp, "__name__", str(tp))
        default = field.default if field.default is not dataclasses.MISSING else "(required)"
        lines.append(f"| {field.name} | {kind} | {default!r} | {limits} |")
    doc = (settings_cls.__doc__ or "").strip()
    return "\n".join(lines + ["", doc]) if doc else "\n".join(lines)
