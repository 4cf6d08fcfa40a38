"""When a rank of `balance="dropout"` drops units: clearly slower than the fastest, twice in a row.

Each rank summarizes its window of full-model compute times (the last `WINDOW_STEPS` steps,
each divided by the time ratio of the drop it ran) as the median and a robust spread: 1.4826
times the median absolute deviation, the standard deviation of a normal sample, which one
outlier step moves little. Every `balance_every` steps the ranks all-gather those pairs and
each rank applies the same rule to the same numbers:

- rank r is *slow* when its median exceeds the fastest median t_f by more than `MIN_GAIN` of
  t_f AND by more than `NOISE_MARGIN` times the two windows' spreads combined
  (sqrt(spread_r^2 + spread_f^2)): a gap the step-to-step noise of a shared host makes
  routinely is no slowness;
- a slow rank's fraction is the table's entry for s = t_r / t_f (`DropoutTable.choose`),
  every other rank's 0;
- new fractions take effect only when two consecutive decisions propose the same list
  (`Confirmation`): with `balance_every` equal to the window both rest on disjoint windows,
  so one window of a rank hit by other work does not start a drop, nor end one.

Equal workers then drop nothing unless one is slower beyond its noise for two windows in a
row; a worker 2x slower (a gap of t_f) drops from the second decision on, as long as its
steps vary by less than about t_f / (NOISE_MARGIN * sqrt 2) each.
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

from caramel.profile.dropout_table import DropoutTable
MIN_GAIN = 0.05  # a rank is slow when its median exceeds the fastest's by more than 5% ...
NOISE_MARGIN = 2.0  # the gap must exceed this many combined spreads of the two windows
MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample times this is its sd


def window_stats(times: Sequence[float]) -> tuple[float, float]:
    """(median, robust spread) of a window of compute times; (0, 0) for an empty window."""
    if not times:
        return 0.0, 0.0
    med = statistics.median(times)
    return med, MAD_TO_SD * statistics.median(abs(t - med) for t in times)


def slow_ranks(stats: Sequence[tuple[float, float]]) -> list[float]:
    """Per rank, its slowness t_r / t_f when it is clearly slower than the fastest (module
    docstring), else 1.0; all 1.0 while some rank has no measurement yet."""
    if not stats or min(m for m, _ in stats) <= 0.0:
        return [1.0] * len(stats)
    fast_m, fast_sd = min(stats)
    out = []
    for m, sd in stats:
        gap = m - fast_m
        clear = gap > MIN_GAIN * fast_m and gap > NOISE_MARGIN * math.hypot(sd, fast_sd)
        out.append(m / fast_m if clear else 1.0)
    return out


def propose(stats: Sequence[tuple[float, float]], table: DropoutTable) -> list[float]:
    """Every rank's drop fraction for the gathered (median, spread) pairs, before confirmation."""
    return [0.0 if s == 1.0 else table.choose(s).fraction for s in slow_ranks(stats)]


class Confirmation:
    """Applies a proposal only when the previous decision proposed the same (module docstring)."""

    def __init__(self) -> None:
        self.last: list[float] | None = None

    def confirm(self, proposal: list[float], current: list[float]) -> list[float] | None:
        """The fractions to switch to now, or None to keep `current`."""
        previous, self.last = self.last, list(proposal)
        if proposal == current or proposal != previous:
            return None
        return list(proposal)
