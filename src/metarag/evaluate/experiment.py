"""Experiment files: a paper's table as one file — its rows (a method and its settings), datasets,
model, retriever, sample, the reference row and the report — that `metarag experiment FILE` runs
row by row (each row an ordinary `metarag eval` run: resumable, same run id as the same `eval`
command) and reports once per dataset, with paired tests against the reference row.

The format is TOML, not YAML: Python reads it with the standard library (`tomllib`, no dependency),
its values are typed (a limit is an integer, `true` a boolean, never "yes" read as True), and it
takes comments, so each table says in its own file where its alignment comes from.

    name = "study"                       # the report's CSV: RUNS/<name>-<dataset>.csv
    reference = "metarag"                # a row's label: its method, or "method:key=value,..."
    datasets = ["hotpotqa-dev500", "2wiki-dev1000"]
    questions = "headline200"            # a committed id list of each dataset (`--questions`; absent: all)
    limit = 30                           # a seeded sample of each dataset (0 or absent: all)
    seed = 0
    llm = "embedded"                     # a spec as --llm takes it
    threads = 1
    retriever = "bm25"
    columns = ""                         # the report's columns (as --columns; empty: the default)
    breakdown = true                     # each run's judge / decision breakdown under the table
    power = true                         # what each comparison could detect (report --power)
    judge_llm = "embedded"               # judge every answer with this model (LLM-as-judge accuracy)
    judge_prompt = "equivalence"         # its prompt (judges.correctness.PROMPTS; absent: the judge's default)
    samples = 4                          # k sampled answers a question (avg@k / pass@k; default 1, greedy)

    [per_dataset.nq-1000]                # what one dataset runs with apart from the rest: a corpus
    corpus = "{data}/wiki_sample/wiki18_sample1000.jsonl"   # file (one without paragraphs of its own;
    prefix_chunk = 32                    # {data}: see `data_folder`) or the model's --prefix-chunk

    [[rows]]
    method = "closed-book"
    [[rows]]
    method = "ircot"
    settings = { k = 5, max_steps = 8 }  # as --set k=5 --set max_steps=8
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib

from metarag.errors import ConfigError, DataError, MetaRAGError

FIELDS = {"name", "title", "reference", "datasets", "questions", "limit", "seed", "llm", "threads", "prefix_chunk",
          "retriever",
          "columns", "breakdown", "power", "judge_llm", "judge_prompt", "samples", "per_dataset", "rows"}
PER_DATASET_FIELDS = {"corpus", "prefix_chunk"}
ROW_FIELDS = {"method", "settings", "datasets"}


@dataclass(frozen=True)
class Row:
    """One row of a table: a method and the settings it runs with (`--set key=value`); `datasets`: only
    on these of the table's datasets (empty: on all), for a row a paper reports on some benchmarks only."""

    method: str
    settings: tuple[tuple[str, str], ...] = ()
    datasets: tuple[str, ...] = field(default=(), compare=False)

    def runs_on(self, dataset: str) -> bool:
        return not self.datasets or dataset in self.datasets

    @property
    def label(self) -> str:
        """"method", or "method:key=value,key=value" (how --rows names it)."""
        return self.method + (":" + ",".join(f"{k}={v}" for k, v in self.settings) if self.settings else "")

    @classmethod
    def parse(cls, label: str) -> Row:
        """A row from its label, "method" or "method:key=value,key=value"."""
        method, _, rest = label.partition(":")
        pairs = []
        for pair in filter(None, rest.split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"row {label!r}: {pair!r} is not key=value")
            pairs.append((key.strip(), value.strip()))
        if not method.strip():
            raise ConfigError(f"row {label!r} names no method")
        return cls(method.strip(), tuple(pairs))


@dataclass(frozen=True)
class Experiment:
    """A table to run: rows × datasets under one model, retriever and sample; see the module docstring."""

    name: str
    rows: tuple[Row, ...]
    datasets: tuple[str, ...]
    reference: str | None = None
    title: str = ""
    questions: str | None = None
    limit: int | None = None
    seed: int = 0
    llm: str = "embedded"
    threads: int | None = None
    prefix_chunk: int = 0
    retriever: str = "bm25"
    columns: str = ""
    breakdown: bool = True
    power: bool = False
    judge_llm: str | None = None
    judge_prompt: str | None = None  # the answer judge's prompt (judges.correctness.PROMPTS; None: its default)
    samples: int = 1
    per_dataset: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    def reference_row(self) -> Row | None:
        """The reference row: the first row whose label, or else whose method, is `reference`."""
        if self.reference is None:
            return None
        by_label = [r for r in self.rows if r.label == self.reference]
        return (by_label or [r for r in self.rows if r.method == self.reference] or [None])[0]


def data_folder(experiment_file: Path | None) -> str:
    """What "{data}" in a corpus path stands for: `$METARAG_DATA_DIR`, else the `shared/data` folder
    beside the checkout holding the experiment file, spelled `<checkout>/../shared/data` (unresolved:
    the corpus path is part of a run's id, and `scripts/run-table` spelled it so for the kept runs, so
    the kept wiki-corpus runs resume only from a checkout at the path they ran in)."""
    given = os.environ.get("METARAG_DATA_DIR")
    if given:
        return given
    if experiment_file is None:
        from metarag.data.datasets import find_data_dir

        return str(find_data_dir())
    return str(experiment_file.absolute().parent.parent / ".." / "shared" / "data")


