"""HAP-style uneven data parallelism: each worker's share of the batch from a linear program.

With workers of different speed, equal shards make every step wait for the slowest. HAP
(EuroSys'24) sizes shards by a linear program; here, for data parallelism:

    minimize t  subject to  x_i * compute_s / speed_i + comm_s <= t   (every worker i)
                            sum_i x_i = 1,   0 <= x_i <= cap_i        (cap: memory, as a share)

`compute_s` is one worker's compute time for the whole batch at speed 1, `comm_s` the gradient
all-reduce (the same for all, it waits for the slowest). Solved with scipy's `linprog` (HiGHS).
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from caramel.errors import CaramelError


def shard_ratios(speeds: list[float], compute_s: float = 1.0, comm_s: float = 0.0,
                 caps: list[float] | None = None) -> list[float]:
    """Each worker's share of the batch (sums to 1), minimizing the step time above."""
    n = len(speeds)
    if n == 0 or any(s <= 0 for s in speeds):
        raise CaramelError(f"shard ratios: speeds must be positive, one per worker, got {speeds}")
    caps = caps if caps is not None else [1.0] * n
    if len(caps) != n or any(c < 0 for c in caps) or sum(caps) < 1 - 1e-12:
        raise CaramelError(f"shard ratios: caps must be one non-negative share per worker summing to >= 1, got {caps}")
    # variables: x_0..x_{n-1}, t; minimize t
    c = np.zeros(n + 1)
    c[-1] = 1.0
    a_ub = np.zeros((n, n + 1))
    for i, s in enumerate(speeds):
        a_ub[i, i] = compute_s / s
        a_ub[i, -1] = -1.0
    b_ub = np.full(n, -comm_s)
    a_eq = np.ones((1, n + 1))
    a_eq[0, -1] = 0.0
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0.0, cap) for cap in caps] + [(0.0, None)], method="highs")
    if not res.success:
        raise CaramelError(f"shard ratios: the linear program failed: {res.message}")
    return [float(v) for v in res.x[:n]]


def shard_sizes(batch_size: int, ratios: list[float]) -> list[int]:
    """Whole samples per worker, summing to `batch_size`, closest to `ratios` (largest remainder)."""
    if batch_size < 0 or abs(sum(ratios) - 1) > 1e-6:
        raise CaramelError(f"shard sizes: need batch_size >= 0 and ratios summing to 1, got {batch_size}, {ratios}")
    raw = [r * batch_size for r in ratios]
    sizes = [int(v) for v in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - sizes[i], reverse=True)
    for i in order[:batch_size - sum(sizes)]:
        sizes[i] += 1
    return sizes
