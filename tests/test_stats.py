"""caramel.stats: the one percentile, median, geomean, t intervals and paired-ratio interval."""
import math

import numpy as np
import pytest

from caramel.stats import (geomean, log_t_interval, median, paired_ratio_interval, paired_rounds_interval, percentile,
                           t_interval)

pytestmark = pytest.mark.timeout(30)


def test_percentile_matches_numpy_linear_interpolation():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert median(xs) == 3.0
    assert percentile(xs, 90) == pytest.approx(4.6) == float(np.percentile(xs, 90))
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert percentile(iter([0, 10]), 90) == pytest.approx(9.0)  # any iterable
    assert isinstance(percentile([1, 2], 50), float)


def test_no_values_give_nan_and_bad_q_is_an_error():
    assert math.isnan(percentile([], 50)) and math.isnan(median([]))
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.3]) == pytest.approx(1.3)
    for bad in ([], [1.0, 0.0], [-1.0]):
        with pytest.raises(ValueError, match="positive"):
            geomean(bad)


def test_paired_ratio_interval():
    # every round exactly 2x: no spread, the interval is the point
    assert paired_ratio_interval([0.2, 0.2] * 4, [0.1, 0.1] * 4, 2) == pytest.approx((2.0, 2.0))
    # a machine-wide drift between rounds hits both alike and does not widen it
    drift = [1.0, 1.0, 1.5, 1.5, 0.8, 0.8, 1.2, 1.2]
    assert paired_ratio_interval([0.2 * d for d in drift], [0.1 * d for d in drift], 2) == pytest.approx((2.0, 2.0))
    # rounds that disagree: the interval holds the point and narrows with more rounds alike
    ref, cand = [0.2] * 6, [0.09, 0.11, 0.1, 0.09, 0.11, 0.1]
    lo3, hi3 = paired_ratio_interval(ref[:3], cand[:3], 1)
    lo6, hi6 = paired_ratio_interval(ref, cand, 1)
    assert lo3 < 2.0 < hi3 and lo6 < 2.0 < hi6 and hi6 - lo6 < hi3 - lo3
    # Student's t with k - 1 degrees of freedom: 3 rounds -> t = 4.303
    logs = [math.log(0.2 / x) for x in cand[:3]]
    sd = float(np.std(logs, ddof=1))
    assert hi3 == pytest.approx(0.2 / 0.1 * math.exp(4.303 * sd / math.sqrt(3)), rel=1e-4)
    # fewer than 3 rounds: no interval
    assert paired_ratio_interval([0.2] * 4, [0.1] * 4, 2) is None
    with pytest.raises(ValueError):
        paired_ratio_interval([0.2] * 4, [0.1] * 4, 0)


def test_paired_rounds_interval_is_paired_ratio_interval_from_round_medians():
    rng = np.random.default_rng(0)
    ref, cand = list(1 + rng.random(80)), list(1.5 + rng.random(80))
    rounds = [(median(ref[i:i + 8]), median(cand[i:i + 8])) for i in range(0, 80, 8)]
    got = paired_rounds_interval([r for r, _ in rounds], [c for _, c in rounds], median(ref) / median(cand))
    assert got == pytest.approx(paired_ratio_interval(ref, cand, 8), rel=1e-12)
    assert paired_rounds_interval([1.0, 2.0], [1.0, 2.0], 1.0) is None  # too few rounds


def test_t_interval_is_the_mean_plus_minus_t_standard_errors():
    from scipy import stats as sstats

    mean, low, high = t_interval([1.0, 2.0, 4.0])
    half = sstats.t.ppf(0.975, 2) * np.std([1.0, 2.0, 4.0], ddof=1) / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((7 / 3, 7 / 3 - half, 7 / 3 + half))
    with pytest.raises(ValueError, match="two or more values, got 1"):
        t_interval([1.0])


def test_log_t_interval_is_the_t_interval_of_the_logs_around_the_geomean():
    ratios = [1.2, 1.5, 1.3, 1.4]
    mid, low, high = log_t_interval(ratios)
    m, lo, hi = t_interval(np.log(ratios))
    assert mid == pytest.approx(geomean(ratios)) and (low, high) == pytest.approx((math.exp(lo), math.exp(hi)))
    assert low < mid < high and mid * mid == pytest.approx(low * high)  # symmetric in logs
    with pytest.raises(ValueError, match="positive"):
        log_t_interval([1.0, 0.0])
