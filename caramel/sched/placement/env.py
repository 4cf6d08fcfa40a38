"""The placement environment (gymnasium; needs the `rl` extra).

Layers are placed one at a time, in greedy_regret's order (the open task whose next layer loses
most by missing its best node goes next). The agent sees the K nodes as rows sorted by
lookahead score (what the layer adds now plus the rest of its chain's cost-to-go), nodes where
the layer does not fit masked, so action 0 is greedy_regret's own choice. The reward is minus
the cost the placed layer adds, over the instance's scale (its memory-free optimum per layer):
an episode's return is minus the placement's cost over that scale.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from caramel.errors import CaramelError
from caramel.sched.placement.heuristics import PlacementState
from caramel.sched.placement.instances import InstanceOptions, random_instance
from caramel.sched.placement.problem import Instance

NUM_FEATURES = 19


class PlacementEnv(gym.Env):
    """Episodes over seeded random instances (`seeds`, drawn at each reset) or over the
    instance given as `reset(options={"instance": inst})`. Every instance must have the same
    number of nodes (the observation has one row per node)."""

    metadata = {"render_modes": []}

    def __init__(self, options: InstanceOptions, seeds: list[int]):
        if not seeds:
            raise CaramelError("PlacementEnv needs at least one instance seed")
        self.instance_options, self.seeds = options, list(seeds)
        self.k = options.num_edge + 1
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(self.k, NUM_FEATURES), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.k)
        self.state: PlacementState | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "instance" in options:
            inst = options["instance"]
        else:
            inst = random_instance(self.instance_options, self.seeds[int(self.np_random.integers(len(self.seeds)))])
        if inst.num_nodes != self.k:
            raise CaramelError(f"instance has {inst.num_nodes} nodes; this environment was made for {self.k}")
        self.state = PlacementState(inst)
        tb = self.state.tables
        free_optimum = sum(float(np.min(tb.step[t, 0, task.source] + tb.h[t, 0])) for t, task in enumerate(inst.tasks))
        self.scale_s = free_optimum / self.state.total_layers
        # constant over the episode: the mean layer weight, each layer's weights in task order
        # (zeroed as placed: their running sum, in that order, is Python's sum of what is left)
        self._mean_mb = float(np.mean([w for task in inst.tasks for w in task.weights_mb]))
        self._left_mb = tb.weights_mb.copy()
        self._next()
        return self._observe(), {}

    def step(self, action: int):
        nodes = self.order
        a = int(action)
        if a >= len(nodes) or not np.isfinite(self._scores[nodes[a]]):
            a = 0  # a masked row (only a random or untrained agent picks one): the best node instead
        self._left_mb[self.task, len(self.state.placement[self.task])] = 0.0
        added = self.state.place(self.task, nodes[a])
        done = self.state.done
        if not done:
            self._next()
        obs = np.zeros(self.observation_space.shape, np.float32) if done else self._observe()
        return obs, -added / self.scale_s, done, False, {}

    def placement(self) -> list[list[int]]:
        return self.state.placement

    def _next(self) -> None:
        s = self.state
        self.task = s.most_regret_task()
        self._scores = s.scores(self.task)
        self._order = np.argsort(self._scores, kind="stable")
        self.order = [int(k) for k in self._order]

    def _observe(self) -> np.ndarray:
        """The (K, F) table, built with array operations over the K rows; equal, element for
        element, to `_observe_reference` (tested), whose per-row Python loop cost as much as
        choosing the next task."""
        s, inst, t, tb = self.state, self.state.inst, self.task, self.state.tables
        layer = len(s.placement[t])
        task = inst.tasks[t]
        need_mb, n_layers = task.weights_mb[layer], len(task.gflop)
        o, scores = self._order, self._scores[self._order]
        best = float(scores[0])
        second = float(scores[1]) if self.k > 1 else best
        regret = (second - best) / self.scale_s if np.isfinite(second) else 10.0
        left_mb = float(np.cumsum(self._left_mb.ravel())[-1])  # left to right, as sum() adds
        wished = s.wished_mb()
        cloud_score = float(self._scores[inst.cloud])
        fits = np.isfinite(scores)
        edge = o != inst.cloud
        free = np.append(s.free_mb, np.inf)[o]
        room = np.maximum(free, 1e-9)
        obs = np.empty((self.k, NUM_FEATURES), np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            obs[:, 0] = fits
            obs[:, 1] = np.arange(self.k) / self.k
            obs[:, 2] = tb.step[t, layer, s.prev[t], o] / self.scale_s
            obs[:, 3] = tb.h[t, layer, o] / self.scale_s
            obs[:, 4] = np.where(fits, np.minimum((scores - best) / self.scale_s, 10.0), 10.0)
            obs[:, 5] = ~edge
            obs[:, 6] = o == task.source
            obs[:, 7] = np.minimum(np.log1p(free / need_mb), 10.0)
            obs[:, 8] = np.where(edge, free / np.maximum(np.append(inst.memory_mb, 1.0)[o], 1e-9), 1.0)
            obs[:, 9] = min(np.log1p(left_mb / max(s.free_mb.sum(), 1e-9)), 10.0)
            obs[:, 10] = min(regret, 10.0)
            obs[:, 11] = s.placed / s.total_layers
            obs[:, 12] = np.asarray(inst.node_gflops)[o] / 1000.0
            obs[:, 13] = np.where(edge, np.minimum(np.log1p(wished[o] / room), 10.0), 0.0)
            obs[:, 14] = np.where(edge & fits, (cloud_score - scores) / self.scale_s * self._mean_mb / need_mb, 0.0)
            cur = task.current[layer]
            hop = np.where(o == cur, 0.0, inst.latency_s[cur, o] + need_mb / inst.bandwidth_MBps[cur, o])
            obs[:, 15] = inst.migration_weight * hop / self.scale_s
            obs[:, 16] = (n_layers - layer) / n_layers
            obs[:, 17] = np.where(edge, np.minimum(np.log1p(tb.weights_from_mb[t][layer] / room), 10.0), 0.0)
            obs[:, 18] = need_mb / self._mean_mb
        return obs.astype(np.float32)

    def _observe_reference(self) -> np.ndarray:
        """The observation, one row at a time in Python: what `_observe` must equal."""
        s, inst, t = self.state, self.state.inst, self.task
        layer = len(s.placement[t])
        need_mb = inst.tasks[t].weights_mb[layer]
        best = float(self._scores[self.order[0]])
        second = float(self._scores[self.order[1]]) if len(self.order) > 1 else best
        regret = (second - best) / self.scale_s if np.isfinite(second) else 10.0
        left_mb = sum(inst.tasks[u].weights_mb[j] for u in range(len(inst.tasks))
                      for j in range(len(s.placement[u]), len(inst.tasks[u].gflop)))
        wished = s.wished_mb()
        cloud_score = float(self._scores[inst.cloud])
        mean_mb = float(np.mean([w for task in inst.tasks for w in task.weights_mb]))
        task = inst.tasks[t]
        n_layers = len(task.gflop)
        obs = np.zeros((self.k, NUM_FEATURES), np.float32)
        for i, k in enumerate(self.order):
            fits = np.isfinite(self._scores[k])
            step = s.step_s(t, k)
            edge = k != inst.cloud
            free = s.free_mb[k] if edge else np.inf
            obs[i] = [float(fits), i / self.k, step / self.scale_s, s.h[t][layer, k] / self.scale_s,
                      min((self._scores[k] - best) / self.scale_s, 10.0) if fits else 10.0, float(not edge),
                      float(k == inst.tasks[t].source), min(np.log1p(free / need_mb), 10.0),
                      free / max(inst.memory_mb[k], 1e-9) if edge else 1.0,
                      min(np.log1p(left_mb / max(s.free_mb.sum(), 1e-9)), 10.0), min(regret, 10.0),
                      s.placed / s.total_layers, inst.node_gflops[k] / 1000.0,
                      min(np.log1p(wished[k] / max(free, 1e-9)), 10.0) if edge else 0.0,
                      # what this node saves over the cloud per MB of its memory the layer takes
                      (cloud_score - self._scores[k]) / self.scale_s * mean_mb / need_mb if edge and fits else 0.0,
                      # migration the option costs, layers of this task still to place, the
                      # weights they hold over this node's room, the task's own layer weight
                      inst.migration_weight * inst.hop_s(task.weights_mb[layer], task.current[layer], k) / self.scale_s,
                      (n_layers - layer) / n_layers,
                      min(np.log1p(sum(task.weights_mb[layer:]) / max(free, 1e-9)), 10.0) if edge else 0.0,
                      need_mb / mean_mb]
        return obs


def run_policy(env: PlacementEnv, inst: Instance, act) -> list[list[int]]:
    """Place the whole instance with `act(observation) -> action`; the placement."""
    obs, _ = env.reset(options={"instance": inst})
    done = False
    while not done:
        obs, _, done, _, _ = env.step(act(obs))
    return env.placement()
