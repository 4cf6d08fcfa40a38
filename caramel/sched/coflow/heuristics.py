"""Classic coflow orders, recomputed at every event from what is left.

FIFO: release order. SCF: smallest coflow (bytes left) first. SEBF: smallest effective
bottleneck first (Varys: the time the coflow's busiest port needs). Weighted SEBF: the
bottleneck divided by the job's weight, so heavy jobs' coflows go first at equal size.
Weighted SRJF: job-aware, the job with the least work left (its unfinished coflows' bytes, the
steps not yet released included, at its busiest port) over its weight first, then SEBF within.
"""
from __future__ import annotations

from caramel.sched.coflow.fabric import FabricSim


def fifo(sim: FabricSim) -> list[int]:
    return sorted(sim.active, key=lambda c: (sim.released_s[c], c))


def scf(sim: FabricSim) -> list[int]:
    return sorted(sim.active, key=lambda c: (float(sim.remaining[c].sum()), c))


def sebf(sim: FabricSim) -> list[int]:
    return sorted(sim.active, key=lambda c: (sim.bottleneck_s(c), c))


def weighted_sebf(sim: FabricSim) -> list[int]:
    jobs = sim.workload.jobs
    coflows = sim.workload.coflows
    return sorted(sim.active, key=lambda c: (sim.bottleneck_s(c) / jobs[coflows[c].job].weight, c))


def weighted_srjf(sim: FabricSim) -> list[int]:
    w = sim.workload
    left = {}
    for c in sim.active:
        j = w.coflows[c].job
        if j not in left:
            left[j] = sim.job_bottleneck_s(j) / w.jobs[j].weight
    return sorted(sim.active, key=lambda c: (left[w.coflows[c].job], sim.bottleneck_s(c), c))


HEURISTICS = {"fifo": fifo, "scf": scf, "sebf": sebf, "weighted_sebf": weighted_sebf,
              "weighted_srjf": weighted_srjf}
