"""N rollouts of one placement instance as arrays with a leading rollout axis.

Sampling decoding (`decode`) runs N episodes of the same instance in lockstep (every episode
places one layer per step). Stepping N `PlacementEnv`s one by one costs N times the Python work
of one step; here each step is one set of array operations over all N: pick each rollout's next
task (greedy_regret's order), sort its nodes, build the (N, K, F) observation, place the chosen
layers. Every array holds what the N single environments would, computed by the same float
operations, so observations, placements and costs equal theirs exactly (tested).
"""
from __future__ import annotations

import numpy as np

from caramel.errors import CaramelError
from caramel.sched.placement.env import NUM_FEATURES
from caramel.sched.placement.heuristics import MEMORY_SLACK_MB
from caramel.sched.placement.problem import Instance
from caramel.sched.placement.tables import StepTables


def wish_table(tb: StepTables, k: int, reference: bool = False) -> np.ndarray:
    """(T, L + 1, K, K): [t, l, a] is the edge memory, per node, that task t's memory-free best
    continuation from layer l after node a takes (zeros once l is past the task's end). Built
    once per instance, all (t, l, a) walked together a layer at a time, each one's weights
    added in chain order from zero as `_rewish_reference` adds them, so the same floats. Each
    (task, layer, node)'s best next node is looked up in a table of them built once (one argmin
    over the (T, L, K, K) block); `reference=True` redoes that argmin at every layer of the walk
    (the loop this replaced, kept to test that both agree exactly)."""
    if not isinstance(reference, bool):
        raise CaramelError(f"wish_table: reference must be True or False, got {reference!r}")
    t_count, lmax = tb.weights_mb.shape
    table = np.zeros((t_count, lmax + 1, k, k))
    if reference:
        return _wish_walk_reference(tb, k, table)
    best_next = np.argmin(tb.step + tb.h[:, :, None, :], axis=-1).ravel()  # [t, l, a]: the first best b
    cells = t_count * (lmax + 1) * k  # one (t, l, a) walk each, on flat indices
    ti = np.repeat(np.arange(t_count), (lmax + 1) * k)
    li = np.tile(np.repeat(np.arange(lmax + 1), k), t_count)
    prev = np.tile(np.arange(k), t_count * (lmax + 1))
    stop = tb.num_layers[ti]
    weights = tb.weights_mb.ravel()
    flat = table.reshape(-1)
    base = np.arange(cells) * k
    for offset in range(lmax):
        layer = li + offset
        active = layer < stop
        at = ti * lmax + np.minimum(layer, lmax - 1)  # flat (t, layer)
        prev = np.where(active, best_next[at * k + prev], prev)
        flat[base + prev] += np.where(active, weights[at], 0.0)
    return table


def _wish_walk_reference(tb: StepTables, k: int, table: np.ndarray) -> np.ndarray:
    t_count, lmax = tb.weights_mb.shape
    ti, li, ai = np.meshgrid(np.arange(t_count), np.arange(lmax + 1), np.arange(k), indexing="ij")
    prev = ai.copy()
    for offset in range(lmax):
        layer = li + offset
        active = layer < tb.num_layers[ti]
        at = np.minimum(layer, lmax - 1)
        best = np.argmin(tb.step[ti, at, prev] + tb.h[ti, at], axis=-1)
        prev = np.where(active, best, prev)
        table[ti, li, ai, prev] += np.where(active, tb.weights_mb[ti, at], 0.0)
    return table


def scale_and_mean_mb(inst: Instance, tb: StepTables) -> tuple[float, float]:
    """As `PlacementEnv.reset`: the memory-free optimum per layer (the reward's scale) and the
    mean layer weight."""
    free_optimum = sum(float(np.min(tb.step[t, 0, task.source] + tb.h[t, 0])) for t, task in enumerate(inst.tasks))
    scale_s = free_optimum / int(tb.num_layers.sum())
    return scale_s, float(np.mean([w for task in inst.tasks for w in task.weights_mb]))


