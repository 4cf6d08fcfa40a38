"""Greedy placements, and the partial-placement state they (and the environment) build on.

`PlacementState` places one layer at a time, each task's layers in chain order, and knows what
each choice adds, the exact cost-to-go of the rest of a task's chain ignoring memory, and the
edge memory left. The heuristics:
  all_cloud       every layer in the cloud (always feasible),
  greedy_myopic   tasks in turn, each next layer on the node that adds least now,
  greedy_lookahead  the same, counting the rest of the chain (cost-to-go) too,
  greedy_regret   at each point the task whose next layer loses most if it misses its best
                  node (lookahead scores: second best minus best) goes first, to its best node.
"""
from __future__ import annotations

import copy

import numpy as np

from caramel.sched.placement.problem import Instance
from caramel.sched.placement.tables import StepTables

MEMORY_SLACK_MB = 1e-9


class PlacementState:
    """A partial placement: next layer per task, each task's last node, memory left, cost so far.

    Scores come from the instance's `StepTables` (array lookups); the `*_reference` methods
    are the plain per-(task, node) loops they replace, kept to test that both agree exactly."""

    def __init__(self, inst: Instance, tables: StepTables | None = None):
        self.inst = inst
        self.tables = tables if tables is not None else StepTables(inst)
        self.placement: list[list[int]] = [[] for _ in inst.tasks]
        self.next_layer = np.zeros(len(inst.tasks), dtype=int)
        self.prev = np.array([t.source for t in inst.tasks], dtype=int)
        self.free_mb = np.array(inst.memory_mb, dtype=float)
        self.cost_s = 0.0
        self.h = [self.tables.h[t, :len(task.gflop)] for t, task in enumerate(inst.tasks)]
        self.total_layers = sum(len(t.gflop) for t in inst.tasks)
        self.placed = 0
        # per task, the edge memory its memory-free best continuation would take (per node)
        self._wish_mb = np.array([self._wish(t) for t in range(len(inst.tasks))]).reshape(len(inst.tasks), -1)

    def _wish(self, t: int) -> np.ndarray:
        wish = np.zeros(self.inst.num_nodes)
        prev = self.prev[t]
        step, h, weights = self.tables.step[t], self.tables.h[t], self.tables.weights_mb[t]
        for layer in range(len(self.placement[t]), len(self.inst.tasks[t].gflop)):
            prev = int(np.argmin(step[layer, prev] + h[layer]))  # the first best, as min() picks
            wish[prev] += weights[layer]
        return wish

    def _wish_reference(self, t: int) -> np.ndarray:
        wish = np.zeros(self.inst.num_nodes)
        prev = int(self.prev[t])
        for layer in range(len(self.placement[t]), len(self.inst.tasks[t].gflop)):
            prev = min(range(self.inst.num_nodes),
                       key=lambda k: self.inst.step_s(t, layer, prev, k) + self.h[t][layer, k])
            wish[prev] += self.inst.tasks[t].weights_mb[layer]
        return wish

    def wished_mb(self) -> np.ndarray:
        """Per node: the weights the open layers would put there if memory were unlimited (each
        task's best continuation from where it stands)."""
        return np.sum(self._wish_mb, axis=0)

    @property
    def done(self) -> bool:
        return self.placed == self.total_layers

    def clone(self) -> "PlacementState":
        """An independent copy (the instance and its tables shared): to try a choice."""
        c = copy.copy(self)
        c.placement = [list(p) for p in self.placement]
        c.next_layer, c.prev, c.free_mb, c._wish_mb = (self.next_layer.copy(), self.prev.copy(),
                                                       self.free_mb.copy(), self._wish_mb.copy())
        return c

    def open_tasks(self) -> list[int]:
        return [int(t) for t in np.flatnonzero(self.next_layer < self.tables.num_layers)]

    def fits(self, t: int, node: int) -> bool:
        if node == self.inst.cloud:
            return True
        layer = len(self.placement[t])
        return self.inst.tasks[t].weights_mb[layer] <= self.free_mb[node] + MEMORY_SLACK_MB

    def step_s(self, t: int, node: int) -> float:
        return float(self.tables.step[t, self.next_layer[t], self.prev[t], node])

    def scores(self, t: int) -> np.ndarray:
        """Per node: what placing task t's next layer there adds now plus the cost-to-go after it
        (inf where it does not fit)."""
        tb, layer = self.tables, self.next_layer[t]
        s = tb.step[t, layer, self.prev[t]] + tb.h[t, layer]
        fits = np.append(tb.weights_mb[t, layer] <= self.free_mb + MEMORY_SLACK_MB, True)
        return np.where(fits, s, np.inf)

    def _scores_rows(self, tasks: np.ndarray) -> np.ndarray:
        """`scores` of several tasks at once, (len(tasks), K); a finished task's row is junk."""
        tb = self.tables
        layer = np.minimum(self.next_layer[tasks], tb.step.shape[1] - 1)
        s = tb.step[tasks, layer, self.prev[tasks]] + tb.h[tasks, layer]
        fits = np.ones_like(s, dtype=bool)
        fits[:, :-1] = tb.weights_mb[tasks, layer][:, None] <= self.free_mb[None, :] + MEMORY_SLACK_MB
        return np.where(fits, s, np.inf)

    def _scores_reference(self, t: int) -> np.ndarray:
        layer = len(self.placement[t])
        return np.array([self.inst.step_s(t, layer, int(self.prev[t]), k) + self.h[t][layer, k]
                         if self.fits(t, k) else np.inf for k in range(self.inst.num_nodes)])

    def regret(self, t: int) -> float:
        s = np.sort(self.scores(t))
        return float(s[1] - s[0]) if np.isfinite(s[1]) else float("inf")

    def place(self, t: int, node: int) -> float:
        """Put task t's next layer on `node`; returns the cost it adds."""
        assert self.fits(t, node), f"layer does not fit on node {node}"
        layer = len(self.placement[t])
        added = self.step_s(t, node)
        if node != self.inst.cloud:
            self.free_mb[node] -= self.inst.tasks[t].weights_mb[layer]
        self.placement[t].append(node)
        self.next_layer[t] += 1
        self.prev[t] = node
        self.cost_s += added
        self.placed += 1
        self._wish_mb[t] = self._wish(t)
        return added

    def most_regret_task(self) -> int:
        """The open task with the largest regret (ties: lowest index)."""
        open_ = np.flatnonzero(self.next_layer < self.tables.num_layers)
        s = np.sort(self._scores_rows(open_), axis=1)
        with np.errstate(invalid="ignore"):
            regrets = np.where(np.isfinite(s[:, 1]), s[:, 1] - s[:, 0], np.inf)
        return int(open_[int(np.argmax(regrets))])

    def _most_regret_task_reference(self) -> int:
        open_ = self.open_tasks()
        regrets = []
        for t in open_:
            s = np.sort(self._scores_reference(t))
            regrets.append(float(s[1] - s[0]) if np.isfinite(s[1]) else float("inf"))
        return open_[int(np.argmax(regrets))]


