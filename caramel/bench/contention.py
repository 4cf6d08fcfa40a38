"""How much slower compute runs while collectives are in flight, from the concurrent baseline.

The concurrent baseline issues a step's all-reduces and runs the compute-only step beside them
(`caramel.bench.baselines.Concurrent`). Each of its steps records how long the compute took,
for how long a collective was in flight during it (from the compute's start to the last
collective's completion, at most the compute's end) and how many collectives started during
it. The event engine's model of contention (`caramel.sim.event_loop.Busy`): each collective
that starts while compute runs pauses it for the cluster's `collective_cpu_s` p, and for the
rest of the collective's interval compute runs f times slower, so k starts in O seconds of
overlap leave (O - k p) / f of its work done. With compute C alone (the compute-only
baseline's median), the compute beside the transfers takes C_beside = C + O - (O - k p) / f, so

    f = (O - k p) / (O - (C_beside - C))

per rank, from the medians of its steps (a delay of just the pauses gives 1; a compute slowed
through all of it, O = C_beside and p = 0, gives C_beside / C). The job's factor is the
slowest rank's: a synchronous step waits for it (the validation experiment takes it the same
way).

A rank whose collectives overlap too little of the compute to tell (O under
`MIN_OVERLAP_SHARE` of C, or filled by the pauses) gives no factor. A delay as long as the
overlap or longer, which no finite f explains (compute that made no progress at all), counts
as `MAX_SLOWDOWN`, as does any larger f: beyond it the baseline has measured a stall, not a
share of the cores. No rank with a factor means no evidence of contention: 1.

Under `--jitter` every worker's compute is padded by a sleep after its forward, the concurrent
baseline's included; a sleep is not slowed by the transfers, and the simulators apply the factor
to the unpadded compute only. So each concurrent step records its padding (`span_padding`: the
seconds slept during the compute, those of them inside the overlap, the collectives that started
during a sleep), and the factor is computed on the spans less it (`unpadded_spans`) against the
unpadded compute-only median (`caramel.bench.hetero_prediction.Heterogeneity.contention_inputs`).
Without padding the spans are used as measured. (`--slow-worker`'s delay is a sleep too, but the
simulators model it as slower compute, which the factor then covers: its spans stay as measured.)

The factor goes into the predictions' ClusterSpec (`compute_slowdown`): the event engine
applies it to the ddp and caramel models, the gossip and ps simulators to compute beside their
exchanges, pushes and pulls, the pipeline simulator to compute beside a lane's own transfers
or, where ranks share a host's cores, as each transfer's CPU share of the host's load
(docs/pipeline.md, "Transfers in a shared host's load"). It is measured with the baselines'
thread priority (real-time where allowed, as the caramel engine runs its own); plain `ddp`
runs its threads at normal priority, and its prediction takes the same factor.
"""
from __future__ import annotations

from caramel.stats import median

MIN_OVERLAP_SHARE = 0.1  # below this share of the compute, the overlap says nothing about a slowdown
MAX_SLOWDOWN = 4.0  # compute on a core shared with the backend's threads, the kernel and up to 3 more ranks


def rank_slowdown(compute_alone_s: float, spans: list[tuple[float, float, int]],
                  collective_cpu_s: float = 0.0) -> float | None:
    """One rank's factor from its compute-only median and its concurrent steps' (compute
    duration, overlap, collectives started) spans; None when the overlap is too short to tell."""
    if not spans or compute_alone_s <= 0:
        return None
    beside = median([c for c, _, _ in spans])
    overlap = median([o for _, o, _ in spans])
    if overlap < MIN_OVERLAP_SHARE * compute_alone_s:
        return None
    working = overlap - median([k for _, _, k in spans]) * collective_cpu_s  # the overlap less the pauses
    if working <= 0:
        return None
    extra = beside - compute_alone_s
    if overlap - extra <= working / MAX_SLOWDOWN:
        return MAX_SLOWDOWN
    return max(1.0, working / (overlap - extra))


def job_slowdown(compute_alone_s: list[float], spans: list[list[tuple[float, float, int]]],
                 collective_cpu_s: float = 0.0) -> float:
    """The slowest rank's factor (module docstring); 1 without evidence on any rank."""
    factors = [f for f in (rank_slowdown(c, s, collective_cpu_s) for c, s in zip(compute_alone_s, spans))
               if f is not None]
    return max(factors, default=1.0)


def span_padding(t0: float, t1: float, overlap_end: float, starts: list[float],
                 sleeps: list[tuple[float, float]]) -> tuple[float, float, int]:
    """A concurrent step's padding, from its compute's start `t0` and end `t1`, the end of its
    overlap, its collectives' start times and the (start, end) of the sleeps taken during it:
    (seconds slept in [t0, t1], of them in [t0, overlap_end], collectives started before t1
    inside a sleep: their pause hits no compute)."""
    def inside(lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in sleeps)
    started = sum(1 for t in starts if t < t1 and any(a <= t < b for a, b in sleeps))
    return inside(t0, t1), inside(t0, overlap_end), started


def unpadded_spans(spans: list, padding: list) -> list[tuple[float, float, int]]:
    """One rank's spans less their padding (`span_padding`), step by step."""
    if len(spans) != len(padding):
        raise ValueError(f"{len(padding)} recorded paddings for {len(spans)} concurrent steps: they do not align")
    return [(c - s, o - so, k - ks) for (c, o, k), (s, so, ks) in zip(spans, padding)]
