"""Experiment files: a paper's table as one file — its rows (a method and its settings, and where a row
says so its own retriever and reranker), datasets, model, retriever, sample, the reference row and the
report — that `metarag experiment FILE` runs row by row (each row an ordinary `metarag eval` run:
resumable, same run id as the same `eval` command) and reports once per dataset, with paired tests
against the reference row. Every option of `metarag eval` but those NOT_IN_FILES names is a field of
the file, spelled as `metarag.run`'s keyword (`evaluate.options.OPTIONS`).

The format is TOML, not YAML: Python reads it with the standard library (`tomllib`, no dependency),
its values are typed (a limit is an integer, `true` a boolean, never "yes" read as True), and it
takes comments, so each table says in its own file where its alignment comes from.

    name = "study"                       # the report's CSV: RUNS/<name>-<dataset>.csv
    reference = "metarag"                # a row's label: its method, or "method:key=value,..."
    claim = ["standard-rag", "ircot"]    # the rows the paper says the reference beats: a verdict under
                                         # each table (`paired.verdict`: EM, exact McNemar, Holm, power)
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
    [[rows]]
    method = "standard-rag"              # a row's own retriever, reranker and rerank depth (its label:
    retriever = "hybrid"                 # "standard-rag:retriever=hybrid,reranker=listwise")
    reranker = "listwise"
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
from metarag.evaluate.options import BY_NAME, OPTIONS, config_from_options, setting_text

# The run options (`evaluate.options.OPTIONS`) a file does not set, and why; every other one is a field of
# the file, set for every cell (a row's own `method`, `settings`, `retriever` ... go in its [[rows]] entry).
NOT_IN_FILES = {"dataset": "the file's `datasets` name them", "dataset_file": "a table runs named datasets",
                "format": "a table runs named datasets", "runs_dir": "the command's --runs-dir",
                "shard": "a table runs whole (eval --shard runs one cell in slices)"}
# The options a row sets (its method and settings, and what it retrieves with), over the file's own.
ROW_OPTIONS = ("method", "settings", "retriever", "reranker", "rerank_depth")
# A row's run options besides its method and settings, named in its label as method settings are.
ROW_RUN_OPTIONS = ROW_OPTIONS[2:]
PER_DATASET_OPTIONS = ("corpus", "prefix_chunk")
TABLE_OPTIONS = tuple(o.name for o in OPTIONS if o.name not in NOT_IN_FILES and o.name not in ("method", "settings"))
FIELDS = {"name", "title", "reference", "claim", "datasets", "columns", "breakdown", "power", "per_dataset", "rows",
          *TABLE_OPTIONS}
ROW_FIELDS = {*ROW_OPTIONS, "datasets"}
PER_DATASET_FIELDS = set(PER_DATASET_OPTIONS)
# what each field of the file holds (rows, datasets and per_dataset are checked on their own)
KINDS = {"name": str, "title": str, "reference": str, "columns": str, "breakdown": bool, "power": bool,
         **{name: BY_NAME[name].kind for name in TABLE_OPTIONS}}


@dataclass(frozen=True)
class Row:
    """One row of a table: a method and the settings it runs with (`--set key=value`), and where it
    retrieves with another retriever, reranker or rerank depth than the file's, those; `datasets`: only on
    these of the table's datasets (empty: on all), for a row a paper reports on some benchmarks only."""

    method: str
    settings: tuple[tuple[str, str], ...] = ()
    datasets: tuple[str, ...] = field(default=(), compare=False)
    retriever: str | None = None
    reranker: str | None = None
    rerank_depth: int | None = None

    def runs_on(self, dataset: str) -> bool:
        return not self.datasets or dataset in self.datasets

    @property
    def options(self) -> dict[str, Any]:
        """The run options this row sets over the file's."""
        own = {name: getattr(self, name) for name in ROW_RUN_OPTIONS if getattr(self, name) is not None}
        return {"method": self.method, "settings": dict(self.settings), **own}

    @property
    def label(self) -> str:
        """"method", or "method:key=value,key=value" (how --rows names it): its retriever, reranker and
        rerank depth where it sets them, then its method settings."""
        pairs = [(name, getattr(self, name)) for name in ROW_RUN_OPTIONS if getattr(self, name) is not None]
        pairs += list(self.settings)
        return self.method + (":" + ",".join(f"{k}={v}" for k, v in pairs) if pairs else "")

    @classmethod
    def parse(cls, label: str) -> Row:
        """A row from its label, "method" or "method:key=value,key=value" (a key of ROW_RUN_OPTIONS sets the
        row's retriever, reranker or rerank depth, any other a method setting)."""
        method, _, rest = label.partition(":")
        pairs, own = [], {}
        for pair in filter(None, rest.split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"row {label!r}: {pair!r} is not key=value")
            if key.strip() in ROW_RUN_OPTIONS:
                own[key.strip()] = _typed(key.strip(), value.strip(), f"row {label!r}")
            else:
                pairs.append((key.strip(), value.strip()))
        if not method.strip():
            raise ConfigError(f"row {label!r} names no method")
        return cls(method.strip(), tuple(pairs), **own)


