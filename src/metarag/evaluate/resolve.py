"""A run resolved: its config checked against every registry in one step, its questions loaded, its
settings resolved into what `settings.json` keeps and the run id hashes, and its run folder found.
Nothing here loads a model; `harness.prepare` builds the method from it and `harness.evaluate` runs it.
"""
from __future__ import annotations

import glob
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError
from metarag.evaluate.config import DatasetSpec, EvalConfig
from metarag.llm.registry import check_spec, parse_llm_spec
from metarag.methods.registry import CLOSED_BOOK, component_revisions, method_revision, method_settings
from metarag.rerank.registry import check_reranker, reranker_settings
from metarag.retrieve.index import check_retriever
from metarag.settings import artifact_digests, settings_hash, to_plain


def load_questions(spec: DatasetSpec):
    """The dataset a spec names, sampled when `limit` is set; errors name the file or preset."""
    from metarag.data.datasets import load_dataset, resolve_preset, sample

    if bool(spec.preset) == bool(spec.file):
        raise ConfigError("give exactly one of --dataset PRESET or --dataset-file PATH")
    if spec.preset:
        if spec.format:
            raise ConfigError("--format goes with --dataset-file, not with a preset")
        # --corpus with a preset retrieves from that corpus instead of the preset's own paragraphs (the
        # single-hop sets and Bamboogle have none: Wikipedia passages, as the papers retrieve from)
        dataset = resolve_preset(spec.preset, corpus=spec.corpus, allow_unanswerable=spec.allow_unanswerable)
    else:
        dataset = load_dataset(spec.file, spec.format, corpus=spec.corpus,
                               allow_unanswerable=spec.allow_unanswerable)
    if not dataset.questions:
        raise DataError("the dataset has no questions", path=dataset.path)
    if spec.types:
        from metarag.data.pool import question_slice

        if not any(q.type for q in dataset.questions):
            raise ConfigError(f"{dataset.name} gives no question types, so --types cannot pick among them "
                              "(2wiki-dev1000, hotpotqa-train100 and HotpotQA-format files give them)")
        dataset = question_slice(dataset, tuple(spec.types))
    if spec.questions:
        from metarag.data.datasets import question_list, select

        listed = question_list(spec.questions, dataset.name)
        dataset = select(dataset, listed.ids, source=f"question list {spec.questions!r}")
    if spec.limit is not None:
        if spec.limit < 1:
            raise ConfigError("--limit must be at least 1")
        dataset = sample(dataset, spec.limit, spec.seed)
    return dataset


def run_dataset(settings: Mapping[str, Any], path: str | None = None, *, sampled: bool = False):
    """The dataset that a run's saved `settings.json` names: the whole dataset (what a run folder does
    not keep of its questions, type, hops, supporting passages, is read from it), or with `sampled`
    the run's own seeded sample. The saved format of a preset is the preset's own, so only a file's
    format is passed on. `path` (the settings file) is named when they name no dataset."""
    saved = settings.get("dataset") if isinstance(settings.get("dataset"), Mapping) else {}
    if not (saved.get("preset") or saved.get("file")):
        raise DataError("the run's settings name no dataset", path=path)
    names = ("preset", "file", "corpus", "allow_unanswerable") + (() if saved.get("preset") else ("format",))
    names += ("limit", "seed", "types", "questions") if sampled else ()
    fields = {k: saved[k] for k in names if saved.get(k) is not None}
    if "types" in fields:
        fields["types"] = tuple(fields["types"])
    return load_questions(DatasetSpec(**fields))


@dataclass(frozen=True)
class Resolved:
    """A run resolved, nothing loaded: its config, the settings of its method and reranker (None for
    none), its questions, the settings `settings.json` keeps (the run id hashes them) and its run folder."""

    config: EvalConfig
    method_settings: Any
    reranker_settings: Any
    dataset: Any
    settings: dict
    folder: Path


def resolve(config: EvalConfig) -> Resolved:
    """Resolve a run in one step: every name it gives looked up in its registry (the session's bounds, the
    model's back-end and the judge's, the retriever, the reranker, the method and its settings, the
    dataset), then its settings and run folder. The first that is wrong fails here, in one line naming it,
    before any model loads."""
    if config.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if config.batch < 1:
        raise ConfigError("--batch must be at least 1")
    if config.max_consecutive_failures < 0:
        raise ConfigError("--max-consecutive-failures must be 0 (never stop) or more")
    check_spec(config.llm)
    if config.judge_llm is not None:
        parse_llm_spec(config.judge_llm)  # an unknown judge model fails here, before any question
        if config.shard is not None:
            raise ConfigError("--judge-llm judges a whole run, not one shard: judge a sharded run once its shards "
                              "have finished, from Python: metarag.Run.load(RUN).judge(SPEC)")
    check_retriever(config.retriever)
    check_reranker(config.reranker)
    reranker = reranker_settings(config.reranker)
    method = method_settings(config.method, config.overrides)
    dataset = load_questions(config.dataset)
    if config.shard is not None and config.shard.count > len(dataset.questions):
        raise ConfigError(f"--shard {config.shard.label}: {len(dataset.questions)} questions cannot be split "
                          f"{config.shard.count} ways; give N at most {len(dataset.questions)}")
    if config.method not in CLOSED_BOOK and not dataset.passages:
        raise ConfigError(f"{dataset.name} has no passages to retrieve from: give --corpus PATH")
    settings = _settings(config, method, reranker, dataset)
    prefix = f"{config.method}-{config.dataset.label()}-{config.llm.backend}-"
    digest = settings_hash(_hashed(settings))
    folder = Path(config.runs_dir) / f"{prefix}{digest}"
    if settings["dataset"].get("corpus") and not folder.exists():
        folder = _path_hashed_run(Path(config.runs_dir), prefix, digest) or folder
    return Resolved(config, method, reranker, dataset, settings, folder)