def all_cloud(inst: Instance) -> list[list[int]]:
    return [[inst.cloud] * len(t.gflop) for t in inst.tasks]


def _round_robin(inst: Instance, lookahead: bool, tables: StepTables | None = None) -> list[list[int]]:
    state = PlacementState(inst, tables)
    while not state.done:
        for t in state.open_tasks():
            if lookahead:
                node = int(np.argmin(state.scores(t)))
            else:
                node = min((k for k in range(inst.num_nodes) if state.fits(t, k)), key=lambda k: state.step_s(t, k))
            state.place(t, node)
    return state.placement


def greedy_myopic(inst: Instance, tables: StepTables | None = None) -> list[list[int]]:
    return _round_robin(inst, lookahead=False, tables=tables)


def greedy_lookahead(inst: Instance, tables: StepTables | None = None) -> list[list[int]]:
    return _round_robin(inst, lookahead=True, tables=tables)


def greedy_regret(inst: Instance, tables: StepTables | None = None) -> list[list[int]]:
    """`tables`: the instance's `StepTables` if already built (they are built otherwise)."""
    state = PlacementState(inst, tables)
    while not state.done:
        t = state.most_regret_task()
        state.place(t, int(np.argmin(state.scores(t))))
    return state.placement


HEURISTICS = {"all_cloud": all_cloud, "greedy_myopic": greedy_myopic, "greedy_lookahead": greedy_lookahead,
              "greedy_regret": greedy_regret}
