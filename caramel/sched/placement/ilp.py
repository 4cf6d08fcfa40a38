"""The exact placement: an integer program solved by HiGHS (scipy.optimize.milp), and brute force.

Variables: x[t,l,k] = 1 when layer l of task t runs on node k (binary), and y[t,l,a,b] >= 0, the
hop from layer l-1 on node a to layer l on node b. Flow constraints tie y to x (sum over b of
y[t,l,a,:] is x[t,l-1,a], sum over a of y[t,l,:,b] is x[t,l,b]), which makes the LP relaxation
of one chain exact (it is a shortest path), so HiGHS branches on the memory limits only:
sum over layers on edge node e of their weights <= memory_mb[e]. Cost: x pays the processing
and migration (and the first and last hop, from and to the source), y pays the hops.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from caramel.errors import CaramelError
from caramel.sched.placement.problem import Instance

BRUTE_FORCE_LIMIT = 200_000  # placements; beyond this brute force refuses


@dataclass(frozen=True)
class Solution:
    placement: list[list[int]]
    cost_s: float
    solve_s: float
    optimal: bool  # proven optimal (False: the time limit stopped HiGHS with a feasible placement)
    bound_s: float  # a proven lower bound on the optimum (the cost itself when optimal)


def solve_ilp(inst: Instance, time_limit_s: float | None = None,
              fixed: list[list[int]] | None = None) -> Solution:
    """The optimum placement (or HiGHS's best within `time_limit_s`, marked not optimal).
    `fixed` holds, per task, nodes its first layers must take (a partial placement to complete:
    the best completion of a prefix, as a training label)."""
    start = time.perf_counter()
    if fixed is not None and (len(fixed) != len(inst.tasks)
                              or any(len(f) > len(t.gflop) or any(not 0 <= n < inst.num_nodes for n in f)
                                     for f, t in zip(fixed, inst.tasks))):
        raise CaramelError(f"fixed must hold, per task ({len(inst.tasks)}), at most its layer count of nodes "
                           f"0..{inst.num_nodes - 1}; got {fixed}")
    k = inst.num_nodes
    cost: list[float] = []
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    integer: list[int] = []
    x_index: list[list[list[int]]] = []

    def var(c: float, is_int: bool) -> int:
        cost.append(c)
        integer.append(1 if is_int else 0)
        return len(cost) - 1

    def row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, v in entries:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    for t, task in enumerate(inst.tasks):
        n = len(task.gflop)
        xs = []
        for layer in range(n):
            xs.append([])
            for node in range(k):
                c = inst.layer_s(t, layer, node)
                if layer == 0:
                    c += inst.hop_s(task.in_mb, task.source, node)
                if layer == n - 1:
                    c += inst.hop_s(task.out_mb[layer], node, task.source)
                xs[layer].append(var(c, True))
            row([(xs[layer][node], 1.0) for node in range(k)], 1.0, 1.0)
        for layer in range(1, n):
            y = [[var(inst.hop_s(task.out_mb[layer - 1], a, b), False) for b in range(k)] for a in range(k)]
            for a in range(k):
                row([(y[a][b], 1.0) for b in range(k)] + [(xs[layer - 1][a], -1.0)], 0.0, 0.0)
            for b in range(k):
                row([(y[a][b], 1.0) for a in range(k)] + [(xs[layer][b], -1.0)], 0.0, 0.0)
        x_index.append(xs)
    for e, mem in enumerate(inst.memory_mb):
        row([(x_index[t][layer][e], inst.tasks[t].weights_mb[layer])
             for t in range(len(inst.tasks)) for layer in range(len(inst.tasks[t].gflop))], -np.inf, mem)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), len(cost))).tocsr()
    low_bound = np.zeros(len(cost))
    for t, prefix in enumerate(fixed or []):
        for layer, node in enumerate(prefix):
            low_bound[x_index[t][layer][node]] = 1.0
    options = {"time_limit": time_limit_s} if time_limit_s is not None else {}
    res = milp(np.array(cost), constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
               integrality=np.array(integer), bounds=Bounds(low_bound, 1.0), options=options)
    if res.x is None:
        raise CaramelError(f"HiGHS found no placement: {res.message}")
    placement = [[int(np.argmax([res.x[i] for i in xs[layer]])) for layer in range(len(xs))] for xs in x_index]
    cost_s = inst.cost_s(placement)
    bound = getattr(res, "mip_dual_bound", None)
    optimal = res.status == 0
    bound_s = cost_s if optimal or bound is None or not np.isfinite(bound) else float(bound)
    return Solution(placement, cost_s, time.perf_counter() - start, optimal, bound_s)


def brute_force(inst: Instance) -> Solution:
    """Every placement tried (small instances only: at most BRUTE_FORCE_LIMIT of them)."""
    start = time.perf_counter()
    sizes = [len(t.gflop) for t in inst.tasks]
    total = inst.num_nodes ** sum(sizes)
    if total > BRUTE_FORCE_LIMIT:
        raise CaramelError(f"brute force would try {total} placements (limit {BRUTE_FORCE_LIMIT}); use solve_ilp")
    best, best_cost = None, np.inf
    for flat in itertools.product(range(inst.num_nodes), repeat=sum(sizes)):
        placement, i = [], 0
        for n in sizes:
            placement.append(list(flat[i:i + n]))
            i += n
        if inst.feasible(placement):
            c = inst.cost_s(placement)
            if c < best_cost:
                best, best_cost = placement, c
    return Solution(best, best_cost, time.perf_counter() - start, True, best_cost)
