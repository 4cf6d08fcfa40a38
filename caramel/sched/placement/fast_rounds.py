"""The round decoder's state with its per-instance and per-round work cached: the same
observations, settling and placements as `rounds.RoundBatch` (the reference, kept as is), in
fewer array operations.

A large instance's decode (30 tasks of 8 layers: 8 rounds) spent most of its time not in
arithmetic but in numpy's per-call cost: about 60 small operations per observation and 40 per
settled round, several of them `take_along_axis`/`put_along_axis`, whose Python-level index
building costs more than the gather. Here:
  - the lookahead scores' table `step + h` is added once per instance, so a round's scores are
    one gather (the same sums: each entry is the same `step + h` addition);
  - each task's row of the wish table (`batch.wish_table`) is kept per sample and updated only
    for the tasks a round placed, instead of gathered for every task at every round;
  - the round's tasks and its groups' ends are computed once per round count;
  - gathers along the node axis index with cached (S, A, 1) grids instead of `take_along_axis`.
Every value is computed by the same floating-point operations on the same operands as the
reference, so the observations, the settled nodes and the memory left equal it bit for bit
(tested on several seeds, sizes, sample counts and group counts).
"""
from __future__ import annotations

import numpy as np

from caramel.sched.placement.batch import wish_table
from caramel.sched.placement.heuristics import MEMORY_SLACK_MB
from caramel.sched.placement.problem import Instance
from caramel.sched.placement.rounds import RoundBatch
from caramel.sched.placement.tables import StepTables


def commit_fast(chosen: np.ndarray, priority: np.ndarray, order: np.ndarray, need_mb: np.ndarray,
                free_ext_mb: np.ndarray) -> np.ndarray:
    """`rounds.commit` (same arguments, same passes, same floats) with direct gathers."""
    s_count, a_count = chosen.shape
    k = free_ext_mb.shape[1]
    rows = np.arange(s_count)[:, None]
    cand = chosen[rows, priority]
    need = np.broadcast_to(need_mb, chosen.shape)[rows, priority]
    ordp = order[rows, priority]
    final = np.full((s_count, a_count), -1)
    pending = np.ones((s_count, a_count), dtype=bool)
    nodes = np.arange(k)
    cols = np.arange(a_count)[None, :]
    while True:
        claim = (cand[..., None] == nodes) & pending[..., None]
        weights = np.where(claim, need[..., None], 0.0)
        mine = np.cumsum(weights, axis=1)[rows, cols, cand]
        ok = pending & (mine <= free_ext_mb[rows, cand] + MEMORY_SLACK_MB)
        final[ok] = cand[ok]
        free_ext_mb -= np.where(ok[..., None], weights, 0.0).sum(axis=1)  # the cloud stays inf
        pending &= ~ok
        if not pending.any():
            break
        fits = need[..., None] <= free_ext_mb[rows[..., None], ordp] + MEMORY_SLACK_MB
        first = ordp[rows, cols, np.argmax(fits, axis=2)]
        cand = np.where(pending, first, cand)
    out = np.empty_like(final)
    out[rows, priority] = final
    return out


