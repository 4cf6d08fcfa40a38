"""Seeded synthetic placement instances: a few edge nodes on a LAN, the cloud behind a WAN.

Edge nodes compute at 20..100 GFLOP/s, the cloud at 1000; edge-edge links carry 100 MB/s at
1 ms, edge-cloud links 10 MB/s at 20 ms. Layers draw their GFLOP, weights and activations
log-uniformly; the edge memory is `memory_fraction` of all the tasks' weights (split over the
edge nodes), so not every layer fits where it is cheapest. Each layer's current node is drawn
at random (the placement a previous round left).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from caramel.sched.placement.problem import Instance, Task


@dataclass(frozen=True)
class InstanceOptions:
    """`num_tasks=3,num_layers=4,num_edge=3` on the command line."""

    num_tasks: int = 3
    num_layers: int = 4
    num_edge: int = 3
    memory_fraction: float = 0.4  # edge memory over all the tasks' weights
    migration_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.num_tasks < 1 or self.num_layers < 1 or self.num_edge < 1:
            raise ValueError(f"num_tasks, num_layers and num_edge must be >= 1, got {self.num_tasks}, "
                             f"{self.num_layers}, {self.num_edge}")
        if self.memory_fraction < 0 or self.migration_weight < 0:
            raise ValueError("memory_fraction and migration_weight must be >= 0")


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, n: int) -> tuple[float, ...]:
    return tuple(float(x) for x in np.exp(rng.uniform(np.log(lo), np.log(hi), n)))


def random_instance(options: InstanceOptions, seed: int) -> Instance:
    rng = np.random.default_rng(seed)
    e, k, n = options.num_edge, options.num_edge + 1, options.num_layers
    tasks = []
    for _ in range(options.num_tasks):
        tasks.append(Task(source=int(rng.integers(e)), gflop=_log_uniform(rng, 0.05, 4.0, n),
                          weights_mb=_log_uniform(rng, 1.0, 60.0, n), out_mb=_log_uniform(rng, 0.02, 4.0, n),
                          in_mb=float(rng.uniform(0.5, 4.0)), current=tuple(int(c) for c in rng.integers(k, size=n))))
    bandwidth = np.full((k, k), 100.0)
    latency = np.full((k, k), 0.001)
    bandwidth[e, :] = bandwidth[:, e] = 10.0
    latency[e, :] = latency[:, e] = 0.020
    np.fill_diagonal(bandwidth, np.inf)
    np.fill_diagonal(latency, 0.0)
    total_mb = sum(sum(t.weights_mb) for t in tasks)
    memory = tuple(float(m) for m in rng.dirichlet(np.full(e, 4.0)) * options.memory_fraction * total_mb)
    speeds = tuple(float(s) for s in rng.uniform(20.0, 100.0, e)) + (1000.0,)
    return Instance(tuple(tasks), speeds, memory, bandwidth, latency, options.migration_weight)
