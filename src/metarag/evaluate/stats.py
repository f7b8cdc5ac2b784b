"""Paired significance tests, intervals, multiple-comparison correction and power for per-question scores.

The report marks a difference as significant with these, by the type of the score: a 0/1 score (EM,
cover-EM, a judge's verdict) gets the exact McNemar test (`mcnemar_exact`, the binomial test on the
discordant pairs), a continuous one (F1, tokens, latency) a seeded paired bootstrap interval of the
mean difference (`paired_difference_ci`) and a sign-flip permutation p (`approximate_randomization`);
the paired t-test stays as a named option (the MetaRAG study's own choice, its Tables 1, 4 and 5).
Each row's rates carry a Wilson interval (`wilson_interval`), its means a bootstrap one
(`mean_interval`); p-values across one table are corrected by Holm (`holm`); `mcnemar_power` gives
the difference a sample could have detected and the n an observed one would need. Thin wrappers over
`scipy.stats` (the `eval` extra, imported on first use) with the input checks, the zero-variance
cases and the p-value conventions the report documents; Holm's step-down, which scipy lacks, is the
one procedure written here.
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


def format_p(p: float) -> str:
    """A p-value to two significant digits below 0.1 (0.047, 0.0078), two decimals above; never rounded
    onto the 0.05 line from below, so a `*` (adjusted p < 0.05) is never printed beside "0.05"."""
    if p >= 0.1:
        return f"{p:.2f}"
    text = f"{p:.2g}"
    return f"{p:.3g}" if p < 0.05 <= float(text) else text


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
    One pair gives p = 1.0.
    """
    _check_resamples(n_resamples)
    diffs = _differences(a, b)
    n = int(diffs.size)
    mean = float(diffs.mean())
    if n < 2:  # one pair: both signs are as extreme as the observed one
        return TestResult(statistic=mean, p_value=1.0, mean_diff=mean, n=n)

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


# ------------------------------------------------------------------------------ 0/1 scores
@dataclass(frozen=True)
class McNemar:
    """The exact McNemar test of two methods' 0/1 scores on the same questions: `gained` questions
    right for a and wrong for b, `lost` the reverse, p the two-sided binomial test of gained against
    gained + lost at 1/2 (`scipy.stats.binomtest`); 1.0 with no discordant pair."""

    gained: int
    lost: int
    n: int
    p_value: float

    @property
    def mean_diff(self) -> float:
        return (self.gained - self.lost) / self.n


def _binary(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"{name} must hold 0/1 scores for an exact McNemar test (F1 and costs: a bootstrap)")
    return arr.astype(bool)