class FastRoundBatch(RoundBatch):
    """`RoundBatch` (same constructor, same interface) with the caches of the module."""

    def __init__(self, inst: Instance, samples: int, tables: StepTables | None = None, groups: int = 1):
        super().__init__(inst, samples, tables if tables is not None else StepTables(inst), groups)
        tb = self.tables
        self._base_table = tb.step + tb.h[:, :, None, :]  # (T, L, K, K): as `_scores` adds them
        t_count = len(tb.num_layers)
        self._all_tasks = np.arange(t_count)[None, :]
        # each sample's per-task wish row, as the reference gathers it every round
        self._wish = self._wish_table[self._all_tasks, np.minimum(self._next_layer, tb.num_layers[None, :]),
                                      self.prev]
        self._rounds: dict[int, tuple] = {}

    def _make_wish_table(self, tb: StepTables) -> np.ndarray:
        return wish_table(tb, self.k)

    def _scores(self, tasks: np.ndarray) -> np.ndarray:
        r = self.layer
        base = self._base_table[tasks, r, self.prev[self._samples, tasks]]
        need = self.tables.weights_mb[tasks, r]
        # the cloud's room is inf: need <= inf, as the reference's column of ones
        return np.where(need[..., None] <= self._free_ext[:, None, :] + MEMORY_SLACK_MB, base, np.inf)

    def _start_round(self) -> None:
        r = self.layer
        if self.groups > 1:
            super()._start_round()
            return
        if r not in self._rounds:
            act = np.flatnonzero(self.tables.num_layers > r)
            self._rounds[r] = (act, np.broadcast_to(act, (self.n, len(act))), [0, len(act)])
        self.active, self._round_tasks, self._ends = self._rounds[r]

    def observe(self) -> np.ndarray:
        """`RoundBatch.observe`, equal to it bit for bit."""
        tb, r, rows = self.tables, self.layer, self._samples
        if self._group == 0:
            self._start_round()
        self.tasks = tk = self._round_tasks[:, self._ends[self._group]:self._ends[self._group + 1]]
        a_count = tk.shape[1]
        ii, jj = rows[..., None], np.arange(a_count)[None, :, None]
        prev = self.prev[rows, tk]  # (S, A)
        self._need = need = tb.weights_mb[tk, r]
        self.scores = s = self._scores(tk)
        self.order = o = np.argsort(s, axis=2, kind="stable")
        scores = s[ii, jj, o]
        best, second = scores[..., :1], scores[..., 1:2]
        ta = tk[..., None]
        obs = self._static[ta, r, o]
        obs[..., 1] = self._row_pos
        obs[..., 2] = self._step_scaled[ta, r, prev[..., None], o]
        with np.errstate(invalid="ignore", divide="ignore"):
            finite = np.isfinite(second)
            self.regret = np.where(finite[..., 0], second[..., 0] - best[..., 0], np.inf)
            regret = np.where(finite, (second - best) / self.scale_s, 10.0)
            left_mb = np.cumsum(self._left_mb, axis=1)[:, -1]  # left to right, as sum()
            wished = np.sum(self._wish, axis=1)[ii, o]
            cloud_score = s[..., self.inst.cloud][..., None]
            ok = np.isfinite(scores)
            edge = o != self.inst.cloud
            free = self._free_ext[ii, o]
            room = np.maximum(free, 1e-9)
            needc = need[..., None]
            obs[..., 0] = ok
            obs[..., 4] = np.where(ok, np.minimum((scores - best) / self.scale_s, 10.0), 10.0)
            obs[..., 7] = np.minimum(np.log1p(free / needc), 10.0)
            obs[..., 8] = np.where(edge, free / self._memory_ext[o], 1.0)
            obs[..., 9] = np.minimum(np.log1p(left_mb / np.maximum(self.free_mb.sum(axis=1), 1e-9)),
                                     10.0)[:, None, None]
            obs[..., 10] = np.minimum(regret, 10.0)
            obs[..., 11] = self.placed / self.total_layers
            obs[..., 13] = np.where(edge, np.minimum(np.log1p(wished / room), 10.0), 0.0)
            obs[..., 14] = np.where(edge & ok, (cloud_score - scores) / self.scale_s * self.mean_mb / needc, 0.0)
            obs[..., 17] = np.where(edge, np.minimum(np.log1p(tb.weights_from_mb_table[ta, r] / room), 10.0), 0.0)
        return obs

    def step(self, actions: np.ndarray) -> np.ndarray:
        """`RoundBatch.step` (the same nodes and memory), keeping the wish rows current."""
        if not hasattr(self, "order"):  # before observe(), or twice: the reference's error
            return super().step(actions)
        tk, r, rows = self.tasks, self.layer, self._samples
        node = self._settle(actions)
        self._wish[rows, tk] = self._wish_table[tk, r + 1, node]  # the task's next layer is r + 1
        return node

    def _settle(self, actions: np.ndarray) -> np.ndarray:
        tk, r, rows = self.tasks, self.layer, self._samples
        a = np.asarray(actions, dtype=int)
        if a.shape != tk.shape or (a < 0).any() or (a >= self.k).any():
            return super().step(actions)  # raises the reference's error
        cols = np.arange(tk.shape[1])[None, :]
        node = self.order[rows, cols, a]
        bad = ~np.isfinite(self.scores[rows, cols, node])
        node = np.where(bad, self.order[..., 0], node)
        node = commit_fast(node, self.priority(), self.order, self._need, self._free_ext)
        self.nodes[rows, tk, r] = node
        self.prev[rows, tk] = node
        self._left_mb[rows, tk * self.tables.weights_mb.shape[1] + r] = 0.0
        self._next_layer[rows, tk] = r + 1
        self.placed += tk.shape[1]
        self._group += 1
        if self._group == len(self._ends) - 1:
            self._group = 0
            self.layer += 1
        del self.order
        return node
