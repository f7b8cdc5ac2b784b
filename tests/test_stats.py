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
    from metarag.evaluate.training_curves import reward_trend

    log = [{"step": i, "rewards/reward/mean": 0.0 if i <= 20 else 0.5} for i in range(1, 41)]
    trend = reward_trend(log)
    assert (trend.diff, trend.low, trend.high) == (0.5, 0.5, 0.5)
    with pytest.raises(DataError, match="at least 40"):
        reward_trend(log[:30])


# ------------------------------------------------------------------ issue 50: tests by metric type
from metarag.evaluate.stats import (  # noqa: E402
    holm,
    mcnemar_exact,
    mcnemar_power,
    mean_interval,
    paired_difference_ci,
    power_analysis,
    wilson_interval,
)


def test_mcnemar_exact_on_a_hand_computed_table():
    # 2x2 table of (a, b): both right 3, a only 6, b only 1, both wrong 2 -> 7 discordant pairs, 6 one way.
    # Exact two-sided binomial p = 2 * P(X <= 1 | n=7, 1/2) = 2 * (1 + 7) / 128 = 0.125
    a = [1] * 3 + [1] * 6 + [0] * 1 + [0] * 2
    b = [1] * 3 + [0] * 6 + [1] * 1 + [0] * 2
    result = mcnemar_exact(a, b)
    assert (result.gained, result.lost, result.n) == (6, 1, 12)
    assert result.p_value == pytest.approx(16 / 128)
    assert result.mean_diff == pytest.approx(5 / 12)


def test_mcnemar_exact_on_the_issues_in_sample_case_and_its_edges():
    # the issue's trained agent on 17 questions: 5 discordant pairs, all one way -> p = 2 / 32 = 0.0625
    a = [1] * 5 + [1] * 4 + [0] * 8
    b = [0] * 5 + [1] * 4 + [0] * 8
    assert mcnemar_exact(a, b).p_value == pytest.approx(0.0625)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]).p_value == 1.0  # no discordant pair
    with pytest.raises(ValueError, match="0/1 scores"):
        mcnemar_exact([0.5, 1.0], [0.0, 1.0])


def test_paired_bootstrap_ci_is_reproducible_and_covers_the_true_difference():
    rng = np.random.default_rng(11)
    base = rng.uniform(0, 1, 400)
    shifted = np.clip(base + 0.1 + rng.normal(0, 0.2, 400), -10, 10)  # true mean difference 0.1
    ci = paired_difference_ci(shifted, base, seed=3)
    assert ci == paired_difference_ci(shifted, base, seed=3)
    assert ci != paired_difference_ci(shifted, base, seed=4)
    assert ci.low < 0.1 < ci.high and ci.high - ci.low < 0.1
    assert ci.estimate == pytest.approx(float(np.mean(shifted - base)))
    # coverage over repeated synthetic samples: near the nominal 95 %
    covered = 0
    for trial in range(60):
        r = np.random.default_rng(100 + trial)
        x = r.uniform(0, 1, 120)
        y = x + 0.05 + r.normal(0, 0.3, 120)
        interval = paired_difference_ci(y, x, n_resamples=2000, seed=trial)
        covered += interval.low <= 0.05 <= interval.high
    assert covered >= 51  # 95 % of 60 is 57; binomial slack


def test_wilson_interval_against_a_textbook_value():
    # Wilson 95 % interval of 8 / 20 (z = 1.959964): (0.2188, 0.6134), Newcombe (1998) table I style
    ci = wilson_interval(8, 20)
    assert ci.estimate == 0.4
    assert (ci.low, ci.high) == pytest.approx((0.21878, 0.61339), abs=1e-4)
    assert wilson_interval(0, 10).low == 0.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_mean_interval_brackets_the_mean_and_is_a_point_for_a_constant_sample():
    values = [0.0, 0.5, 1.0, 0.25, 0.75] * 10
    ci = mean_interval(values, seed=1)
    assert ci.low < 0.5 < ci.high
    assert mean_interval([2.0, 2.0, 2.0]).low == mean_interval([2.0, 2.0, 2.0]).high == 2.0


def test_holm_on_a_textbook_example():
    # Holm (1979) / the usual worked example: p = 0.01, 0.04, 0.03, 0.005 (m = 4)
    # sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, 0.06 (monotone), back in the given order
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    adjusted = holm([0.02, float("nan")])
    assert adjusted[0] == pytest.approx(0.02) and np.isnan(adjusted[1])


def test_mcnemar_power_against_hand_computed_values():
    # n = 10, every pair discordant (psi = 1): the exact test rejects at gains <= 1 or >= 9
    # (2 P(X <= 1 | 10, 1/2) = 0.0215 <= 0.05 < 2 P(X <= 2) = 0.109). With delta = 0.6 the gain
    # probability is 0.8: power = P(G >= 9) + P(G <= 1) = 10 * 0.8**9 * 0.2 + 0.8**10 + tiny.
    expected = 10 * 0.8 ** 9 * 0.2 + 0.8 ** 10 + 0.2 ** 10 + 10 * 0.2 ** 9 * 0.8
    assert mcnemar_power(10, 1.0, 0.6) == pytest.approx(expected)
    assert mcnemar_power(10, 1.0, 1.0) == pytest.approx(1.0)
    # no difference: power is the test's size, at most alpha
    assert mcnemar_power(200, 0.3, 0.0) <= 0.05


def test_power_analysis_matches_the_normal_approximation_sample_size():
    # Connor (1987): n = (z_a/2 sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2; psi 0.2, delta 0.1 -> 154.6.
    # The exact unconditional test needs a little more than the normal approximation.
    p = power_analysis(gained=30, lost=10, n=200)  # psi = 0.2, delta = 0.1
    assert p.discordance == pytest.approx(0.2) and p.observed == pytest.approx(0.1)
    assert 150 <= p.n_needed <= 175
    assert mcnemar_power(p.n_needed, 0.2, 0.1) >= 0.8 > mcnemar_power(p.n_needed - 10, 0.2, 0.1)
    # the detectable difference at n = 200, psi = 0.2 is below the 0.1 that needs ~160 pairs
    assert 0.07 < p.detectable < 0.1
    assert mcnemar_power(200, 0.2, p.detectable) == pytest.approx(0.8, abs=0.01)
    none = power_analysis(gained=0, lost=0, n=30)
    assert none.detectable is None and none.n_needed is None
