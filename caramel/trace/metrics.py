"""Metric arithmetic shared by the trace summary, the bench and the simulator.

Two families live here:

- interval arithmetic on timelines (union, intersection, clipping), which is how compute time,
  communication time and the hidden part of communication are measured from a trace;
- the scalar formulas of DESIGN.md: `U = T_compute + T_comm` (no overlap), `L = max(T_compute,
  T_comm)` (perfect overlap), scheduling efficiency `E = (U - T_iter) / (U - L)`, overlap percent
  (hidden / total communication, as HolisticTraceAnalysis defines it), algorithm and bus bandwidth
  (`busbw = algbw * 2(n-1)/n` for all-reduce) and the ring all-reduce cost model.

Everything is in seconds and bytes; bandwidths are bytes per second unless a name says bits.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence


Interval = tuple[float, float]


# ----------------------------------------------------------------------------------------------
# interval arithmetic


def union_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points as `intervals` (empty ones dropped).

    Touching intervals ([0, 1] and [1, 2]) merge, so the union of back-to-back events is one span.
    """
    spans = sorted((s, e) for s, e in intervals if e > s)
    merged: list[Interval] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def total_length(intervals: Iterable[Interval]) -> float:
    """Seconds covered by at least one interval."""
    return sum(e - s for s, e in union_intervals(intervals))


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two unions of intervals (each given in any form; both are normalized first)."""
    ua, ub = union_intervals(a), union_intervals(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(ua) and j < len(ub):
        s = max(ua[i][0], ub[j][0])
        e = min(ua[i][1], ub[j][1])
        if e > s:
            out.append((s, e))
        # advance whichever ends first: it cannot meet anything further in the other list
        if ua[i][1] <= ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def intersect_length(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Seconds covered by both `a` and `b`."""
    return sum(e - s for s, e in intersect(a, b))


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of `intervals` inside [lo, hi)."""
    out = []
    for s, e in intervals:
        s2, e2 = max(s, lo), min(e, hi)
        if e2 > s2:
            out.append((s2, e2))
    return out


# ----------------------------------------------------------------------------------------------
# statistics


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for an empty sequence."""
    return sum(values) / len(values) if values else math.nan


# ----------------------------------------------------------------------------------------------
# the formulas of DESIGN.md


def no_overlap_bound_s(t_compute_s: float, t_comm_s: float) -> float:
    """`U = T_compute + T_comm`: the step time if nothing overlaps."""
    return t_compute_s + t_comm_s


def perfect_overlap_bound_s(t_compute_s: float, t_comm_s: float) -> float:
    """`L = max(T_compute, T_comm)`: the step time if communication hides perfectly."""
    return max(t_compute_s, t_comm_s)


def scheduling_efficiency(t_iter_s: float, t_compute_s: float, t_comm_s: float) -> float:
    """`E = (U - T_iter) / (U - L)`: 1 is perfect overlap, 0 is none; NaN when U == L (nothing to hide)."""
    u = no_overlap_bound_s(t_compute_s, t_comm_s)
    lo = perfect_overlap_bound_s(t_compute_s, t_comm_s)
    if u - lo <= 0:
        return math.nan
    return (u - t_iter_s) / (u - lo)


def exposed_comm_s(t_iter_s: float, t_compute_s: float) -> float:
    """Exposed communication at the step level: `T_iter - T_compute` (DESIGN.md), never negative."""
    return max(t_iter_s - t_compute_s, 0.0)


def overlap_percent(hidden_comm_s: float, total_comm_s: float) -> float:
    """Hidden / total communication time in percent (HolisticTraceAnalysis' overlap); NaN without communication."""
    if total_comm_s <= 0:
        return math.nan
    return 100.0 * hidden_comm_s / total_comm_s


def algbw_bytes_per_s(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth: bytes of the collective's input over its time (NaN for zero time)."""
    if seconds <= 0:
        return math.nan
    return nbytes / seconds


def allreduce_bus_factor(world_size: int) -> float:
    """`2(n-1)/n`: bytes each link carries per input byte in a bandwidth-optimal all-reduce."""
    assert world_size >= 1, world_size
    return 2.0 * (world_size - 1) / world_size


def busbw_bytes_per_s(algbw: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce, comparable with the link rate: `algbw * 2(n-1)/n`."""
    return algbw * allreduce_bus_factor(world_size)


def ring_allreduce_time_s(world_size: int, nbytes: float, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring all-reduce cost `2(n-1)*alpha + 2(n-1)/n * S/B`; zero for a single worker."""
    assert bandwidth_bytes_per_s > 0, bandwidth_bytes_per_s
    if world_size <= 1:
        return 0.0
    return 2 * (world_size - 1) * latency_s + allreduce_bus_factor(world_size) * nbytes / bandwidth_bytes_per_s


def relative_error(predicted: float, measured: float) -> float:
    """`|predicted - measured| / measured` (the simulator error of DESIGN.md); NaN if measured is 0."""
    if measured == 0:
        return math.nan
    return abs(predicted - measured) / abs(measured)
