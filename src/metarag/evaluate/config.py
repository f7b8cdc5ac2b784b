"""The one description of a run: `EvalConfig` (with `DatasetSpec`, `Samples` and `llm.registry.LLMSpec`).

The CLI's `eval` options, `metarag.run`'s keywords and an experiment file's fields are all read into
it through one table (`evaluate/options.py`); `evaluate/resolve.py` checks it against every registry
and hashes what can change an answer into the run id.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from metarag.errors import ConfigError
from metarag.evaluate.runs import Shard
from metarag.judges.correctness import AnswerJudge
from metarag.llm.registry import LLMSpec
from metarag.methods.runner import Sampling
from metarag.settings import check_ranges, setting


@dataclass(frozen=True)
class DatasetSpec:
    """Which questions: a preset name, or a file with an optional format and corpus."""

    preset: str | None = None
    file: str | None = None
    format: str | None = None
    corpus: str | None = None
    limit: int | None = None
    seed: int = 0
    allow_unanswerable: bool = False  # score questions without a gold answer as unanswerable
    types: tuple[str, ...] = ()  # only questions of these types (HotpotQA's / 2Wiki's), before the sample
    # a committed list of question ids (`--questions`): a list shipped for the preset ("headline200") or a
    # file of ids; applied before `limit`, which then samples within it
    questions: str | None = None

    def label(self) -> str:
        return self.preset or Path(self.file or "dataset").stem


# The most answers per question a sampled run takes: pass@k is reported up to k = 1,024 (Chen et al., 2021,
# §2.1, k = 100; Brown et al., 2024, up to 10,000 on small sets), and the run's to-do list is questions x k.
MAX_SAMPLES = 1024


@dataclass(frozen=True)
class Samples:
    """k sampled answers per question (`eval --samples k`), scored as avg@k and pass@k. k = 1: one greedy
    answer, as every method's own decoding. k > 1: every answer is sampled at `temperature` / `top_p`,
    0.6 / 0.95 by default, the sampling DeepSeek-R1 reports pass@1 over k samples with (Guo et al., 2025,
    §3.1, evaluation setup); sample i of a question is seeded by `sample_seed(run seed, question, i)`.
    The sampling is hashed into the run id, k is not: `--samples 8` on a 4-sample run adds samples 4-7.

    `until`: "all" takes k samples of every question; "mixed" stops a question's samples once they hold
    a right and a wrong answer (EM). That is all a difficulty filter of right counts 1..k-1 needs to
    know (R1-Searcher's 1..4 of 5, `train.difficulty`): such a question is kept whatever its other
    samples say, and the ones it skips cost the filter nothing. Its samples are the same seeded samples
    a full run takes (so "mixed" is not hashed, and a later run with "all" adds the rest), but avg@k
    and pass@k over a run stopped early are biased towards its mixed questions: a filter's run, read
    by `scripts/filter-pool`. Not with --workers (each stop must be known before the next sample
    starts); with --batch N the samples of a round run together and a decided question's samples not yet
    started are skipped."""

    k: int = setting(1, ge=1)
    temperature: float = setting(0.6, gt=0)
    top_p: float = setting(0.95, gt=0, le=1)
    until: Literal["all", "mixed"] = "all"

    def __post_init__(self) -> None:
        if isinstance(self.k, int) and self.k > MAX_SAMPLES:  # before anything is sized by k
            raise ConfigError(f"--samples {self.k}: at most {MAX_SAMPLES} answers per question")
        check_ranges(self)

    def sampling(self) -> Sampling | None:
        """The runner's decoding override of a sampled run; None (the methods' greedy decoding) for k = 1."""
        return Sampling(self.temperature, self.top_p) if self.k > 1 else None


def sample_seed(run_seed: int, question_id: str, sample: int) -> int:
    """The rollout seed of sample `sample` of a question in a run seeded `run_seed` (`--seed`): the same
    on every re-run and resume, distinct across questions and samples, 31 bits."""
    digest = hashlib.blake2b(f"{run_seed}:{question_id}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF


@dataclass(frozen=True)
class EvalConfig:
    """Everything that defines a run; its resolved form is saved and hashed into the run id.

    How a session runs is not hashed: `workers`, `retry_failed` (retry every failed question, not
    only the retryable ones), `max_consecutive_failures` (stop after this many questions in a row
    fail with retryable errors, the sign of a back-end gone down; 0 never stops) and `wait` (wait for
    another writer of the same run folder instead of refusing), `batch` (run up to this many questions
    in lockstep, each round's model requests sent as one batch: `run_many`; then `workers` is how many
    of a round's requests go out at once to a back-end that does not batch, e.g. a server's slots),
    `shard` (run only this slice of the questions, into the same run folder as the other shards).
    `samples`: k answers per question (`Samples`; its sampling is hashed, k is not). `judge_llm`: after
    the questions, judge every answer with this model (a spec string) and `answer_judge`, the verdicts
    kept in the run folder beside the results, not hashed (`evaluate/answer_judge.py`).
    Every field is set by one option of `evaluate.options.OPTIONS` (a test holds them to it)."""

    method: str
    dataset: DatasetSpec
    llm: LLMSpec = LLMSpec()
    retriever: str = "bm25"
    reranker: str = "none"
    rerank_depth: int = 20
    overrides: Mapping[str, str] = field(default_factory=dict)
    workers: int = 1
    runs_dir: str = "runs"
    retry_failed: bool = False
    max_consecutive_failures: int = 3
    wait: bool = False
    batch: int = 1
    shard: Shard | None = None
    samples: Samples = Samples()
    judge_llm: str | None = None
    answer_judge: AnswerJudge = AnswerJudge()


def runs_dir_default() -> str:
    """Where run folders go when none is named: `$METARAG_RUNS`, else ./runs."""
    return os.environ.get("METARAG_RUNS", "runs")
