"""How much slower compute runs while collectives are in flight, from the concurrent baseline.

The concurrent baseline issues a step's all-reduces and runs the compute-only step beside them
(`caramel.bench.baselines.Concurrent`). Each of its steps records how long the compute took and
for how long a collective was in flight during it (from the compute's start to the last
collective's completion, at most the compute's end). The event engine's model of contention:
compute runs f times slower while a collective is in flight, so in O seconds of overlap it
gets O / f of its work done. With compute C alone (the compute-only baseline's median), the
compute beside the transfers takes C_beside = C + O (1 - 1/f), so

    f = O / (O - (C_beside - C))

per rank, from the medians of its steps (C_beside = C gives 1; a compute slowed through all
of it, O = C_beside, gives C_beside / C). The job's factor is the slowest rank's: a synchronous
step waits for it (the validation experiment takes it the same way). Where the collectives
overlap too little of the compute to tell (O under `MIN_OVERLAP_SHARE` of C), a rank gives no
factor (as does one whose delay is longer than the overlap itself, which no slowdown
explains); no rank with one means no evidence of contention, factor 1. The factor goes into the
predictions' ClusterSpec (`compute_slowdown`), which the event engine applies to the ddp and
caramel models; the ps, gossip and pipeline simulators do not model contention.
"""
from __future__ import annotations

from caramel.stats import median

MIN_OVERLAP_SHARE = 0.1  # below this share of the compute, the overlap says nothing about a slowdown


def rank_slowdown(compute_alone_s: float, spans: list[tuple[float, float]]) -> float | None:
    """One rank's factor from its compute-only median and its concurrent steps' (compute
    duration, overlap) spans, in seconds; None when the overlap is too short to tell."""
    if not spans or compute_alone_s <= 0:
        return None
    beside = median([c for c, _ in spans])
    overlap = median([o for _, o in spans])
    extra = beside - compute_alone_s
    if overlap < MIN_OVERLAP_SHARE * compute_alone_s or extra >= overlap:
        return None  # too little overlap to tell, or more delay than the model can put in it
    return max(1.0, overlap / (overlap - extra))


def job_slowdown(compute_alone_s: list[float], spans: list[list[tuple[float, float]]]) -> float:
    """The slowest rank's factor (module docstring); 1 without evidence on any rank."""
    factors = [f for f in (rank_slowdown(c, s) for c, s in zip(compute_alone_s, spans)) if f is not None]
    return max(factors, default=1.0)