def mcnemar_exact(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> McNemar:
    """Exact McNemar test of a against b on paired 0/1 scores (see `McNemar`)."""
    _differences(a, b)
    x, y = _binary(a, "a"), _binary(b, "b")
    gained, lost = int(np.sum(x & ~y)), int(np.sum(~x & y))
    p = 1.0 if gained + lost == 0 else float(_scipy_stats().binomtest(gained, gained + lost, 0.5).pvalue)
    return McNemar(gained, lost, int(x.size), min(1.0, p))


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval at `level` (a rate's or a mean's, or a paired mean difference's)."""

    estimate: float
    low: float
    high: float
    level: float = 0.95


def wilson_interval(successes: int, n: int, level: float = 0.95) -> Interval:
    """A rate k / n with its Wilson score interval (`scipy.stats.binomtest(...).proportion_ci`)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"a rate needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    ci = _scipy_stats().binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return Interval(successes / n, float(ci.low), float(ci.high), level)


def mean_interval(values: Sequence[float] | np.ndarray, n_resamples: int = 10_000, seed: int = 0,
                  level: float = 0.95) -> Interval:
    """A mean with its percentile bootstrap interval (`scipy.stats.bootstrap`, seeded); a constant
    sample's interval is the value itself."""
    _check_resamples(n_resamples)
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise ValueError("a mean's interval needs a non-empty one-dimensional sample of finite values")
    mean = float(arr.mean())
    if np.all(arr == arr[0]):
        return Interval(mean, mean, mean, level)
    result = _scipy_stats().bootstrap((arr,), np.mean, n_resamples=n_resamples,
                                      batch=max(1, _BATCH_ELEMENTS // arr.size), vectorized=True,
                                      confidence_level=level, method="percentile",
                                      random_state=np.random.default_rng(seed))
    return Interval(mean, float(result.confidence_interval.low), float(result.confidence_interval.high), level)


def paired_difference_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                         n_resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> Interval:
    """mean(a − b) over paired scores with its percentile bootstrap interval: the question pairs
    resampled with replacement `n_resamples` times (seeded)."""
    return mean_interval(_differences(a, b), n_resamples=n_resamples, seed=seed, level=level)


# ------------------------------------------------------------------------------ a table's comparisons
def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values of one family of tests, in the given order: sorted ascending,
    the i-th smallest (from 0) times (m − i), made non-decreasing, capped at 1. NaN stays NaN and does
    not count in m. (scipy has no Holm; `statsmodels.stats.multitest.multipletests(method="holm")`
    gives the same numbers.)"""
    values = [float(p) for p in p_values]
    known = sorted((p, i) for i, p in enumerate(values) if not math.isnan(p))
    m = len(known)
    out = [math.nan] * len(values)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


# ------------------------------------------------------------------------------ power
def _critical_counts(m: np.ndarray, alpha: float) -> np.ndarray:
    """For each number m of discordant pairs, the largest count c with 2 P(X <= c) <= alpha for X ~
    Bin(m, 1/2): the exact two-sided test rejects when min(gained, lost) <= c (−1: never)."""
    binom = _scipy_stats().binom
    c = np.floor(binom.ppf(alpha / 2, m, 0.5)).astype(int)
    # ppf gives the smallest c with P(X <= c) >= alpha/2: step down while the tail is too heavy
    c = np.where(2 * binom.cdf(c, m, 0.5) > alpha, c - 1, c)
    c = np.where(2 * binom.cdf(c + 1, m, 0.5) <= alpha, c + 1, c)
    return np.where(m > 0, c, -1)


def mcnemar_power(n: int, discordance: float, diff: float, alpha: float = 0.05) -> float:
    """The power of the exact McNemar test at level `alpha` with n pairs, when each pair is discordant
    with probability `discordance` (ψ) and the two methods' rates differ by `diff` (δ, |δ| <= ψ): the
    number of discordant pairs M ~ Bin(n, ψ), and given M the gains G ~ Bin(M, (ψ + δ) / 2ψ); power =
    E[P(the test rejects | M)], exact (unconditional over M, as Suissa & Shuster, 1991)."""
    if n < 1 or not 0 <= discordance <= 1 or abs(diff) > discordance + 1e-12:
        raise ValueError(f"power needs n >= 1, 0 <= discordance <= 1 and |diff| <= discordance, got "
                         f"n={n}, discordance={discordance}, diff={diff}")
    if discordance == 0:
        return 0.0
    binom = _scipy_stats().binom
    m = np.arange(n + 1)
    weight = binom.pmf(m, n, discordance)
    c = _critical_counts(m, alpha)
    p_gain = min(1.0, max(0.0, (discordance + abs(diff)) / (2 * discordance)))
    reject = np.where(c >= 0, binom.cdf(c, m, p_gain) + binom.sf(m - c - 1, m, p_gain), 0.0)
    # c >= m/2 cannot happen at alpha < 1 (both tails would overlap); guard the sum anyway
    return float(min(1.0, np.sum(weight * np.minimum(reject, 1.0))))


@dataclass(frozen=True)
class Power:
    """What a paired comparison of 0/1 scores could tell: `detectable`, the smallest difference in
    rates the exact McNemar test finds with probability `power` at this n and the observed
    discordance (None: not even every discordant pair one way would); `n_needed`, the pairs the
    observed difference would need (None: no difference observed, or beyond `max_n`)."""

    n: int
    discordance: float
    observed: float
    detectable: float | None
    n_needed: int | None
    power: float = 0.8
    alpha: float = 0.05


def power_analysis(gained: int, lost: int, n: int, power: float = 0.8, alpha: float = 0.05,
                   max_n: int = 1_000_000) -> Power:
    """`Power` of a comparison with `gained` / `lost` discordant pairs out of n (see `mcnemar_power`).
    The detectable difference is found by bisection (power rises with δ); the n needed by doubling
    and bisection on n, the first n where the power reaches `power` (an exact test's power is
    saw-toothed in n, so a slightly larger n can fall back just below it)."""
    if n < 1 or gained < 0 or lost < 0 or gained + lost > n:
        raise ValueError(f"power needs 0 <= gained + lost <= n, got {gained} + {lost} of {n}")
    psi, delta = (gained + lost) / n, (gained - lost) / n
    detectable: float | None = None
    if psi > 0 and mcnemar_power(n, psi, psi, alpha) >= power:
        low, high = 0.0, psi
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (low, mid) if mcnemar_power(n, psi, mid, alpha) >= power else (mid, high)
        detectable = high
    needed: int | None = None
    if delta != 0:
        def enough(size: int) -> bool:
            return mcnemar_power(size, psi, delta, alpha) >= power

        high = max(2, n)
        while not enough(high) and high < max_n:
            high *= 2
        if enough(high):
            low = 1
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (low, mid) if enough(mid) else (mid, high)
            needed = high
    return Power(n, psi, delta, detectable, needed, power, alpha)
