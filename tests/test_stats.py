"""Paired significance tests (scipy.stats underneath) against hand-computed and exactly enumerable cases."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from metarag.errors import MissingDependency
from metarag.evaluate.stats import (
    TestResult,
    approximate_randomization,
    paired_bootstrap,
    paired_t_test,
    significance_mark,
)

scipy_stats = pytest.importorskip("scipy.stats")


def _em_vectors(n: int, p_a: float, p_b: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two 0/1 exact-match-like score vectors over the same n questions."""
    rng = np.random.default_rng(seed)
    return (rng.random(n) < p_a).astype(float), (rng.random(n) < p_b).astype(float)


def _pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(42)
    base = rng.normal(size=37)
    return [
        (np.array([0.1, 0.5, 0.9, 0.3, 0.7]), np.array([0.2, 0.4, 0.6, 0.1, 0.8])),
        (base + rng.normal(0.3, 1.0, size=37), base),
        (rng.random(120), rng.random(120)),                        # F1-like scores
        _em_vectors(500, 0.40, 0.45, seed=1),
        _em_vectors(500, 0.35, 0.36, seed=2),
        _em_vectors(500, 0.30, 0.50, seed=3),                      # p-value far in the tail
        (np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0, 0.0])),   # df = 2
        (np.array([3.0, 1.0]), np.array([1.0, 2.0])),             # df = 1
    ]


@pytest.mark.parametrize(("a", "b"), _pairs())
def test_paired_t_test_matches_scipy_ttest_rel(a, b):
    ours = paired_t_test(a, b)
    ref = scipy_stats.ttest_rel(a, b)
    assert ours.n == len(a)
    assert ours.mean_diff == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert ours.statistic == pytest.approx(float(ref.statistic), rel=1e-9)
    assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-6, abs=1e-6)
    # In the far tail the relative error matters too: the report prints small p-values.
    if ref.pvalue < 1e-3:
        assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-6)


def test_paired_t_test_sign_follows_a_minus_b():
    a, b = _em_vectors(500, 0.30, 0.50, seed=3)
    forward, backward = paired_t_test(a, b), paired_t_test(b, a)
    assert forward.statistic < 0 < backward.statistic
    assert forward.p_value == pytest.approx(backward.p_value, rel=1e-12)


def test_paired_t_test_zero_variance():
    same = paired_t_test([0.2, 0.5, 1.0], [0.2, 0.5, 1.0])
    assert same == TestResult(statistic=0.0, p_value=1.0, mean_diff=0.0, n=3)
    shifted = paired_t_test([1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, -1.0])
    assert shifted.p_value == 0.0
    assert shifted.statistic == math.inf
    assert shifted.mean_diff == 1.0
    assert paired_t_test([0.0, 0.0], [1.0, 1.0]).statistic == -math.inf


