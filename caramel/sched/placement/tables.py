"""Per-instance step-cost tables, so the placement state can score every node of every task's
next layer with array lookups instead of a Python call per (task, node).

`step[t, l, a, b]` is `Instance.step_s(t, l, a, b)` (what layer l of task t adds on node b after
its predecessor on node a), `h[t, l, b]` the memory-free cost-to-go after it
(`Instance.cost_to_go`), `weights_mb[t, l]` the layer's weights; tasks with fewer layers are
padded with zeros. Every entry is computed by the same floating-point operations, in the same
order, as the scalar methods of `Instance`, so lookups equal them exactly (tested): the
heuristics and the environment make the same choices through either.

The tables are built for all tasks at once, one array operation per term over the padded
(T, L, K, K) block (a layer at a time only for the cost-to-go's recursion and the suffix
sums): building them is part of every decoder's and heuristic's solve time. `reference=True`
builds them a task at a time (the loops this replaced, kept to test that both agree exactly).
"""
from __future__ import annotations

import numpy as np

from caramel.errors import CaramelError
from caramel.sched.placement.problem import Instance


def _hop_s(mb: np.ndarray, latency_s: np.ndarray, bandwidth_MBps: np.ndarray, same: np.ndarray) -> np.ndarray:
    """`Instance.hop_s` broadcast: 0 between a node and itself, else latency + MB / bandwidth."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(same, 0.0, latency_s + mb / bandwidth_MBps)


class StepTables:
    """The tables of one instance (built once; shared by every clone of a state)."""

    def __init__(self, inst: Instance, reference: bool = False):
        if not isinstance(reference, bool):
            raise CaramelError(f"StepTables: reference must be True or False, got {reference!r}")
        t_count = len(inst.tasks)
        self.num_layers = np.array([len(t.gflop) for t in inst.tasks])
        lmax = int(self.num_layers.max()) if t_count else 0
        self.source = np.array([t.source for t in inst.tasks], dtype=int)
        if reference or t_count == 0:
            self._build_per_task(inst, lmax)
        else:
            self._build_at_once(inst, lmax)

    def _build_at_once(self, inst: Instance, lmax: int) -> None:
        """Every task in one set of array operations: the same elementwise floats as
        `_build_per_task` (padding past a task's end is computed, then zeroed)."""
        t_count, k = len(inst.tasks), inst.num_nodes
        n = self.num_layers
        valid = np.arange(lmax)[None, :] < n[:, None]  # (T, L)
        gflop, weights, out = (np.zeros((t_count, lmax)) for _ in range(3))
        current = np.zeros((t_count, lmax), dtype=int)
        in_mb = np.array([t.in_mb for t in inst.tasks], dtype=float)
        for t, task in enumerate(inst.tasks):  # filling the padded rows: the only loop over tasks
            m = len(task.gflop)
            gflop[t, :m], weights[t, :m], out[t, :m], current[t, :m] = (task.gflop, task.weights_mb, task.out_mb,
                                                                        task.current)
        nodes = np.arange(k)
        speeds = np.asarray(inst.node_gflops, dtype=float)
        lat, bw = inst.latency_s, inst.bandwidth_MBps
        mb_in = np.concatenate([in_mb[:, None], out[:, :-1]], axis=1)  # (T, L)
        hop_in = _hop_s(mb_in[:, :, None, None], lat[None, None], bw[None, None],
                        (nodes[:, None] == nodes[None, :])[None, None])  # (T, L, a, b)
        move = inst.migration_weight * _hop_s(weights[:, :, None], lat[current], bw[current],
                                              current[:, :, None] == nodes)  # (T, L, b)
        layer_s = gflop[:, :, None] / speeds + move
        step = hop_in + layer_s[:, :, None, :]
        last, src = n - 1, self.source
        out_last = out[np.arange(t_count), last]
        back = _hop_s(out_last[:, None], lat[:, src].T, bw[:, src].T, nodes[None, :] == src[:, None])  # (T, b)
        step[np.arange(t_count), last] = step[np.arange(t_count), last] + back[:, None, :]
        self.step = np.where(valid[:, :, None, None], step, 0.0)
        self.h = np.zeros((t_count, lmax, k))
        for layer in range(lmax - 2, -1, -1):
            best = np.min(self.step[:, layer + 1] + self.h[:, layer + 1][:, None, :], axis=2)
            self.h[:, layer] = np.where((layer + 1 < n)[:, None], best, 0.0)
        self.weights_mb = np.where(valid, weights, 0.0)
        self.current = np.where(valid, current, 0)
        # suffix sums of each task's weights, summed left to right from 0 as Python's sum() does
        table = np.zeros((t_count, lmax + 1))
        starts = np.arange(lmax + 1)[None, :]
        for offset in range(lmax):
            at = starts + offset
            table += np.where(at < n[:, None], self.weights_mb[:, np.minimum(at, lmax - 1)[0]], 0.0)
        self.weights_from_mb_table = table
        self.weights_from_mb = [table[t, :m + 1].tolist() for t, m in enumerate(n.tolist())]

    def _build_per_task(self, inst: Instance, lmax: int) -> None:
        """A task at a time (the reference)."""
        t_count, k = len(inst.tasks), inst.num_nodes
        self.step = np.zeros((t_count, lmax, k, k))
        self.h = np.zeros((t_count, lmax, k))
        self.weights_mb = np.zeros((t_count, lmax))
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
        self.weights_from_mb = [[float(sum(t.weights_mb[j:])) for j in range(len(t.weights_mb) + 1)]
                                for t in inst.tasks]
        self.weights_from_mb_table = np.zeros((t_count, lmax + 1))
        for t, sums in enumerate(self.weights_from_mb):
            self.weights_from_mb_table[t, :len(sums)] = sums