def static_features(tb: StepTables, inst: Instance, scale_s: float, mean_mb: float) -> np.ndarray:
    """(T, L, K, F) float32: the observation's columns that depend only on (task, layer, node),
    computed once per instance by the float operations `PlacementEnv._observe` does per step
    (so the same values): each step gathers them instead of recomputing."""
    t_count, lmax = tb.weights_mb.shape
    k = inst.num_nodes
    nodes = np.arange(k)
    need = tb.weights_mb[:, :, None]  # (T, L, 1)
    cur = tb.current[:, :, None]
    n_layers = tb.num_layers[:, None, None]
    static = np.zeros((t_count, lmax, k, NUM_FEATURES))
    with np.errstate(invalid="ignore", divide="ignore"):
        static[..., 3] = tb.h / scale_s
        static[..., 5] = nodes == inst.cloud
        static[..., 6] = nodes == tb.source[:, None, None]
        static[..., 12] = np.asarray(inst.node_gflops)[nodes] / 1000.0
        hop = np.where(nodes == cur, 0.0, inst.latency_s[cur, nodes] + need / inst.bandwidth_MBps[cur, nodes])
        static[..., 15] = inst.migration_weight * hop / scale_s
        static[..., 16] = (n_layers - np.arange(lmax)[None, :, None]) / n_layers
        static[..., 18] = need / mean_mb
    return static.astype(np.float32)


