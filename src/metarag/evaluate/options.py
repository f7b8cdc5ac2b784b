"""The options of a run, one table: each names the `EvalConfig` field it sets, so the CLI's `eval` flags,
`metarag.run`'s keywords and an experiment file's fields are one set, read into the config by one function.

An option's name is `run()`'s keyword, the experiment file's field and the CLI's argument name (its flag
is `--name` with dashes unless it says otherwise); its default is the config field's. Add a field to
`EvalConfig` (or `DatasetSpec`, `LLMSpec`, `Samples`) and tests/test_options.py fails, naming it, until an
option here sets it; the option gives the `eval` flag and the experiment field at once, and the test fails
again, naming it, until `run()` takes it as a keyword.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.errors import ConfigError, close_matches
from metarag.evaluate.config import EvalConfig, runs_dir_default
from metarag.evaluate.runs import Shard
from metarag.llm.registry import LLMSpec, parse_llm_spec
from metarag.paths import check_folder
from metarag.settings import parse_assignments


def setting_text(value: Any) -> str:
    """A method setting's value as `--set` spells it (True -> "true", 5 -> "5")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    """"a,b" (as a flag gives it) or a sequence of names -> a tuple of names."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(str(item).strip() for item in items if str(item).strip())


def _assignments(value: Mapping[str, Any] | Sequence[str]) -> dict[str, str]:
    """A method's settings: `{"k": 5}` (Python, an experiment file) or ["k=5"] (repeated --set)."""
    if isinstance(value, Mapping):
        return {str(k): setting_text(v) for k, v in value.items()}
    return parse_assignments(list(value))


@dataclass(frozen=True)
class Option:
    """One option of a run. `target`: the config field it sets, "field" or "group.field" ("dataset.limit",
    "llm.n_threads"; "llm.backend" takes a whole model spec string). `kind`: what a value is (str, int,
    float, bool; list: names, "a,b" on the command line; dict: a method's settings, `--set k=v` repeated).
    `read`: how a given value becomes the field's value, where that is not the value itself. `flags`: the
    CLI's flags where they are not `--name`; `positive`: the flag takes a count of at least 1; `bare`: the
    value of the flag given without one."""

    name: str
    target: str
    help: str
    kind: type = str
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    positive: bool = False
    bare: str | None = None
    read: Callable[[Any], Any] | None = None

    @property
    def flag_names(self) -> tuple[str, ...]:
        """The CLI's flags of this option: `flags`, else `--name` with dashes."""
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def default(self) -> Any:
        """The config field's default (dataclasses.MISSING for one the run must be given: the method)."""
        cls: Any = EvalConfig
        *groups, leaf = self.target.split(".")
        for group in groups:
            cls = typing.get_type_hints(cls)[group]
        field = next(f for f in dataclasses.fields(cls) if f.name == leaf)
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return field.default

    def value(self, given: Any) -> Any:
        """The config field's value for a value given to this option."""
        if self.read is not None:
            return self.read(given)
        return os.fspath(given) if isinstance(given, os.PathLike) else given


