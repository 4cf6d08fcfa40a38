"""Per-instance step-cost tables, so the placement state can score every node of every task's
next layer with array lookups instead of a Python call per (task, node).

`step[t, l, a, b]` is `Instance.step_s(t, l, a, b)` (what layer l of task t adds on node b after
its predecessor on node a), `h[t, l, b]` the memory-free cost-to-go after it
(`Instance.cost_to_go`), `weights_mb[t, l]` the layer's weights; tasks with fewer layers are
padded with zeros. Every entry is computed by the same floating-point operations, in the same
order, as the scalar methods of `Instance`, so lookups equal them exactly (tested): the
heuristics and the environment make the same choices through either.
"""
from __future__ import annotations

import numpy as np

from caramel.sched.placement.problem import Instance


def _hop_s(mb: np.ndarray, latency_s: np.ndarray, bandwidth_MBps: np.ndarray, same: np.ndarray) -> np.ndarray:
    """`Instance.hop_s` broadcast: 0 between a node and itself, else latency + MB / bandwidth."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(same, 0.0, latency_s + mb / bandwidth_MBps)


class StepTables:
    """The tables of one instance (built once; shared by every clone of a state)."""

    def __init__(self, inst: Instance):
        t_count, k = len(inst.tasks), inst.num_nodes
        self.num_layers = np.array([len(t.gflop) for t in inst.tasks])
        lmax = int(self.num_layers.max()) if t_count else 0
        self.step = np.zeros((t_count, lmax, k, k))
        self.h = np.zeros((t_count, lmax, k))
        self.weights_mb = np.zeros((t_count, lmax))
        self.source = np.array([t.source for t in inst.tasks], dtype=int)
        self.current = np.zeros((t_count, lmax), dtype=int)  # where each layer runs now
        nodes = np.arange(k)
        speeds = np.asarray(inst.node_gflops, dtype=float)
        lat, bw = inst.latency_s, inst.bandwidth_MBps
        for t, task in enumerate(inst.tasks):
            n = len(task.gflop)
            gflop, weights, out = (np.asarray(v, dtype=float) for v in (task.gflop, task.weights_mb, task.out_mb))
            current = np.asarray(task.current)
            mb_in = np.concatenate([[task.in_mb], out[:-1]])  # (n,)
            # (n, a, b): the hop in from a to b, then the layer on b (processing plus migration)
            hop_in = _hop_s(mb_in[:, None, None], lat[None], bw[None], (nodes[:, None] == nodes[None, :])[None])
            move = inst.migration_weight * _hop_s(weights[:, None], lat[current], bw[current],
                                                  current[:, None] == nodes[None, :])
            layer_s = gflop[:, None] / speeds[None, :] + move  # (n, b)
            step = hop_in + layer_s[:, None, :]
            back = _hop_s(out[-1], lat[:, task.source], bw[:, task.source], nodes == task.source)  # (b,)
            step[-1] = step[-1] + back[None, :]
            self.step[t, :n] = step
            self.weights_mb[t, :n] = weights
            self.current[t, :n] = current
            for layer in range(n - 2, -1, -1):
                self.h[t, layer] = np.min(self.step[t, layer + 1] + self.h[t, layer + 1][None, :], axis=1)
        # suffix sums of each task's weights, summed left to right as Python's sum() does
        self.weights_from_mb = [[float(sum(t.weights_mb[j:])) for j in range(len(t.weights_mb) + 1)]
                                for t in inst.tasks]
        self.weights_from_mb_table = np.zeros((t_count, lmax + 1))
        for t, sums in enumerate(self.weights_from_mb):
            self.weights_from_mb_table[t, :len(sums)] = sums
