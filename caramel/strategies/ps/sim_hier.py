"""How the ps simulator prices a hierarchical push on gloo: a reduce within each node, then each
leader's node sum sent straight to the server leader as soon as it lands (`hierarchy.py`,
`NodeSumSender`), not a collective among the leaders (off gloo the runtime keeps that
collective, and so does the simulator: `simulate.py`).

Three resources, each used one transfer at a time in the plan's push order:

- each node's reduce group (`Hierarchy.node_push`): bucket b's reduce starts once every rank of
  the node has handed b over and the node's previous reduce is done, and lasts latency +
  (local - 1) x bytes / node rate (the leader receives one copy per other rank of its node);
- each leader's sender thread: its node sum leaves once its node's reduce has landed, its
  previous send has completed, the server leader has posted its receives (at its step's first
  hand-over, `NodeSums.expect`: gloo moves a message once both ends have posted it) and, for a
  leader that serves a shard, once the pulls it handed over before have left (it sends on its
  own pull group, `Hierarchy.link_group`). The thread waits for its own `isend` only, and a
  gloo send is complete once the kernel holds the bytes: a bucket is taken to fit the
  kernel's send buffer, so the next send leaves once the leader's NIC has had one copy's
  time (bytes / link rate) for this one, not when the server has every copy (a leader's NIC
  carries its copies to different servers at its full rate in all: an optimistic fluid
  approximation where a slow server holds a copy's bytes in the sender's buffer);
- each server leader's NIC: it receives one copy from every other leader, a bucket's copies
  after its previous bucket's, shared evenly among the copies in flight (each a copy's bytes
  at the link rate when alone), one latency after the bytes; the update also needs the
  server's own node's reduce, which holds no sender.

A collective among the leaders starts only once every node's reduce has landed, and each
server's next bucket waits for both stages of the previous one; here the node reduces run
ahead on their own groups and each leader's next send follows its own last copy. Nothing is
fitted: the latency, the rates and the bytes are the cluster's and the plan's.
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

    def push(self, nbytes: float, owner: int, handed: list[float], pulls_end: list[float],
             posted_s: float = 0.0) -> tuple[float, float]:
        """Bucket of `nbytes` to shard `owner`'s server, handed over by rank w at `handed[w]`;
        `pulls_end[s]`: when server s's pulls handed over so far have left; `posted_s`: when the
        server leader posted this step's receives. Returns (the first node reduce's start, when
        the server has every node's sum)."""
        reduced = []
        for v in range(self.nodes):
            start = max([self.node_end[v]] + handed[v * self.local:(v + 1) * self.local])
            self.node_end[v] = start + self.node_reduce_s(nbytes)
            reduced.append((start, self.node_end[v]))
        senders = [v for v in range(self.nodes) if v != owner]
        # a copy's bytes enter the server's NIC once its sender may send and the previous bucket's are in
        enter = {v: max(reduced[v][1], self.send_free[v], posted_s, self.nic_end[owner],
                        pulls_end[v] if v < self.serving else 0.0) for v in senders}
        copy_s = nbytes / self.rate_Bps
        done = shared_finish(enter, copy_s)
        end = reduced[owner][1]
        for v in senders:
            # the kernel takes the copy at once; the leader's NIC puts its bytes out in one copy's time
            self.send_free[v] = enter[v] + copy_s
        if senders:
            self.nic_end[owner] = max(done.values()) + self.latency_s
            end = max(end, self.nic_end[owner])
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


def shared_finish(enter: dict[int, float], copy_s: float) -> dict[int, float]:
    """When each copy's bytes are in, copies entering one NIC at `enter[v]`, each `copy_s` long
    alone, the NIC shared evenly among those in flight (processor sharing)."""
    left = {v: copy_s for v in enter}
    done: dict[int, float] = {}
    t = min(enter.values(), default=0.0)
    while left:
        active = [v for v in left if enter[v] <= t]
        if not active:
            t = min(enter[v] for v in left)
            continue
        arrivals = [enter[v] for v in left if enter[v] > t]
        step = min(left[v] for v in active) * len(active)
        if arrivals and min(arrivals) - t < step:
            step = min(arrivals) - t
        for v in active:
            left[v] -= step / len(active)
        t += step
        for v in active:
            if left[v] <= 1e-12 * max(copy_s, 1.0):
                done[v] = t
                del left[v]
    return done