def _typed(name: str, text: str, where: str) -> Any:
    """An option's value from its text in a row's label."""
    if BY_NAME[name].kind is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{where}: {name} must be a whole number, got {text!r}") from None
    return text


@dataclass(frozen=True)
class Experiment:
    """A table to run: rows × datasets under one model, retriever and sample; see the module docstring.
    `options`: the run options the file sets for every cell (TABLE_OPTIONS: questions, limit, seed, llm,
    threads, retriever, samples, judge_llm ...), the rest at their defaults; `per_dataset`: those it sets
    for one dataset (PER_DATASET_OPTIONS)."""

    name: str
    rows: tuple[Row, ...]
    datasets: tuple[str, ...]
    reference: str | None = None
    claim: tuple[str, ...] = ()
    title: str = ""
    columns: str = ""
    breakdown: bool = True
    power: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    per_dataset: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    @property
    def questions(self) -> str | None:
        return self.options.get("questions")

    @property
    def limit(self) -> int | None:
        return self.options.get("limit")

    @property
    def seed(self) -> int:
        return self.options.get("seed", 0)

    def reference_row(self) -> Row | None:
        """The reference row: the first row whose label, or else whose method, is `reference`."""
        if self.reference is None:
            return None
        return self.row_named(self.reference)

    def row_named(self, name: str) -> Row | None:
        """The first row whose label, or else whose method, is `name`."""
        by_label = [r for r in self.rows if r.label == name]
        return (by_label or [r for r in self.rows if r.method == name] or [None])[0]


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
        own = {name: entry[name] for name in ROW_RUN_OPTIONS if name in entry}
        for name, value in own.items():
            if wrong := _wrong_kind(BY_NAME[name].kind, value):
                raise bad(f"rows[{i}]: {name} must be a {wrong}, got {value!r}")
        rows.append(Row(entry["method"], tuple((k, setting_text(v)) for k, v in settings.items()), tuple(only),
                        **own))
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
        if any(_wrong_kind(BY_NAME[key].kind, value) for key, value in options.items()):
            raise bad(f"per_dataset.{name}: corpus is a file path, prefix_chunk an integer")
    for key, kind in KINDS.items():
        if key in raw and (wrong := _wrong_kind(kind, raw[key])):
            raise bad(f"{key} must be a {wrong}, got {raw[key]!r}")
    # a limit of 0 and an empty question list read as none: every question
    options = {key: raw[key] for key in TABLE_OPTIONS if key in raw and (key not in ("limit", "questions") or raw[key])}
    claim = raw.get("claim", [])
    if not isinstance(claim, list) or not all(isinstance(c, str) for c in claim):
        raise bad("claim must be a list of row names, e.g. claim = [\"standard-rag\", \"ircot\"]")
    experiment = Experiment(
        name=raw["name"], rows=tuple(rows), datasets=tuple(datasets), reference=raw.get("reference"),
        claim=tuple(claim),
        title=raw.get("title", ""), columns=raw.get("columns", ""), breakdown=raw.get("breakdown", True),
        power=raw.get("power", False), options=options, per_dataset={k: dict(v) for k, v in per_dataset.items()},
        path=file)
    if experiment.reference is not None and experiment.reference_row() is None:
        raise bad(f"reference {experiment.reference!r} is none of the rows")
    if claim and experiment.reference is None:
        raise bad("a claim is about the reference row: give reference = \"...\" too")
    for name in claim:
        if experiment.row_named(name) in (None, experiment.reference_row()):
            raise bad(f"claim {name!r} is none of the rows but the reference")
    return experiment