class BatchPlacement:
    """`rollouts` episodes of `inst`, observed and stepped together."""

    def __init__(self, inst: Instance, rollouts: int, tables: StepTables | None = None):
        if rollouts < 1:
            raise CaramelError(f"BatchPlacement needs rollouts >= 1, got {rollouts}")
        self.inst, self.n = inst, rollouts
        self.tables = tb = tables if tables is not None else StepTables(inst)
        t_count, lmax = tb.weights_mb.shape
        self.k = inst.num_nodes
        self._rows, self._tasks = np.arange(rollouts), np.arange(t_count)
        self.next_layer = np.zeros((rollouts, t_count), dtype=int)
        self.prev = np.tile(np.array([t.source for t in inst.tasks]), (rollouts, 1))
        # memory left per node, the cloud's column inf (it never runs out): `free_mb` is the edge view
        self._free_ext = np.full((rollouts, self.k), np.inf)
        self._free_ext[:, :-1] = inst.memory_mb
        self.free_mb = self._free_ext[:, :-1]
        self.cost_s = np.zeros(rollouts)
        self.nodes = np.full((rollouts, t_count, lmax), -1)
        self.left_mb = np.tile(tb.weights_mb, (rollouts, 1, 1))
        self.total_layers, self.placed = int(tb.num_layers.sum()), 0
        self._wish_table = wish_table(tb, self.k)
        self.wish_mb = np.tile(self._wish_table[self._tasks, 0, self.prev[0]], (rollouts, 1, 1))
        # as PlacementEnv.reset: the memory-free optimum per layer, the mean layer weight
        self.scale_s, self.mean_mb = scale_and_mean_mb(inst, tb)
        self._static_tables()
        # each task's next layer's lookahead scores before the memory check, and its weights:
        # they change only when the task places a layer
        self._base = np.tile(tb.step[self._tasks, 0, self.prev[0]] + tb.h[:, 0], (rollouts, 1, 1))
        self._need = np.tile(tb.weights_mb[:, 0], (rollouts, 1))
        self._next()

    def _static_tables(self) -> None:
        self._static = static_features(self.tables, self.inst, self.scale_s, self.mean_mb)
        self._step_scaled = self.tables.step / self.scale_s
        self._row_pos = np.arange(self.k) / self.k
        self._memory_ext = np.maximum(np.append(self.inst.memory_mb, 1.0), 1e-9)

    @property
    def done(self) -> bool:
        return self.placed == self.total_layers

    def placements(self) -> list[list[list[int]]]:
        return [[[int(x) for x in self.nodes[i, t, :n]] for t, n in enumerate(self.tables.num_layers)]
                for i in range(self.n)]

    def _rewish(self, task: np.ndarray) -> None:
        """Per rollout, the memory-free best continuation of `task[i]` from where it stands: one
        lookup in the instance's `wish_table` (equal to `_rewish_reference`, tested)."""
        rows = self._rows
        self.wish_mb[rows, task] = self._wish_table[task, self.next_layer[rows, task], self.prev[rows, task]]

    def _rewish_reference(self, task: np.ndarray) -> None:
        """`_rewish` walking the continuation a layer at a time (a loop per step)."""
        tb, rows = self.tables, self._rows
        wish = np.zeros((self.n, self.k))
        prev = self.prev[rows, task]
        start, stop = self.next_layer[rows, task], tb.num_layers[task]
        for layer in range(int(start.min()), int(stop.max())):
            active = (layer >= start) & (layer < stop)
            at = min(layer, tb.step.shape[1] - 1)
            best = np.argmin(tb.step[task, at, prev] + tb.h[task, at], axis=1)
            prev = np.where(active, best, prev)
            wish[rows, prev] += np.where(active, tb.weights_mb[task, at], 0.0)
        self.wish_mb[rows, task] = wish

    def _next(self) -> None:
        """Each rollout's next task (the open one with most regret; ties: lowest index), its
        node scores, and the nodes in score order."""
        fits = self._need[..., None] <= self._free_ext[:, None, :] + MEMORY_SLACK_MB  # the cloud: <= inf
        s = np.where(fits, self._base, np.inf)  # (N, T, K)
        ordered = np.sort(s, axis=2)
        with np.errstate(invalid="ignore"):
            regret = np.where(np.isfinite(ordered[..., 1]), ordered[..., 1] - ordered[..., 0], np.inf)
        regret[self.next_layer >= self.tables.num_layers] = -np.inf
        self.task = np.argmax(regret, axis=1)
        self.scores = s[self._rows, self.task]
        self.order = np.argsort(self.scores, axis=1, kind="stable")

    def observe(self) -> np.ndarray:
        """(N, K, F) float32: each rollout's `PlacementEnv` observation (tested equal)."""
        tb, inst, rows, t = self.tables, self.inst, self._rows, self.task
        layer = self.next_layer[rows, t]
        need = tb.weights_mb[t, layer][:, None]
        o, tc, lc = self.order, t[:, None], layer[:, None]
        obs = self._static[tc, lc, o]  # a fresh (N, K, F) array; float64 values stored round as astype
        obs[..., 1] = self._row_pos
        obs[..., 2] = self._step_scaled[tc, lc, self.prev[rows, t][:, None], o]
        scores = self.scores[rows[:, None], o]
        best, second = scores[:, :1], scores[:, 1:2]
        with np.errstate(invalid="ignore", divide="ignore"):
            regret = np.where(np.isfinite(second), (second - best) / self.scale_s, 10.0)
            left_mb = np.cumsum(self.left_mb.reshape(self.n, -1), axis=1)[:, -1:]  # left to right, as sum()
            wished = np.sum(self.wish_mb, axis=1)[rows[:, None], o]
            cloud_score = self.scores[:, inst.cloud][:, None]
            fits = np.isfinite(scores)
            edge = o != inst.cloud
            free = self._free_ext[rows[:, None], o]
            room = np.maximum(free, 1e-9)
            obs[..., 0] = fits
            obs[..., 4] = np.where(fits, np.minimum((scores - best) / self.scale_s, 10.0), 10.0)
            obs[..., 7] = np.minimum(np.log1p(free / need), 10.0)
            obs[..., 8] = np.where(edge, free / self._memory_ext[o], 1.0)
            obs[..., 9] = np.minimum(np.log1p(left_mb / np.maximum(self.free_mb.sum(axis=1, keepdims=True), 1e-9)),
                                     10.0)
            obs[..., 10] = np.minimum(regret, 10.0)
            obs[..., 11] = self.placed / self.total_layers
            obs[..., 13] = np.where(edge, np.minimum(np.log1p(wished / room), 10.0), 0.0)
            obs[..., 14] = np.where(edge & fits, (cloud_score - scores) / self.scale_s * self.mean_mb / need, 0.0)
            obs[..., 17] = np.where(edge, np.minimum(np.log1p(tb.weights_from_mb_table[t, layer][:, None] / room),
                                                     10.0), 0.0)
        return obs

    def step(self, actions: np.ndarray) -> None:
        """Place each rollout's layer on the node of its row `actions[i]` (a row without room:
        row 0, as `PlacementEnv.step` does)."""
        tb, rows, t = self.tables, self._rows, self.task
        a = np.asarray(actions, dtype=int)
        if a.shape != (self.n,) or (a < 0).any() or (a >= self.k).any():
            raise CaramelError(f"actions must be {self.n} rows in 0..{self.k - 1}, got {actions!r}")
        node = self.order[rows, a]
        bad = ~np.isfinite(self.scores[rows, node])
        node = np.where(bad, self.order[:, 0], node)
        layer = self.next_layer[rows, t]
        self.cost_s += tb.step[t, layer, self.prev[rows, t], node]
        edge = node != self.inst.cloud
        self.free_mb[rows[edge], node[edge]] -= tb.weights_mb[t[edge], layer[edge]]
        self.left_mb[rows, t, layer] = 0.0
        self.nodes[rows, t, layer] = node
        self.next_layer[rows, t] += 1
        self.prev[rows, t] = node
        self.placed += 1
        self._rewish(t)
        at = np.minimum(layer + 1, tb.step.shape[1] - 1)  # a finished task's row is masked by regret
        self._base[rows, t] = tb.step[t, at, node] + tb.h[t, at]
        self._need[rows, t] = tb.weights_mb[t, at]
        if not self.done:
            self._next()