OPTIONS: tuple[Option, ...] = (
    Option("method", "method", "method to evaluate"),
    # which questions
    Option("dataset", "dataset.preset", "a named dataset (hotpotqa-dev500, 2wiki-dev1000, musique-train100, "
           "bamboogle, nq-1000, triviaqa-1000, popqa-1000, multihop-rag-500, multihop-rag-facts, demo, ...)",
           metavar="PRESET"),
    Option("dataset_file", "dataset.file", "a question file of your own", metavar="PATH"),
    Option("format", "dataset.format", "its format, when not detected from the content"),
    Option("corpus", "dataset.corpus", "retrieve from this corpus instead of the questions' own paragraphs",
           metavar="PATH"),
    Option("limit", "dataset.limit", "evaluate a seeded sample of N questions", int, positive=True),
    Option("seed", "dataset.seed", "sampling seed (default 0)", int),
    Option("questions", "dataset.questions", "only the questions of this committed id list, before --limit: a "
           "list metarag ships for the dataset (headline200: the 200 questions of docs/report.md's tables) or a "
           "file of ids", metavar="LIST"),
    Option("types", "dataset.types", "only questions of these types, before --limit (2Wiki's comparison, "
           "bridge_comparison, compositional, inference; HotpotQA's comparison, bridge); the run id includes them",
           list, metavar="T1,T2", read=_names),
    Option("allow_unanswerable", "dataset.allow_unanswerable", "score questions without a gold answer as "
           "unanswerable (right only when the answer abstains: unanswerable, unknown, unsure, ...) instead of "
           "refusing the file", bool),
    # how the session runs (not hashed)
    Option("workers", "workers", "questions run concurrently (useful against a served model; 1 for embedded); "
           "with --batch, the requests of a round sent at once to a back-end that does not batch", int,
           positive=True),
    Option("batch", "batch", "run N questions in lockstep, each round's model requests as one batch (a "
           "transformers model decodes them as one padded batch, llama.cpp N sequences in one context: for sampled "
           "runs, a batched request's latency is shared); default 1: one question at a time", int,
           metavar="N", positive=True),
    # retrieval
    Option("retriever", "retriever", "retriever: bm25, dense (MiniLM + FAISS), hybrid (both fused by RRF), or "
           "remote:URL (a metarag serve-retriever service) (default: bm25)"),
    Option("reranker", "reranker", "reranker after every retrieval round: none, llm (LLM yes/no relevance judge), "
           "listwise (RankGPT sliding window), cosine (MiniLM), cross-encoder:PATH (default: none)"),
    Option("rerank_depth", "rerank_depth", "candidates retrieved for the reranker, of which k are kept "
           "(default: 20)", int, positive=True),
    # the method's settings
    Option("settings", "overrides", "override a method setting by name; repeatable", dict, flags=("--set",),
           metavar="KEY=VALUE", read=_assignments),
    Option("runs_dir", "runs_dir", "where run folders go (default: $METARAG_RUNS or runs)"),
    Option("retry_failed", "retry_failed", "retry every failed question (a re-run retries those that failed "
           "with a retryable error, a back-end down or timing out, anyway)", bool),
    Option("max_consecutive_failures", "max_consecutive_failures", "stop after N questions in a row fail with "
           "retryable errors (default: 3; 0 never stops)", int, metavar="N"),
    Option("wait", "wait", "if another process is writing the same run, wait for it instead of refusing", bool),
    # sampled answers
    Option("samples", "samples.k", "answer each question K times, sampled and seeded (sample i from --seed, the "
           "question and i), each answer resumable on its own; report adds avg@k and pass@k (default 1: one "
           "greedy answer); a larger K later on the same run adds the missing samples", int, metavar="K",
           positive=True),
    Option("temperature", "samples.temperature", "sampling temperature of --samples K (default 0.6, with top-p "
           "0.95: DeepSeek-R1's pass@1 sampling)", float, flags=("--sample-temperature",), metavar="T"),
    Option("top_p", "samples.top_p", "nucleus sampling of --samples K (default 0.95)", float, flags=("--sample-top-p",),
           metavar="P"),
    Option("samples_until", "samples.until", "all (default): K samples of every question; mixed: stop a question's "
           "samples once they hold a right and a wrong answer (EM), all that a 1..K-1 difficulty filter needs "
           "(scripts/filter-pool); avg@k and pass@k of such a run are biased",
           metavar="all|mixed"),
    # the answer judge
    Option("judge_llm", "judge_llm", "after the questions, judge every answer with an LLM (LLM-as-judge "
           "accuracy: is the prediction right given the question and gold answers?): alone the embedded model, "
           "or any spec (openai:MODEL@URL ...); verdicts kept in the run folder (answer-judge-<id>.jsonl, with "
           "the judge and its prompt), resumed on a re-run; report shows the judged accuracy and its agreement "
           "with EM and Acc", metavar="SPEC", bare="embedded"),
    Option("judge_prompt", "answer_judge.prompt", "the judge's prompt: equivalence (gold answers and prediction: "
           "the default, the one the embedded judge can give), r1-searcher (question, golden answer, prediction "
           "-> True / False: R1-Searcher's judge) or agentic-rag (ours, with the question); the last two for a "
           "judge model that can read the question"),
    # the model
    Option("llm", "llm.backend", "the LLM, one spec string: embedded (Qwen2.5-Coder-1.5B by llama.cpp, default), "
           "embedded-0.5b, gguf:PATH, hf (the 1.5B by transformers), hf-0.5b, hf:PATH (a GGUF or a model "
           "folder), openai:MODEL[@URL]; also gguf with --gguf PATH, openai with --model and --base-url"),
    Option("gguf", "llm.gguf", "model path, for --llm gguf (or hf)"),
    Option("base_url", "llm.base_url", "OpenAI-compatible server URL"),
    Option("model", "llm.model", "model name on the server, for --llm openai"),
    Option("api_key_env", "llm.api_key_env", "environment variable holding the API key (default: OPENAI_API_KEY)"),
    Option("threads", "llm.n_threads", "CPU threads for the llama.cpp back-ends (default: all cores; 1 is faster "
           "when other jobs share the cores)", int, positive=True),
    Option("n_ctx", "llm.n_ctx", "context window of the local back-ends in tokens (default: 4096); a prompt that "
           "does not fit fails that question, and a larger window makes it a new run id", int, positive=True),
    Option("prefix_chunk", "llm.prefix_chunk", "llama.cpp: evaluate prompts in chunks ending at multiples of C "
           "tokens and reuse only whole chunks from the KV cache, so a prompt's output does not depend on what ran "
           "before it (0, the default: reuse any shared prefix, faster but order-dependent); e.g. 32", int,
           metavar="C"),
    Option("lora", "llm.lora", "a LoRA adapter on a llama.cpp model: a train-agent checkpoint (or any PEFT adapter "
           "folder; converted once) or a GGUF adapter file; its sha256 joins the run id", metavar="PATH"),
    Option("response_cache", "llm.response_cache", "this run neither reads nor writes the persistent response "
           "cache", bool, flags=("--no-cache", "--no-response-cache")),
    Option("shard", "shard", "run only the I-th of N disjoint slices of the questions (every N-th of the seeded "
           "order), into the same run folder as the other N-1: N machines sharing the folder run one evaluation, "
           "and report / view read it as one run once every shard has finished", metavar="I/N",
           read=lambda text: text if isinstance(text, Shard) else Shard.parse(text)),
)
BY_NAME = {option.name: option for option in OPTIONS}
# The config's fields that are dataclasses of their own, but the model's (`llm_spec` reads a spec string)
NESTED = tuple(sorted({option.target.rpartition(".")[0] for option in OPTIONS} - {"", "llm"}))
# The options that name the model: every command that loads one takes them (`metarag ask`, the trainers).
LLM_OPTIONS = tuple(option.name for option in OPTIONS if option.target.startswith("llm."))


