"""The statistics Caramel's reports share: percentile, median, geometric mean, Student-t
intervals of a mean and of a geometric mean, and the 95% interval of a ratio measured in paired
rounds.

One implementation, on numpy and scipy, so that the bench, the trace tools and the simulator's
validation compute a median or a p90 the same way.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

MIN_PAIRED_ROUNDS = 3
"""fewer paired rounds than this give no interval (one degree of freedom is too few to trust)"""


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between order statistics (numpy's
    default); NaN for no values, so a missing metric stays visibly missing."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    xs = np.asarray(list(values), dtype=float)
    if xs.size == 0:
        return math.nan
    return float(np.percentile(xs, q, method="linear"))


def median(values: Iterable[float]) -> float:
    """The 50th percentile (the mean of the two middle values for an even count); NaN for none."""
    return percentile(values, 50.0)


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive values (the mean of ratios that compound)."""
    xs = np.asarray(list(values), dtype=float)
    if xs.size == 0 or not np.all(xs > 0):
        raise ValueError("geometric mean needs one or more positive values")
    return float(np.exp(np.mean(np.log(xs))))


def _t_half(xs: np.ndarray, confidence: float) -> float:
    """Half the Student-t interval of the mean of `xs`: t * sd / sqrt(n), n - 1 degrees of freedom."""
    n = xs.size
    # scipy.stats is imported here, not at the top: it costs seconds per process, and most
    # importers (every training rank) only need the median.
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * float(np.std(xs, ddof=1)) / math.sqrt(n)


def t_interval(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The mean of `values` and its Student-t interval, as (mean, low, high); two or more values."""
    xs = np.asarray(list(values), dtype=float)
    if xs.size < 2:
        raise ValueError(f"a t interval needs two or more values, got {xs.size}")
    mean, half = float(np.mean(xs)), _t_half(xs, confidence)
    return mean, mean - half, mean + half


def log_t_interval(ratios: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The geometric mean of positive `ratios` and its interval, as (geomean, low, high): the
    t interval of their logs, exponentiated (ratios compound, so their logs are what add up)."""
    xs = np.asarray(list(ratios), dtype=float)
    if not np.all(xs > 0):
        raise ValueError("a log t interval needs positive ratios")
    mean, low, high = t_interval(np.log(xs), confidence)
    return math.exp(mean), math.exp(low), math.exp(high)


def paired_rounds_interval(reference_rounds: Sequence[float], candidate_rounds: Sequence[float], point: float,
                           confidence: float = 0.95) -> tuple[float, float] | None:
    """`paired_ratio_interval` from per-round medians already taken (a bench record's
    `round_medians_s`), around `point` (the ratio of the rows' overall medians)."""
    k = min(len(reference_rounds), len(candidate_rounds))
    if k < MIN_PAIRED_ROUNDS:
        return None
    logs = np.array([math.log(r / c) for r, c in zip(reference_rounds[:k], candidate_rounds[:k])])
    half = _t_half(logs, confidence)
    return point * math.exp(-half), point * math.exp(half)


def paired_ratio_interval(reference: Sequence[float], candidate: Sequence[float], per_round: int,
                          confidence: float = 0.95) -> tuple[float, float] | None:
    """The interval of median(reference) / median(candidate) from rounds measured in pairs.

    Round k's median of `reference` over its median of `candidate` is one paired sample of the
    ratio, so drift between rounds hits both sides alike. The interval is the point ratio times
    exp(+-t * sd / sqrt(k)) of the per-round log ratios (Student's t, k - 1 degrees of freedom).
    Series are cut into rounds of `per_round` values; None with fewer than MIN_PAIRED_ROUNDS.
    """
    if per_round < 1:
        raise ValueError(f"per_round must be positive, got {per_round}")
    k = min(len(reference), len(candidate)) // per_round
    if k < MIN_PAIRED_ROUNDS:
        return None
    logs = np.array([math.log(median(reference[i * per_round:(i + 1) * per_round])
                              / median(candidate[i * per_round:(i + 1) * per_round])) for i in range(k)])
    half = _t_half(logs, confidence)
    point = median(reference) / median(candidate)
    return point * math.exp(-half), point * math.exp(half)