def load_experiment(path: str | Path) -> Experiment:
    """The experiment in TOML file `path`; a missing field, an unknown one or a wrong type is a
    ConfigError naming the file and the field."""
    file = Path(path).expanduser()
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no experiment file {str(file)!r}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"unreadable experiment file: {exc}", path=str(file)) from None
    return experiment_from_dict(raw, file)


def experiment_from_dict(raw: Mapping[str, Any], file: Path | None = None) -> Experiment:
    where = str(file) if file is not None else "experiment"

    def bad(message: str) -> ConfigError:
        return ConfigError(f"{where}: {message}")

    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise bad(f"unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})")
    for key in ("name", "datasets", "rows"):
        if key not in raw:
            raise bad(f"no {key!r}")
    rows = []
    for i, entry in enumerate(raw["rows"]):
        if not isinstance(entry, dict) or "method" not in entry or not isinstance(entry["method"], str):
            raise bad(f"rows[{i}] needs a method name (method = \"...\")")
        if set(entry) - ROW_FIELDS:
            raise bad(f"rows[{i}]: unknown field {sorted(set(entry) - ROW_FIELDS)[0]!r} "
                      f"(fields: {', '.join(sorted(ROW_FIELDS))})")
        settings = entry.get("settings", {})
        if not isinstance(settings, dict):
            raise bad(f"rows[{i}]: settings must be a table, e.g. settings = {{ k = 5 }}")
        only = entry.get("datasets", [])
        if not isinstance(only, list) or not all(isinstance(d, str) for d in only):
            raise bad(f"rows[{i}]: datasets must be a list of the table's dataset names")
        if stray := [d for d in only if d not in raw.get("datasets", [])]:
            raise bad(f"rows[{i}]: dataset {stray[0]!r} is not among the table's datasets")
        rows.append(Row(entry["method"], tuple((k, _text(v)) for k, v in settings.items()), tuple(only)))
    if not rows:
        raise bad("no rows")
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise bad(f"row {next(x for x in labels if labels.count(x) > 1)!r} twice")
    datasets = raw["datasets"]
    if not isinstance(datasets, list) or not datasets or not all(isinstance(d, str) for d in datasets):
        raise bad("datasets must be a non-empty list of names")
    per_dataset = raw.get("per_dataset", {})
    if not isinstance(per_dataset, dict) or not all(isinstance(v, dict) for v in per_dataset.values()):
        raise bad("per_dataset must hold one table per dataset, e.g. [per_dataset.nq-1000]")
    for name, options in per_dataset.items():
        if set(options) - PER_DATASET_FIELDS:
            raise bad(f"per_dataset.{name}: unknown field {sorted(set(options) - PER_DATASET_FIELDS)[0]!r} "
                      f"(fields: {', '.join(sorted(PER_DATASET_FIELDS))})")
        if not isinstance(options.get("corpus", ""), str) or not isinstance(options.get("prefix_chunk", 0), int):
            raise bad(f"per_dataset.{name}: corpus is a file path, prefix_chunk an integer")
    types = {"name": str, "title": str, "reference": str, "questions": str, "limit": int, "seed": int, "llm": str,
             "threads": int, "prefix_chunk": int, "retriever": str, "columns": str, "breakdown": bool, "power": bool,
             "judge_llm": str, "judge_prompt": str, "samples": int}
    for key, kind in types.items():
        if key in raw and (not isinstance(raw[key], kind) or (kind is int and isinstance(raw[key], bool))):
            raise bad(f"{key} must be a {kind.__name__}, got {raw[key]!r}")
    experiment = Experiment(
        name=raw["name"], rows=tuple(rows), datasets=tuple(datasets), reference=raw.get("reference"),
        title=raw.get("title", ""), questions=raw.get("questions") or None, limit=raw.get("limit") or None,
        seed=raw.get("seed", 0), llm=raw.get("llm", "embedded"), threads=raw.get("threads"),
        prefix_chunk=raw.get("prefix_chunk", 0), retriever=raw.get("retriever", "bm25"), columns=raw.get("columns", ""),
        breakdown=raw.get("breakdown", True), power=raw.get("power", False),
        judge_llm=raw.get("judge_llm"), judge_prompt=raw.get("judge_prompt"), samples=raw.get("samples", 1),
        per_dataset={k: dict(v) for k, v in per_dataset.items()}, path=file)
    if experiment.reference is not None and experiment.reference_row() is None:
        raise bad(f"reference {experiment.reference!r} is none of the rows")
    return experiment


