"""A pipeline's ranks on a shared host: they compute at once less often than data parallelism's.

A ClusterSpec's worker speeds are the workers' pace with every worker computing at once (the
bench measures them so, and data parallelism runs so). Where `ranks_per_host` workers share a
host's cores, a worker computing while the others idle runs `alone_speedup` times faster
(measured by profiling in turns, `caramel.profile.turns`): processor sharing over
C = ranks_per_host / alone_speedup cores. A pipeline's ranks idle in its bubbles and waits, so
its compute runs between the two paces.

The model is a mean field: with each other rank of the host busy a fraction u of the step (the
simulated lanes' mean busy time over the step), a rank computes beside k = 1 + (n - 1) u ranks
on average and runs at speed x min(alone_speedup, n / k). Its speed moves the busy fraction, so
the simulation is repeated from the all-at-once speeds until the factor settles (it only grows:
faster compute, lower u). Not modelled: which ranks compute together (the replicas of a stage
run in step, so they meet more often than the mean says; ranks of a stage waiting on one
another meet less), and cores that are not all alike.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from caramel.errors import CaramelError
from caramel.sim.simulate import SimResult
from caramel.topology.spec import ClusterSpec, WorkerSpec

MAX_SHARING_PASSES = 10
SETTLED = 1e-3  # relative change of the factor under which the passes stop


def shares_cores(cluster: ClusterSpec) -> bool:
    """Whether `cluster` says its workers share hosts' cores and compute faster alone."""
    return cluster.ranks_per_host > 1 and cluster.alone_speedup > 1.0


def sharing_factor(ranks_per_host: int, alone_speedup: float, busy_fraction: float, in_step: int = 1) -> float:
    """How many times its all-at-once speed a rank computes at, `in_step` ranks (itself and
    its stage's replicas) computing whenever it does and the host's other ranks each busy
    `busy_fraction` of the time: min(alone_speedup, n / k), k = in_step + (n - in_step) u, at least 1."""
    if not 0.0 <= busy_fraction <= 1.0 + 1e-9:
        raise CaramelError(f"pipeline sharing: busy_fraction must be in [0, 1], got {busy_fraction!r}")
    n = ranks_per_host
    together = max(1, min(in_step, n))
    k = together + (n - together) * min(busy_fraction, 1.0)
    return max(1.0, min(alone_speedup, n / k))


def scaled(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """`cluster` with every worker `factor` times faster and no sharing left to model."""
    workers = [WorkerSpec(w.name, speed=w.speed * factor) for w in cluster.workers]
    return dataclasses.replace(cluster, workers=workers, alone_speedup=1.0, ranks_per_host=1)


def busy_fraction(sim: SimResult) -> float:
    """The simulated lanes' mean compute over the step."""
    busy = sim.meta.get("busy_s_per_lane") or []
    if not busy or sim.step_time_s <= 0:
        return 1.0
    return min(1.0, sum(busy) / len(busy) / sim.step_time_s)


def in_step(sim: SimResult) -> int:
    """How many ranks compute in step in the simulated layout: equal replicas run one schedule
    side by side (each stage's replicas compute at once); unequal counts' virtual pipelines
    take turns on the shared ranks, counted as 1."""
    replicas = sim.meta.get("replicas")
    return replicas if isinstance(replicas, int) and replicas > 1 else 1


def with_sharing(simulate: Callable[[ClusterSpec], SimResult], cluster: ClusterSpec) -> SimResult:
    """`simulate(cluster)` at the speeds the mean field settles at (`meta["sharing"]`: the
    factor, the busy fraction, the passes); unchanged where the workers do not share cores."""
    if not shares_cores(cluster):
        return simulate(cluster)
    factor, passes = 1.0, 0
    while True:
        sim = simulate(scaled(cluster, factor))
        passes += 1
        u = busy_fraction(sim)
        nxt = sharing_factor(cluster.ranks_per_host, cluster.alone_speedup, u, in_step(sim))
        if abs(nxt - factor) <= SETTLED * factor or passes >= MAX_SHARING_PASSES:
            break
        factor = nxt
    sim.meta["sharing"] = {"factor": factor, "busy_fraction": u, "passes": passes, "in_step": in_step(sim),
                           "ranks_per_host": cluster.ranks_per_host, "alone_speedup": cluster.alone_speedup}
    return sim
