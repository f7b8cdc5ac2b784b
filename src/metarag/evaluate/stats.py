"""Paired significance tests on per-question scores of two methods over the same questions.

The report marks a difference as significant with these. Thin wrappers over `scipy.stats` (the
`eval` extra, imported on first use): `ttest_rel`, `bootstrap` (its bootstrap distribution) and
`permutation_test` (sign flips of the paired differences), with the input checks, the
zero-variance cases and the p-value conventions the report documents.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metarag.errors import MissingDependency

# Resampling works on about this many values at once (scipy's `batch`), so memory stays bounded.
_BATCH_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class TestResult:
    """The outcome of one paired test: its statistic, two-sided p-value, mean of a - b, and n pairs."""

    __test__ = False  # not a pytest test class, despite the name

    statistic: float
    p_value: float
    mean_diff: float
    n: int


def significance_mark(p: float, alpha: float = 0.05) -> str:
    """The report's mark for a p-value: "*" when p < alpha, else "" (also for a NaN p-value)."""
    return "*" if p < alpha else ""


def _scipy_stats() -> Any:
    try:
        import scipy.stats
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "scipy":
            raise
        raise MissingDependency("scipy", "eval") from None
    return scipy.stats


def _differences(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> np.ndarray:
    """The paired differences a - b as a float vector, after checking the inputs pair up."""
    a_arr = np.asarray(a, dtype=np.float64)
    b_arr = np.asarray(b, dtype=np.float64)
    if a_arr.ndim != 1 or b_arr.ndim != 1:
        raise ValueError("paired scores must be one-dimensional sequences")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired scores differ in length: {a_arr.size} vs {b_arr.size}")
    if a_arr.size == 0:
        raise ValueError("no paired scores to test")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("paired scores must be finite (a failed question scores 0, not NaN)")
    return a_arr - b_arr


def _check_resamples(n_resamples: int) -> None:
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")


def _tie_tolerance(diffs: np.ndarray) -> float:
    """Slack, on the scale of mean differences, under which two resampled means count as equal: the
    same values summed in another order differ by rounding, and a tie must count as "as extreme"."""
    return 1e-9 * float(np.abs(diffs).mean())


def paired_t_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> TestResult:
    """Two-sided paired Student t-test of mean(a - b) = 0 (`scipy.stats.ttest_rel`).

    With zero variance in the differences, where the t statistic is undefined: if every difference
    is 0 the result is statistic 0, p = 1.0; if every difference is the same non-zero value it is
    statistic +-inf, p = 0.0. Needs at least two pairs; mismatched lengths raise ValueError.
    """
    diffs = _differences(a, b)
    n = int(diffs.size)
    if n < 2:
        raise ValueError("a paired t-test needs at least two pairs")
    mean = float(diffs.mean())
    if np.all(diffs == diffs[0]):
        if diffs[0] == 0:
            return TestResult(statistic=0.0, p_value=1.0, mean_diff=0.0, n=n)
        return TestResult(statistic=math.copysign(math.inf, diffs[0]), p_value=0.0, mean_diff=mean, n=n)
    result = _scipy_stats().ttest_rel(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    return TestResult(statistic=float(result.statistic), p_value=float(result.pvalue), mean_diff=mean, n=n)


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                     n_resamples: int = 10_000, seed: int = 0) -> TestResult:
    """Two-sided paired bootstrap test of mean(a - b) = 0, by the "shift" method.

    `scipy.stats.bootstrap` resamples the n question pairs with replacement `n_resamples` times; its
    bootstrap distribution of the mean difference m*, centred on the observed mean m, stands in for
    the null, so p = share of resamples with |m* - m| >= |m| (ties within rounding count). p = 1.0
    when m = 0, 0.0 when every difference is the same non-zero value. The statistic reported is m.
    Deterministic for a given seed.
    """
    _check_resamples(n_resamples)
    diffs = _differences(a, b)
    n = int(diffs.size)
    mean = float(diffs.mean())
    if mean == 0.0 or np.all(diffs == diffs[0]):
        return TestResult(statistic=mean, p_value=1.0 if mean == 0.0 else 0.0, mean_diff=mean, n=n)
    result = _scipy_stats().bootstrap(
        (diffs,), np.mean, n_resamples=n_resamples, batch=max(1, _BATCH_ELEMENTS // n), vectorized=True,
        method="percentile", random_state=np.random.default_rng(seed))
    shifted = np.abs(result.bootstrap_distribution - mean)
    extreme = int(np.count_nonzero(shifted >= abs(mean) - _tie_tolerance(diffs)))
    return TestResult(statistic=mean, p_value=extreme / n_resamples, mean_diff=mean, n=n)


def approximate_randomization(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                              n_resamples: int = 10_000, seed: int = 0) -> TestResult:
    """Two-sided paired approximate randomization (permutation) test of mean(a - b) = 0.

    Under the null the two methods' scores on a question are exchangeable, so each paired
    difference's sign is flipped at random: `scipy.stats.permutation_test` with
    `permutation_type="samples"` on the differences, statistic |mean difference|. With
    `n_resamples` random flips p = (flips with |mean| >= the observed |mean|, + 1) / (n_resamples + 1),
    never 0; when 2**n <= n_resamples every sign pattern is enumerated and p is exact. Ties within
    rounding count. The statistic reported is the observed mean difference. Deterministic per seed.
    """
    _check_resamples(n_resamples)
    diffs = _differences(a, b)
    n = int(diffs.size)
    mean = float(diffs.mean())

    def abs_mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.abs(np.mean(x, axis=axis))

    result = _scipy_stats().permutation_test(
        (diffs,), abs_mean, permutation_type="samples", vectorized=True, n_resamples=n_resamples,
        batch=max(1, _BATCH_ELEMENTS // n), alternative="greater", random_state=np.random.default_rng(seed))
    return TestResult(statistic=mean, p_value=float(result.pvalue), mean_diff=mean, n=n)


@dataclass(frozen=True)
class Shift:
    """mean(later) − mean(earlier) of two independent samples, with a percentile bootstrap interval."""

    diff: float
    low: float
    high: float
    level: float


def mean_shift(earlier: Sequence[float], later: Sequence[float], n_resamples: int = 10_000, seed: int = 0,
               level: float = 0.95) -> Shift:
    """The shift of the mean from `earlier` to `later` (a training curve's first and last steps),
    with the percentile bootstrap interval at `level`: each sample resampled with replacement on its
    own, `n_resamples` times (seeded). Pure numpy."""
    _check_resamples(n_resamples)
    a, b = np.asarray(earlier, dtype=float), np.asarray(later, dtype=float)
    if a.size == 0 or b.size == 0 or np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("mean_shift needs two non-empty samples without NaN")
    rng = np.random.default_rng(seed)
    draws = (rng.choice(b, (n_resamples, b.size)).mean(axis=1) - rng.choice(a, (n_resamples, a.size)).mean(axis=1))
    tail = (1.0 - level) / 2
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return Shift(float(b.mean() - a.mean()), float(low), float(high), level)


def cohen_kappa(a: Sequence[float], b: Sequence[float]) -> float:
    """Cohen's kappa of two raters' binary calls on the same items (1 = right): (p_o - p_e) / (1 - p_e),
    p_o their agreement, p_e the agreement expected from each one's share of 1s. NaN when undefined:
    no items, or both raters make one call throughout (p_e = 1)."""
    if len(a) != len(b):
        raise ValueError(f"kappa needs paired calls, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return math.nan
    x, y = [bool(v) for v in a], [bool(v) for v in b]
    observed = sum(p == q for p, q in zip(x, y)) / n
    share_x, share_y = sum(x) / n, sum(y) / n
    expected = share_x * share_y + (1 - share_x) * (1 - share_y)
    return math.nan if expected >= 1 else (observed - expected) / (1 - expected)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one question from n samples, c of them right (Chen et al., 2021, the
    Codex paper, §2.1): 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without replacement
    hold a right one; with k = n, 1 if any is right."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