@pytest.mark.parametrize("test", [paired_t_test, paired_bootstrap, approximate_randomization])
def test_inputs_must_pair_up(test):
    with pytest.raises(ValueError):
        test([1.0, 0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError):
        test([], [])
    with pytest.raises(ValueError):
        test([1.0, float("nan")], [0.0, 0.0])
    with pytest.raises(ValueError):
        test([[1.0, 0.0]], [[0.0, 0.0]])


def test_t_test_needs_two_pairs():
    with pytest.raises(ValueError):
        paired_t_test([1.0], [0.0])


def test_paired_t_test_on_a_hand_computed_case():
    # differences 1, 0, 1: mean 2/3, sd sqrt(1/3), t = (2/3) / (sqrt(1/3) / sqrt(3)) = 2 with df = 2,
    # where Student's t has the closed form F(t) = 1/2 + t / (2 sqrt(2 + t^2)): p = 1 - 2 / sqrt(6)
    result = paired_t_test([1.0, 0.0, 1.0], [0.0, 0.0, 0.0])
    assert result.statistic == pytest.approx(2.0, rel=1e-12)
    assert result.p_value == pytest.approx(1 - 2 / math.sqrt(6), rel=1e-9)


def test_a_missing_scipy_names_the_eval_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    for test in (paired_t_test, paired_bootstrap, approximate_randomization):
        with pytest.raises(MissingDependency, match=r"metarag\[eval\]"):
            test([1.0, 0.0, 1.0], [0.0, 0.0, 0.5])


def test_resampling_tests_agree_with_t_test_on_clearly_different_scores():
    a, b = _em_vectors(500, 0.30, 0.50, seed=3)
    assert paired_t_test(a, b).p_value < 1e-6
    assert paired_bootstrap(a, b).p_value < 1e-3
    assert approximate_randomization(a, b).p_value == pytest.approx(1 / 10_001)


def test_resampling_tests_agree_with_t_test_on_clearly_same_scores():
    rng = np.random.default_rng(10)
    a, b = rng.random(500), rng.random(500)
    t_p = paired_t_test(a, b).p_value
    assert t_p > 0.5
    assert paired_bootstrap(a, b).p_value == pytest.approx(t_p, abs=0.03)
    assert approximate_randomization(a, b).p_value == pytest.approx(t_p, abs=0.03)


@pytest.mark.parametrize(("a", "b"), [
    _em_vectors(500, 0.40, 0.45, seed=1),
    tuple(np.random.default_rng(7).random((2, 500))),
])
def test_resampling_tests_agree_with_t_test_at_moderate_p(a, b):
    # Where a wrong p-value definition (one-sided, uncentred, off by a factor 2) would show.
    t_p = paired_t_test(a, b).p_value
    assert 0.01 < t_p < 0.5
    assert paired_bootstrap(a, b).p_value == pytest.approx(t_p, rel=0.1)
    assert approximate_randomization(a, b).p_value == pytest.approx(t_p, rel=0.1)


def test_randomization_p_value_on_an_exactly_enumerable_case():
    # Differences 1, 2, 3: of the 8 sign patterns only +++ and --- reach |sum| >= 6, so p = 1/4;
    # the ties are exactly the point of the ">=".
    result = approximate_randomization([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], n_resamples=100_000, seed=3)
    assert result.p_value == pytest.approx(0.25, abs=0.01)
    assert result.mean_diff == pytest.approx(2.0)
    assert result.statistic == pytest.approx(2.0)


def test_randomization_ties_count_despite_rounding():
    # 0.1 + 0.2 + 0.3 in another summation order differs in the last bit; ties must still count.
    result = approximate_randomization([0.1, 0.2, 0.3], [0.0, 0.0, 0.0], n_resamples=100_000, seed=3)
    assert result.p_value == pytest.approx(0.25, abs=0.01)


def test_bootstrap_p_value_on_an_exactly_enumerable_case():
    # Differences 0, 1: resampled means 0, 1/2, 1 with chances 1/4, 1/2, 1/4; shifted by the
    # observed 1/2 only 0 and 1 reach |m* - 1/2| >= 1/2, so p = 1/2.
    result = paired_bootstrap([0.0, 1.0], [0.0, 0.0], n_resamples=100_000, seed=3)
    assert result.p_value == pytest.approx(0.5, abs=0.01)
    assert result.mean_diff == 0.5


def test_resampling_tests_on_degenerate_differences():
    same = [0.3, 0.7, 1.0, 0.0]
    assert paired_bootstrap(same, same).p_value == 1.0
    assert approximate_randomization(same, same).p_value == 1.0
    shifted = [x + 0.25 for x in same]
    assert paired_bootstrap(shifted, same).p_value == 0.0
    # Constant differences: only the all-plus and all-minus flips (2 of 16) tie with the observed.
    assert approximate_randomization(shifted, same, n_resamples=20_000).p_value == pytest.approx(
        2 / 16, abs=0.01)


@pytest.mark.parametrize("test", [paired_bootstrap, approximate_randomization])
def test_resampling_tests_are_deterministic_per_seed(test):
    a, b = _em_vectors(200, 0.40, 0.45, seed=5)
    assert test(a, b, n_resamples=2_000, seed=11) == test(a, b, n_resamples=2_000, seed=11)
    assert len({test(a, b, n_resamples=2_000, seed=seed).p_value for seed in range(5)}) > 1
    with pytest.raises(ValueError):
        test(a, b, n_resamples=0)


def test_significance_mark():
    assert significance_mark(0.01) == "*"
    assert significance_mark(0.05) == ""
    assert significance_mark(0.07, alpha=0.1) == "*"
    assert significance_mark(math.nan) == ""


def test_mean_shift_is_the_difference_of_means_with_a_bootstrap_interval():
    from metarag.evaluate.stats import mean_shift

    flat = mean_shift([1.0, 1.0], [3.0, 3.0])
    assert (flat.diff, flat.low, flat.high) == (2.0, 2.0, 2.0)  # no spread: the interval is the point
    shift = mean_shift([0.0, 1.0] * 10, [1.0] * 20, seed=3)
    assert shift.diff == 0.5 and shift.low < 0.5 < shift.high and shift.high <= 1.0 and shift.low >= 0.0
    assert mean_shift([0.0, 1.0] * 10, [1.0] * 20, seed=3) == shift  # seeded
    with pytest.raises(ValueError, match="non-empty"):
        mean_shift([], [1.0])


def test_reward_trend_reads_the_first_and_last_window_of_a_run():
    from metarag.errors import DataError
    from metarag.train.agent import reward_trend

    log = [{"step": i, "rewards/reward/mean": 0.0 if i <= 20 else 0.5} for i in range(1, 41)]
    trend = reward_trend(log)
    assert (trend.diff, trend.low, trend.high) == (0.5, 0.5, 0.5)
    with pytest.raises(DataError, match="at least 40"):
        reward_trend(log[:30])
