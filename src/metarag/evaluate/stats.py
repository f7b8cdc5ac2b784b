"""Paired significance tests on per-question scores of two methods over the same questions.

The report marks a difference as significant with these. Pure numpy and math (no scipy at run
time): the paired t-test gets its Student-t tail from a regularized incomplete beta function
computed by continued fraction (modified Lentz's method, as in Press et al., Numerical Recipes,
§6.4); the bootstrap and the randomization test are vectorized over resamples in chunks.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_BETACF_MAX_ITER = 10_000
_BETACF_EPS = 1e-15
_TINY = 1e-300
# Resampling draws about this many index or sign entries at once; fixed, so results depend only on
# the data, the number of resamples and the seed.
_CHUNK_ELEMENTS = 2_000_000


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


# ---------------------------------------------------------------------------- incomplete beta
def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by modified Lentz's method (NR §6.4 betacf)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _BETACF_MAX_ITER + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _BETACF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1.

    Same argument order and meaning as `scipy.special.betainc`. The continued fraction converges
    fast for x < (a + 1) / (a + b + 2); above that the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) is used.
    """
    if a <= 0 or b <= 0:
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """The two-sided tail probability P(|T| >= |t|) of Student's t with `df` degrees of freedom."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    # P(|T| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2); df / (df + t^2) is computed without
    # squaring a huge t into overflow.
    x = 1.0 / (1.0 + (t / math.sqrt(df)) ** 2) if abs(t) < 1e150 else 0.0
    return min(1.0, betainc(df / 2.0, 0.5, x))


# ------------------------------------------------------------------------------------- tests
def paired_t_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> TestResult:
    """Two-sided paired Student t-test of mean(a - b) = 0 (same result as `scipy.stats.ttest_rel`).

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
    sd = float(diffs.std(ddof=1))
    t = mean / (sd / math.sqrt(n))
    return TestResult(statistic=t, p_value=student_t_two_sided_p(t, n - 1), mean_diff=mean, n=n)


def _tie_tolerance(diffs: np.ndarray) -> float:
    """Slack, on the scale of sums of differences, under which two resampled sums count as equal.

    Sums of the same values in a different order can differ by rounding; a resample that equals the
    observed sum must count as "at least as extreme", not flip on the last bit.
    """
    return 1e-9 * float(np.abs(diffs).sum())


def _chunk_sizes(n_resamples: int, n: int) -> list[int]:
    rows = max(1, _CHUNK_ELEMENTS // n)
    return [min(rows, n_resamples - start) for start in range(0, n_resamples, rows)]


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                     n_resamples: int = 10_000, seed: int = 0) -> TestResult:
    """Two-sided paired bootstrap test of mean(a - b) = 0, by the "shift" method.

    Draws `n_resamples` resamples of the n question pairs with replacement and computes each
    resample's mean difference m*. The bootstrap distribution centred on the observed mean m
    stands in for the null, so p = share of resamples with |m* - m| >= |m| (ties within rounding
    count). p = 1.0 when m = 0. The statistic reported is m itself. Deterministic for a given seed.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    diffs = _differences(a, b)
    n = int(diffs.size)
    observed_sum = float(diffs.sum())
    threshold = abs(observed_sum) - _tie_tolerance(diffs)
    rng = np.random.default_rng(seed)
    extreme = 0
    for rows in _chunk_sizes(n_resamples, n):
        sums = diffs[rng.integers(0, n, size=(rows, n))].sum(axis=1)
        extreme += int(np.count_nonzero(np.abs(sums - observed_sum) >= threshold))
    mean = observed_sum / n
    return TestResult(statistic=mean, p_value=extreme / n_resamples, mean_diff=mean, n=n)


def approximate_randomization(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                              n_resamples: int = 10_000, seed: int = 0) -> TestResult:
    """Two-sided paired approximate randomization (permutation) test of mean(a - b) = 0.

    Under the null the two methods' scores on a question are exchangeable, so each paired
    difference's sign is flipped at random. With `n_resamples` random flips,
    p = (number of flips whose |mean difference| >= the observed |mean difference| + 1)
    / (n_resamples + 1), ties within rounding counted; p is never 0. The statistic reported is the
    observed mean difference. Deterministic for a given seed.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    diffs = _differences(a, b)
    n = int(diffs.size)
    observed_sum = float(diffs.sum())
    threshold = abs(observed_sum) - _tie_tolerance(diffs)
    rng = np.random.default_rng(seed)
    extreme = 0
    for rows in _chunk_sizes(n_resamples, n):
        signs = rng.integers(0, 2, size=(rows, n), dtype=np.int8) * 2 - 1
        sums = signs @ diffs
        extreme += int(np.count_nonzero(np.abs(sums) >= threshold))
    mean = observed_sum / n
    return TestResult(statistic=mean, p_value=(extreme + 1) / (n_resamples + 1), mean_diff=mean, n=n)