def _wrong_kind(kind: type, value: Any) -> str | None:
    """The name of `kind` where a TOML value is not of it (a whole number is not a bool, nor a bool a
    number; a list holds names; a float may be written whole), else None."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    if isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool)):
        if kind is not list or all(isinstance(item, str) for item in value):
            return None
    return kind.__name__


def eval_config(experiment: Experiment, row: Row, dataset: str, runs_dir: str | Path, *,
                llm: str | None = None, response_cache: bool = True):
    """The `EvalConfig` of one cell: the file's options, the dataset's own, then the row's, read as `metarag
    eval --method M --dataset D --runs-dir R ...` with the same options reads them, hence the same run id
    and folder. `llm` replaces the file's model; `response_cache` False turns the response cache off."""
    from metarag.methods.registry import method_classes

    method_classes(row.method)  # an unknown method fails here, naming the closest
    values = {**experiment.options, **experiment.per_dataset.get(dataset, {}), **row.options,
              "dataset": dataset, "runs_dir": str(runs_dir)}
    if values.get("corpus") is not None:
        values["corpus"] = values["corpus"].replace("{data}", data_folder(experiment.path))
    if llm:
        values["llm"] = llm
    if not response_cache:
        values["response_cache"] = False
    return config_from_options(values)


def run_experiment(experiment: Experiment, runs_dir: str | Path, *, rows: Sequence[str] = (),
                   datasets: Sequence[str] = (), report_only: bool = False, llm: str | None = None,
                   response_cache: bool = True, progress: bool = True,
                   log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> list[str]:
    """Run every row of `experiment` on each dataset (`rows` / `datasets`: only these; a row given
    that the file lacks runs as an extra row), resuming what is finished; then one report per dataset
    over every row with a run folder, in the file's order, against the reference row, written to
    RUNS/<name>-<dataset>.csv. Every cell is resolved (`evaluate.resolve`) before the first question runs;
    a row that fails while running keeps its finished questions and the others go on.
    Returns the reports (markdown), one per dataset."""
    from metarag.evaluate.harness import evaluate
    from metarag.evaluate.report import format_report, load_run, write_csv
    from metarag.evaluate.resolve import resolve

    chosen = [Row.parse(label) for label in rows]
    table_rows = list(experiment.rows) + [r for r in chosen if r not in experiment.rows]
    to_run = set(chosen) if chosen else set(experiment.rows)
    unknown = sorted(set(datasets) - set(experiment.datasets))
    names = list(datasets) if datasets else list(experiment.datasets)
    if unknown:
        log(f"experiment: {', '.join(unknown)} not among the file's datasets; running them too")
    cells = {}
    for dataset in names:
        for row in [r for r in table_rows if r.runs_on(dataset)]:
            try:
                config = eval_config(experiment, row, dataset, runs_dir, llm=llm, response_cache=response_cache)
                cells[dataset, row] = resolve(config)
            except ConfigError as exc:
                raise ConfigError(f"row {row.label!r}: {exc}") from None
    reports = []
    for dataset in names:
        folders, ran, reference = [], [], None
        for row in table_rows:
            cell = cells.get((dataset, row))
            if cell is None:
                continue
            if not report_only and row in to_run:
                log(f"== {row.label} on {dataset}")
                try:
                    evaluate(cell.config, progress=progress)
                except MetaRAGError as exc:
                    log(f"experiment: {row.label} on {dataset} failed ({exc}); its finished questions are kept")
            if (cell.folder / "settings.json").is_file():
                folders.append(cell.folder)
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
        if experiment.claim and reference is not None:
            table += "\n\n" + claim_verdict(experiment, dataset, runs, ran, reference)
        text = f"## {experiment.name} table on {dataset} ({limit}, seed {experiment.seed})\n{table}"
        write_csv(report_rows, Path(runs_dir) / f"{experiment.name}-{dataset}.csv")
        reports.append(text)
    return reports


def claim_verdict(experiment: Experiment, dataset: str, runs: Sequence[Any], ran: Sequence[Row], reference: int) -> str:
    """The verdict on the file's claim on one dataset (`paired.verdict`): the claimed rows that run on it,
    those without a run folder yet named as missing."""
    from metarag.evaluate.paired import verdict

    claimed, missing = [], []
    for name in experiment.claim:
        row = experiment.row_named(name)
        if row is not None and row.runs_on(dataset):
            if row in ran:
                claimed.append(list(ran).index(row))
            else:
                missing.append(name)
    return verdict(runs, reference, claimed, dataset=dataset, missing=missing)


def with_overrides(experiment: Experiment, *, limit: int | None = None, prefix_chunk: int | None = None) -> Experiment:
    """The experiment on a sample of `limit` questions per dataset (0: all) and with the model's
    `prefix_chunk` on every dataset; None keeps the file's."""
    if limit is not None:
        experiment = replace(experiment, options={**experiment.options, "limit": limit or None})
    if prefix_chunk is not None:
        experiment = replace(experiment, options={**experiment.options, "prefix_chunk": prefix_chunk}, per_dataset={
            name: {k: v for k, v in options.items() if k != "prefix_chunk"}
            for name, options in experiment.per_dataset.items()})
    return experiment