def _settings(config: EvalConfig, method: Any, reranker: Any, dataset) -> dict:
    """The resolved settings of a run: everything that can change an answer, as settings.json keeps it."""
    from metarag.data.corpus import corpus_fingerprint

    needs_corpus = config.method not in CLOSED_BOOK
    resolved = {
        "method": config.method,
        "method_settings": to_plain(method),
        # allow_unanswerable, types and questions only where set, so the run ids of runs without them stay
        # put; a question list by the ids it selects, not by its name or path
        "dataset": {**{k: v for k, v in asdict(config.dataset).items()
                       if k not in ("allow_unanswerable", "types", "questions") or v},
                    **({"question_ids_sha256": _ids_sha256(dataset.questions)} if config.dataset.questions else {}),
                    "name": dataset.name, "format": dataset.format,
                    "sha256": dataset.sha256, "n_questions": len(dataset.questions)},
        "corpus_fingerprint": corpus_fingerprint(dataset.passages) if needs_corpus else None,
        "retriever": config.retriever if needs_corpus else None,
        # how the model is run (threads, the response cache) does not change what it answers: not hashed
        # (prefix_chunk and lora only where set, so the run ids of runs without them stay put)
        "llm": {k: v for k, v in asdict(config.llm).items()
                if k not in ("response_cache", "n_threads") and (k not in ("prefix_chunk", "lora") or v)},
    }
    if config.llm.lora:  # an adapter by what it applies (its config and weights), not by where it lies
        from metarag.llm.lora import adapter_sha256

        resolved["llm"]["lora"] = f"sha256:{adapter_sha256(config.llm.lora)}"
    if config.samples.k > 1:  # absent for one greedy answer per question, so those run ids stay put
        resolved["sampling"] = {"temperature": config.samples.temperature, "top_p": config.samples.top_p}
    revision = method_revision(config.method)
    if revision > 1:  # absent at revision 1, so the run ids of unchanged methods stay put
        resolved["method_revision"] = revision
    if components := component_revisions(config.method):  # likewise absent while all are at revision 1
        resolved["component_revisions"] = components
    if config.reranker != "none" and needs_corpus:  # absent otherwise, so run ids without one stay put
        resolved["reranker"] = {"spec": config.reranker, "depth": config.rerank_depth,
                                "settings": to_plain(reranker)}
    # A model named by path (a trained critic, a cross-encoder, a GGUF) is hashed by content, so
    # replacing what lies behind the same path gives a new run id; absent when none is named.
    artifacts = artifact_digests({"method_settings": resolved["method_settings"], "llm": resolved["llm"],
                                  "reranker": config.reranker if needs_corpus else ""})
    if artifacts:
        resolved["artifacts"] = artifacts
    return resolved

def _hashed(resolved: Mapping[str, Any]) -> Mapping[str, Any]:
    """What of a run's resolved settings its id hashes: all of it, but a corpus given by path (--corpus)
    by its content alone where the run retrieves from it (`corpus_fingerprint`), so a moved data folder
    keeps its runs and a changed file under the same path gets a new id; settings.json keeps the path,
    for the reader. A closed-book run, which has no fingerprint, still hashes the path (its id stays)."""
    dataset = resolved.get("dataset")
    if resolved.get("corpus_fingerprint") is None or not isinstance(dataset, Mapping) or not dataset.get("corpus"):
        return resolved
    return {**resolved, "dataset": {k: v for k, v in dataset.items() if k != "corpus"}}


def _path_hashed_run(runs_dir: Path, prefix: str, digest: str) -> Path | None:
    """A run folder named before run ids left a corpus's path out (its id hashed the path it was given,
    wherever the data folder lay then), found by its saved settings: those hash without the path to
    `digest`. So every such run (the kept wiki-corpus runs of docs/table-runs/agent-table among them)
    resumes in its own folder, whatever the data folder's place now; None when there is none."""
    for folder in sorted(runs_dir.glob(glob.escape(prefix) + "*")) if runs_dir.is_dir() else ():
        try:
            saved = json.loads((folder / "settings.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and isinstance(saved.get("dataset"), dict) and saved["dataset"].get("corpus") \
                and settings_hash(_hashed(saved)) == digest:
            return folder
    return None


def _ids_sha256(questions) -> str:
    return hashlib.sha256("\n".join(q.id for q in questions).encode()).hexdigest()


