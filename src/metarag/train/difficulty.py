"""The difficulty filter of a training pool, as R1-Searcher selects its training questions (Song et al.,
2025, §2.1: questions the model answers right in some but not all of its rollouts): from a sampled
run of the untrained agent over the pool (`eval --samples K`), the questions right in `low`..`high` of
their first K samples. A question always right or always wrong gives GRPO's group no outcome gradient,
so it spends a step's rollouts on nothing.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metarag.errors import ConfigError, DataError


@dataclass(frozen=True)
class Filtered:
    """The questions kept, and how many questions had each number of right samples (0..k); `mixed`: the
    questions whose samples stopped early at a right and a wrong one (`eval --samples-until mixed`), right
    in 1..k-1 of k whatever the rest would say; `incomplete`: those the window cannot decide yet."""

    kept: tuple[str, ...]
    right_counts: dict[int, int]
    k: int
    incomplete: tuple[str, ...] = ()
    mixed: tuple[str, ...] = ()

    @property
    def measured(self) -> int:
        return sum(self.right_counts.values()) + len(self.mixed)


def right_counts(samples: Sequence[tuple[str, int, float]], k: int) -> tuple[dict[str, int], tuple[str, ...]]:
    """Per question, how many of its samples 0..k-1 are right (EM 1), from (question id, sample, EM)
    triples; the questions with fewer than k samples apart."""
    seen: dict[str, dict[int, float]] = {}
    for qid, sample, em in samples:
        if sample < k:
            seen.setdefault(qid, {})[sample] = em
    complete = {q: int(sum(v.values())) for q, v in seen.items() if len(v) == k}
    return complete, tuple(q for q, v in seen.items() if len(v) < k)


def difficulty_filter(samples: Sequence[tuple[str, int, float]], k: int = 5, low: int = 1,
                      high: int = 4) -> Filtered:
    """The questions right in `low`..`high` of their first k samples (R1-Searcher's rule at k = 5:
    1..4), in the order they first appear. A question with fewer than k samples, a right and a wrong
    among them (a run sampled `--samples-until mixed`), is right in 1..k-1 of k: kept when the window
    holds all of 1..k-1, else left undecided with the other incomplete questions."""
    if not 0 <= low <= high <= k or k < 1:
        raise ConfigError(f"a difficulty window needs 0 <= low <= high <= k, got {low}..{high} of {k}")
    counts, incomplete = right_counts(samples, k)
    mixed: tuple[str, ...] = ()
    if low <= 1 and high >= k - 1:
        outcomes: dict[str, set[bool]] = {}
        for qid, sample, em in samples:
            if sample < k:
                outcomes.setdefault(qid, set()).add(em == 1.0)
        mixed = tuple(q for q in incomplete if len(outcomes[q]) == 2)
        incomplete = tuple(q for q in incomplete if len(outcomes[q]) < 2)
    order = list(dict.fromkeys(q for q, _, _ in samples))
    decided = set(mixed)
    kept = tuple(q for q in order if q in decided or (q in counts and low <= counts[q] <= high))
    return Filtered(kept, dict(sorted(Counter(counts.values()).items())), k, incomplete, mixed)


def run_samples(run_path: str | Path, *more: str | Path) -> list[tuple[str, int, float]]:
    """The (question id, sample, EM) of every answer of a sampled run folder; with `more` run folders of the
    same agent and sampling over (some of) the same questions, theirs too, a (question, sample) that an
    earlier folder holds taken from it. Samples are independent draws of one policy, so a question's can
    come from two runs: the filter's last shard and the same questions sampled from the other end, in reverse
    order, by the stream that would otherwise wait (scripts/cpu-queue), merge here."""
    from metarag.evaluate.report import load_run

    seen: set[tuple[str, int]] = set()
    out = []
    for path in (run_path, *more):
        run = load_run(path)
        if not run.samples:
            raise DataError("the run holds one answer a question: the filter needs `eval --samples K` with K > 1",
                            path=str(path))
        for r in run.samples:
            if (r.question_id, r.sample) not in seen:
                seen.add((r.question_id, r.sample))
                out.append((r.question_id, r.sample, r.scores.em))
    return out


def write_filtered(pool_file: str | Path, kept: Sequence[str], out_file: str | Path) -> int:
    """Copy the lines of a pool's question file (JSON lines with "id") whose id is kept; returns how many."""
    wanted = set(kept)
    lines = [line for line in Path(pool_file).read_text().splitlines()
             if line.strip() and json.loads(line)["id"] in wanted]
    Path(out_file).write_text("".join(line + "\n" for line in lines))
    return len(lines)


@dataclass(frozen=True)
class FilterProgress:
    """Where a filter still sampling stands: `decided` questions, `kept` of them, the `answers` (samples)
    the decided ones took, and at the kept rate so far how many of the pool's `pool` questions keep
    `enough` (`needed`; None when the whole pool is expected to keep fewer) and the answers that takes
    beyond those already sampled (`more_answers`, at the decided questions' answers a question)."""

    decided: int
    kept: int
    answers: int
    pool: int
    enough: int
    needed: int | None
    more_answers: int | None


def filter_progress(samples: Sequence[tuple[str, int, float]], pool: int, enough: int, k: int = 5, low: int = 1,
                    high: int = 4) -> FilterProgress:
    """`difficulty_filter` of the samples so far, projected to `enough` kept questions out of a pool of
    `pool` questions at the kept rate so far (the questions come in a seeded random order, so the rate so
    far estimates the rest's). Nothing decided: no projection."""
    result = difficulty_filter(samples, k=k, low=low, high=high)
    undecided = set(result.incomplete)
    answers = sum(1 for q, i, _ in samples if i < k and q not in undecided)
    decided, kept = result.measured, len(result.kept)
    if not decided or not kept:
        return FilterProgress(decided, kept, answers, pool, enough, None, None)
    needed = math.ceil(enough * decided / kept)
    if needed > pool:
        return FilterProgress(decided, kept, answers, pool, enough, None, round((pool - decided) * answers / decided))
    more = round(max(needed - decided, 0) * answers / decided)
    return FilterProgress(decided, kept, answers, pool, enough, needed, more)
