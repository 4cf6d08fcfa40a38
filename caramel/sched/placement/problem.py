"""Edge-cloud layer placement: which node runs each layer of each task's layer chain.

Nodes 0..E-1 are edge nodes, node E is the cloud. Task t starts at its edge node (`source`,
where its input is and where its result must return) and runs its layers in order. A placement
puts every layer on one node; its cost, in seconds, summed over tasks, is
  processing: each layer's GFLOP over its node's GFLOP/s,
  transfer:   each hop between two different nodes (source -> layer 0 -> ... -> last layer ->
              source) costs the link's latency plus the megabytes crossing it over its MB/s,
  migration:  a layer placed away from its `current` node moves its weights there first
              (its megabytes over that link, times `migration_weight`).
Edge nodes hold at most `memory_mb` of weights; the cloud has no limit, so a placement always
exists. `cost_to_go` is the exact remaining cost of a task's chain ignoring memory (a DP).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from caramel.errors import CaramelError


@dataclass(frozen=True)
class Task:
    source: int  # edge node holding the input and receiving the result
    gflop: tuple[float, ...]  # per layer
    weights_mb: tuple[float, ...]  # per layer
    out_mb: tuple[float, ...]  # activation each layer sends on (the last one: the result)
    in_mb: float  # the input
    current: tuple[int, ...]  # where each layer runs now (migration is measured from there)


@dataclass(frozen=True)
class Instance:
    tasks: tuple[Task, ...]
    node_gflops: tuple[float, ...]  # compute speed per node, the cloud last
    memory_mb: tuple[float, ...]  # per edge node (the cloud: unlimited)
    bandwidth_MBps: np.ndarray  # (K, K) between nodes
    latency_s: np.ndarray  # (K, K)
    migration_weight: float = 1.0

    def __post_init__(self) -> None:
        k = self.num_nodes
        if k < 2 or len(self.memory_mb) != k - 1:
            raise CaramelError(f"an instance needs >= 1 edge node and the cloud, with memory_mb per edge node; "
                               f"got {k} nodes and {len(self.memory_mb)} memories")
        if self.bandwidth_MBps.shape != (k, k) or self.latency_s.shape != (k, k):
            raise CaramelError(f"bandwidth_MBps and latency_s must be {k}x{k}")
        if min(self.node_gflops) <= 0 or (self.bandwidth_MBps[~np.eye(k, dtype=bool)] <= 0).any():
            raise CaramelError("node_gflops and bandwidth_MBps between distinct nodes must be positive")
        for i, t in enumerate(self.tasks):
            n = len(t.gflop)
            if n < 1 or not (len(t.weights_mb) == len(t.out_mb) == len(t.current) == n):
                raise CaramelError(f"task {i}: gflop, weights_mb, out_mb and current need one entry per layer")
            if not all(w >= 0 for w in t.weights_mb):  # NaN too: memory checks would differ by path
                raise CaramelError(f"task {i}: weights_mb must be numbers >= 0 (MB per layer), got {t.weights_mb}")
            if not 0 <= t.source < k - 1 or any(not 0 <= c < k for c in t.current):
                raise CaramelError(f"task {i}: source must be an edge node (0..{k - 2}), current any node (0..{k - 1})")

    @property
    def num_nodes(self) -> int:
        return len(self.node_gflops)

    @property
    def cloud(self) -> int:
        return self.num_nodes - 1

    def hop_s(self, mb: float, a: int, b: int) -> float:
        return 0.0 if a == b else float(self.latency_s[a, b] + mb / self.bandwidth_MBps[a, b])

    def layer_s(self, t: int, layer: int, node: int) -> float:
        """Processing plus migration of one layer on one node (no transfers)."""
        task = self.tasks[t]
        move = self.migration_weight * self.hop_s(task.weights_mb[layer], task.current[layer], node)
        return task.gflop[layer] / self.node_gflops[node] + move

    def step_s(self, t: int, layer: int, prev: int, node: int) -> float:
        """What placing layer `layer` on `node` after its predecessor on `prev` adds (the hop in,
        the layer, and, for the last layer, the result's hop back to the source)."""
        task = self.tasks[t]
        mb_in = task.in_mb if layer == 0 else task.out_mb[layer - 1]
        cost = self.hop_s(mb_in, prev, node) + self.layer_s(t, layer, node)
        if layer == len(task.gflop) - 1:
            cost += self.hop_s(task.out_mb[layer], node, task.source)
        return cost

    def cost_s(self, placement: list[list[int]]) -> float:
        """The objective of a full placement (one node list per task)."""
        total = 0.0
        for t, nodes in enumerate(placement):
            prev = self.tasks[t].source
            for layer, node in enumerate(nodes):
                total += self.step_s(t, layer, prev, node)
                prev = node
        return total

    def feasible(self, placement: list[list[int]]) -> bool:
        used = self.memory_used_mb(placement)
        return bool((used <= np.array(self.memory_mb) + 1e-9).all())

    def memory_used_mb(self, placement: list[list[int]]) -> np.ndarray:
        used = np.zeros(self.num_nodes - 1)
        for t, nodes in enumerate(placement):
            for layer, node in enumerate(nodes):
                if node != self.cloud:
                    used[node] += self.tasks[t].weights_mb[layer]
        return used

    def cost_to_go(self, t: int) -> np.ndarray:
        """(L, K): the least cost of layers l+1.. (and the result's return) when layer l is on
        node k, ignoring memory."""
        task = self.tasks[t]
        n, k = len(task.gflop), self.num_nodes
        h = np.zeros((n, k))
        for layer in range(n - 2, -1, -1):
            for a in range(k):
                h[layer, a] = min(self.step_s(t, layer + 1, a, b) + h[layer + 1, b] for b in range(k))
        return h