def _text(value: Any) -> str:
    """A TOML value as `--set` spells it (true -> "true", 5 -> "5")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def eval_config(experiment: Experiment, row: Row, dataset: str, runs_dir: str | Path, *,
                llm: str | None = None, response_cache: bool = True):
    """The `EvalConfig` of one cell: what `metarag eval --method M --dataset D --limit L --seed S
    --threads T --runs-dir R [--corpus C] --set k=v ...` builds, hence the same run id and folder."""
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, Samples
    from metarag.judges.correctness import AnswerJudge
    from metarag.llm.registry import parse_llm_spec
    from metarag.methods.registry import method_classes

    method_classes(row.method)  # an unknown method fails here, naming the closest
    options = experiment.per_dataset.get(dataset, {})
    corpus = options.get("corpus")
    if corpus is not None:
        corpus = corpus.replace("{data}", data_folder(experiment.path))
    spec = DatasetSpec(preset=dataset, corpus=corpus, questions=experiment.questions, limit=experiment.limit,
                       seed=experiment.seed)
    return EvalConfig(method=row.method, dataset=spec,
                      llm=parse_llm_spec(llm or experiment.llm, n_threads=experiment.threads,
                                         response_cache=response_cache,
                                         prefix_chunk=options.get("prefix_chunk", experiment.prefix_chunk)),
                      retriever=experiment.retriever, overrides=dict(row.settings), runs_dir=str(runs_dir),
                      judge_llm=experiment.judge_llm, samples=Samples(k=experiment.samples),
                      **({"answer_judge": AnswerJudge(prompt=experiment.judge_prompt)}
                         if experiment.judge_prompt else {}))


def run_experiment(experiment: Experiment, runs_dir: str | Path, *, rows: Sequence[str] = (),
                   datasets: Sequence[str] = (), report_only: bool = False, llm: str | None = None,
                   response_cache: bool = True, progress: bool = True,
                   log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> list[str]:
    """Run every row of `experiment` on each dataset (`rows` / `datasets`: only these; a row given
    that the file lacks runs as an extra row), resuming what is finished; then one report per dataset
    over every row with a run folder, in the file's order, against the reference row, written to
    RUNS/<name>-<dataset>.csv. A row that fails keeps its finished questions and the others go on.
    Returns the reports (markdown), one per dataset."""
    from metarag.evaluate.harness import evaluate, prepare
    from metarag.evaluate.report import format_report, load_run, write_csv
    from metarag.methods.registry import method_settings

    chosen = [Row.parse(label) for label in rows]
    table_rows = list(experiment.rows) + [r for r in chosen if r not in experiment.rows]
    for row in table_rows:  # every row's method and settings checked before the first question runs
        try:
            method_settings(row.method, dict(row.settings))
        except ConfigError as exc:
            raise ConfigError(f"row {row.label!r}: {exc}") from None
    to_run = set(chosen) if chosen else set(experiment.rows)
    unknown = sorted(set(datasets) - set(experiment.datasets))
    names = list(datasets) if datasets else list(experiment.datasets)
    if unknown:
        log(f"experiment: {', '.join(unknown)} not among the file's datasets; running them too")
    reports = []
    for dataset in names:
        folders, ran, reference = [], [], None
        for row in table_rows:
            if not row.runs_on(dataset):
                continue
            config = eval_config(experiment, row, dataset, runs_dir, llm=llm, response_cache=response_cache)
            if not report_only and row in to_run:
                log(f"== {row.label} on {dataset}")
                try:
                    evaluate(config, progress=progress)
                except MetaRAGError as exc:
                    log(f"experiment: {row.label} on {dataset} failed ({exc}); its finished questions are kept")
            store = prepare(config)[0]
            if (store.path / "settings.json").is_file():
                folders.append(store.path)
                ran.append(row)
        # the reference row's run; without one, the first run of the reference's method
        wanted = experiment.reference_row()
        if wanted is not None:
            same = [i for i, r in enumerate(ran) if r == wanted]
            reference = (same or [i for i, r in enumerate(ran) if r.method == wanted.method] or [None])[0]
        if not folders:
            log(f"experiment: no finished rows on {dataset}")
            continue
        runs = [load_run(f) for f in folders]
        columns = [c.strip() for c in experiment.columns.split(",") if c.strip()] or None
        table, report_rows = format_report(runs, baseline=reference, columns=columns, breakdowns=experiment.breakdown,
                                           power=experiment.power)
        limit = f"limit {experiment.limit}" if experiment.limit else "all questions"
        if experiment.questions:
            limit = f"questions {experiment.questions}" + (f", {limit}" if experiment.limit else "")
        text = f"## {experiment.name} table on {dataset} ({limit}, seed {experiment.seed})\n{table}"
        write_csv(report_rows, Path(runs_dir) / f"{experiment.name}-{dataset}.csv")
        reports.append(text)
    return reports


def with_overrides(experiment: Experiment, *, limit: int | None = None, prefix_chunk: int | None = None) -> Experiment:
    """The experiment on a sample of `limit` questions per dataset (0: all) and with the model's
    `prefix_chunk` on every dataset; None keeps the file's."""
    if limit is not None:
        experiment = replace(experiment, limit=limit or None)
    if prefix_chunk is not None:
        experiment = replace(experiment, prefix_chunk=prefix_chunk, per_dataset={
            name: {k: v for k, v in options.items() if k != "prefix_chunk"}
            for name, options in experiment.per_dataset.items()})
    return experiment
