"""How the ps simulator prices a hierarchical push: a reduce within each node, then each
leader's node sum sent straight to the server leader as soon as it lands (`hierarchy.py`,
`NodeSumSender`), not a collective among the leaders.

Three resources, each used one transfer at a time in the plan's push order:

- each node's reduce group (`Hierarchy.node_push`): bucket b's reduce starts once every rank of
  the node has handed b over and the node's previous reduce is done, and lasts latency +
  (local - 1) x bytes / node rate (the leader receives one copy per other rank of its node);
- each leader's sender thread: its node sum leaves once its node's reduce has landed and its
  previous send has completed (the thread waits for each send before the next), and, for a
  leader that serves a shard, once the pulls it handed over before have left (it sends on its
  own pull group, `Hierarchy.link_group`);
- each server leader's NIC: it receives one copy from every other leader. Its copies finish no
  earlier than the first sender's start plus (nodes - 1) copies at the link rate (the NIC
  carries them all), nor than the last sender's start plus one copy, nor than its previous
  bucket's; and the update also needs the server's own node's reduce.

A collective among the leaders (the model before, and the NCCL runtime's relay) starts only
once every node's reduce has landed, and each server's next bucket waits for both stages of the
previous one; here the node reduces run ahead on their own groups. Nothing is fitted: the
latency, the rates and the bytes are the cluster's and the plan's.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LeaderSends:
    """The state of the three resources above across the unrolled steps; `push` prices one bucket."""

    nodes: int
    local: int  # ranks per node
    serving: int  # shards: node s's leader serves shard s
    latency_s: float
    rate_Bps: float  # between nodes (the leaders' NICs)
    node_rate_Bps: float  # within a node
    node_end: list[float] = field(default_factory=list)  # per node: its last reduce landed
    send_free: list[float] = field(default_factory=list)  # per leader: its last send completed
    nic_end: list[float] = field(default_factory=list)  # per server leader: its last bucket's copies in

    def __post_init__(self):
        self.node_end = [0.0] * self.nodes
        self.send_free = [0.0] * self.nodes
        self.nic_end = [0.0] * self.nodes

    def node_reduce_s(self, nbytes: float) -> float:
        return 0.0 if self.local == 1 else self.latency_s + (self.local - 1) * nbytes / self.node_rate_Bps

    def push(self, nbytes: float, owner: int, handed: list[float], pulls_end: list[float]) -> tuple[float, float]:
        """Bucket of `nbytes` to shard `owner`'s server, handed over by rank w at `handed[w]`;
        `pulls_end[s]`: when server s's pulls handed over so far have left. Returns (the
        first node reduce's start, when the server has every node's sum)."""
        reduced = []
        for v in range(self.nodes):
            start = max([self.node_end[v]] + handed[v * self.local:(v + 1) * self.local])
            self.node_end[v] = start + self.node_reduce_s(nbytes)
            reduced.append((start, self.node_end[v]))
        senders = [v for v in range(self.nodes) if v != owner]
        starts = [max(reduced[v][1], self.send_free[v], pulls_end[v] if v < self.serving else 0.0) for v in senders]
        end = reduced[owner][1]
        if starts:
            copy_s = nbytes / self.rate_Bps
            end = max(end, max(self.nic_end[owner], min(starts)) + self.latency_s + len(starts) * copy_s,
                      max(starts) + self.latency_s + copy_s)
            for v in senders:
                self.send_free[v] = end
        self.nic_end[owner] = end
        return min(a for a, _ in reduced), end

    def bound_s(self, bucket_bytes: list[float], bucket_owner: list[int]) -> float:
        """The long-run floor of a step's pushes: every node reduces every bucket on one group,
        and each server's NIC takes (nodes - 1) copies of each of its buckets."""
        node_s = sum(self.node_reduce_s(b) for b in bucket_bytes)
        nic_s = [sum(self.latency_s + (self.nodes - 1) * b / self.rate_Bps
                     for b, o in zip(bucket_bytes, bucket_owner) if o == s) for s in range(self.serving)]
        return max([node_s] + nic_s) if self.nodes > 1 else node_s

    def copy(self) -> "LeaderSends":
        """A copy to price a step's pushes on (the step loop prices them twice where the
        backward they overlap is slowed; only the last pricing is kept)."""
        c = LeaderSends(self.nodes, self.local, self.serving, self.latency_s, self.rate_Bps, self.node_rate_Bps)
        c.node_end, c.send_free, c.nic_end = list(self.node_end), list(self.send_free), list(self.nic_end)
        return c