def config_from_options(values: Mapping[str, Any]) -> EvalConfig:
    """The run `values` (option name -> value) describe: what every front end builds its config with.
    An option left out, or None, takes the config's default. Errors name the option as its flag."""
    if unknown := sorted(set(values) - set(BY_NAME)):
        raise ConfigError(f"unknown option {unknown[0]!r}{close_matches(unknown[0], BY_NAME)}")
    given = {name: value for name, value in values.items() if value is not None}
    if "method" not in given:
        raise ConfigError("give a method to evaluate (--method NAME)")
    if "judge_prompt" in given and "judge_llm" not in given:
        raise ConfigError("--judge-prompt sets the prompt of --judge-llm; give both")
    if given.get("samples", 1) == 1 and ("temperature" in given or "top_p" in given or "samples_until" in given):
        raise ConfigError("--sample-temperature, --sample-top-p and --samples-until set the sampling of --samples K; "
                          "give K > 1")
    if given.get("samples_until", "all") != "all" and given.get("workers", 1) > 1:
        raise ConfigError("--samples-until mixed needs to know when a question is decided before its next sample "
                          "starts: drop --workers (--batch N runs N samples in lockstep and skips those not started)")
    fields: dict[str, dict[str, Any]] = {group: {} for group in ("", *NESTED)}
    for name, value in given.items():
        group, _, leaf = BY_NAME[name].target.rpartition(".")
        if group != "llm":
            fields[group][leaf] = BY_NAME[name].value(value)
    top = fields.pop("")
    runs_dir = top.get("runs_dir")
    top["runs_dir"] = str(check_folder(runs_dir or runs_dir_default(), "--runs-dir" if runs_dir
                                       else "the runs folder ($METARAG_RUNS, else ./runs)"))
    classes = typing.get_type_hints(EvalConfig)
    nested = {group: classes[group](**leaves) for group, leaves in fields.items()}
    return EvalConfig(**top, llm=llm_spec(given), **nested)


def llm_spec(values: Mapping[str, Any]) -> LLMSpec:
    """The model the options of LLM_OPTIONS in `values` name (`--llm SPEC` and the flags that fill it in)."""
    given = {name: values[name] for name in LLM_OPTIONS if values.get(name) is not None}
    fields = {BY_NAME[name].target.split(".")[1]: BY_NAME[name].value(value) for name, value in given.items()}
    return parse_llm_spec(fields.pop("backend", LLMSpec.backend), **fields)
