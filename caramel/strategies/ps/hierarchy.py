"""Hierarchical aggregation (Parameter Hub): one gradient per node to the servers, one pull per node.

With `hierarchical=True` the ranks form nodes of `LOCAL_WORLD_SIZE` consecutive ranks (as
torchrun numbers them); rank 0 of each node is its leader, and the servers are leaders (shard
s on node s). A push is a reduce within the node to the leader, then the leader *sends* the
node sum straight to the server leader, which adds the other leaders' sums to its own node's
(point-to-point, as a colocated server adds the workers' pushes). The send goes out as soon
as the node's reduce has landed: a thread per leader (`NodeSumSender`) waits for each reduce
in push order and hands its send over, so it neither waits for the leader's next backward
hook or `step()` nor for the server's own node (a reduce among the leaders would start only
once every leader had its node sum, and gloo's reduce also sends half of each bucket back out
of the server; docs/ps.md, "The leaders' node sums leave as they land"). The server posts
its receives at its step's first gradient; a serving leader sends on its own pull group
(`Hierarchy.link_group`). Off gloo (NCCL) the leaders keep a reduce among them, issued as each
node sum lands at a hook or at `step()`: NCCL sets up each pair's point-to-point link lazily and
blocking, and two server leaders each receiving from the other at the first hook would wait for
each other (`NodeSums.sends_point_to_point`; not run on a GPU here). A pull is a broadcast among
the leaders from the server, then, once that has landed, a broadcast within the node from the
leader (the leader *relays* it). The leader relays in the plan's pull order, so every node
group sees the same sequence on each of its ranks; its own forward relays what it needs, and
`step()` relays the rest before it waits for its node's gradients (the node's ranks may be
waiting for those pulls). On gloo the pulls and relays go one at a time through an ordered
sender per link (`sender.py`: the server leader's to the leaders, each leader's relays to its
node), so each link's wire order is the plan's. Only (nodes - 1) copies of a shard cross a
server's NIC instead of (ranks - 1).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.strategies.ps.sender import SentPull, SerialSender, uses_sender


@dataclass
class Hierarchy:
    local_size: int
    leader: int  # group rank of this rank's node leader
    node_push: Any  # this node's groups
    node_pull: Any
    lead_push: list[Any]  # per shard, over the leaders (not a group of this rank unless it leads)
    lead_pull: list[Any]
    nodes: int  # required: the server leader posts a receive from every other node's leader

    @property
    def is_leader(self) -> bool:
        return self.leader == self._rank

    def server(self, shard: int) -> int:
        """The group rank serving `shard`: the leader of node `shard`."""
        return shard * self.local_size

    def leaders(self) -> list[int]:
        """The group ranks of the nodes' leaders, in node order."""
        return [node * self.local_size for node in range(self.nodes)]

    def link_group(self, leader: int, shard: int) -> Any:
        """The group carrying leader `leader`'s node sums to `shard`'s server: the sending
        leader's own pull group when it serves a shard, so on its link to that server its pulls
        queue behind its pushes instead of sharing the link with them (one gloo group is one
        TCP connection per pair, as `PsEngine.link_group` for colocated servers), else the
        shard's push group."""
        node = leader // self.local_size
        return self.lead_pull[node] if node < len(self.lead_pull) else self.lead_push[shard]

    def groups(self) -> list[Any]:
        mine = [self.node_push, self.node_pull]
        return mine + (list(self.lead_push) + list(self.lead_pull) if self.is_leader else [])

    _rank: int = 0


def local_world_size(world: int) -> int:
    """LOCAL_WORLD_SIZE (torchrun sets it): how many consecutive ranks share a node."""
    raw = os.environ.get("LOCAL_WORLD_SIZE")
    if raw is None:
        raise CaramelError("ps: hierarchical=true needs LOCAL_WORLD_SIZE (the ranks per node; torchrun sets it)")
    try:
        local = int(raw)
    except ValueError:
        raise CaramelError(f"ps: LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}") from None
    if local < 1 or world % local:
        raise CaramelError(f"ps: hierarchical=true needs the {world} ranks to form whole nodes of "
                           f"LOCAL_WORLD_SIZE={local} ranks each")
    return local


def make_hierarchy(ranks: list[int], rank: int, local: int, shards: int, timeout: datetime.timedelta) -> Hierarchy:
    """The node and leader groups (every rank creates every group, in the same order)."""
    nodes = len(ranks) // local
    node_groups = []
    for node in range(nodes):
        members = ranks[node * local:(node + 1) * local]
        node_groups.append((dist.new_group(members, timeout=timeout), dist.new_group(members, timeout=timeout)))
    leaders = [ranks[node * local] for node in range(nodes)]
    lead_push = [dist.new_group(leaders, timeout=timeout) for _ in range(shards)]
    lead_pull = [dist.new_group(leaders, timeout=timeout) for _ in range(shards)]
    mine = rank // local
    h = Hierarchy(local, mine * local, *node_groups[mine], lead_push, lead_pull, nodes=nodes)
    h._rank = rank
    return h


class NodeSumSender(SerialSender):
    """A leader's node sums on their way to the server leaders: each waits in a thread for its
    node's reduce to land and is then sent, one at a time in push order (each send complete
    before the next is handed over, so the wire order is the push order). Gloo only, like the
    pull senders (`NodeSums.sends_point_to_point`). A server leader's sends share its pull group
    with its pull sender's broadcasts (`Hierarchy.link_group`): two threads on one gloo
    group, safe by gloo's internals as for a colocated server's pushes (`sender.py`)."""

    def forward(self, node_reduce: Any, flat: Any, server: int, group: Any, tag: int, what: str) -> SentPull:
        """Send `flat` to global rank `server` on `group` once `node_reduce` has completed."""
        return self.submit(flat, server, group, tag, what, after=node_reduce)

    def _send(self, item: SentPull) -> None:
        item.after.wait()
        dist.isend(item.buf, item.src, group=item.group, tag=item.tag).wait()


class NodeSums:
    """A hierarchical rank's pushes past its node's reduce, for its engine (`PsEngine`): a
    worker only waits for the reduce; a leader sends its node sum to the server leader (gloo:
    `NodeSumSender`), or, off gloo, reduces it among the leaders once it has landed; a server
    leader receives the other leaders' sums and adds them to its own in `_apply`."""

    def __init__(self, engine: Any):
        self.ps = engine
        self.sent = self.sends_point_to_point(engine.hier)
        serves_all = all(engine.server_of(i) == engine.rank for i in engine.plan.params)
        # the thread that sends each node sum once its reduce has landed, where some go elsewhere
        self.sender = NodeSumSender() if self.sent and not serves_all else None

    @staticmethod
    def sends_point_to_point(h: Hierarchy) -> bool:
        """At a leader: whether the leaders' node sums travel point-to-point to the server leader
        (on gloo) or by a reduce among the leaders (off gloo: NCCL). The same answer on every
        leader, since every rank makes the same groups. Not on NCCL because it would deadlock
        there: NCCL creates each pair's point-to-point communicator lazily and blocking, so two
        server leaders, each posting a receive from the other at its first hook (`expect`), wait
        for each other's send side, which neither reaches before its step returns. The reduce,
        reached by every leader in the same order, was the path before the sends and has no
        such cycle (not run on a GPU here)."""
        return h.is_leader and uses_sender(h.lead_push)

    def expect(self, u: Any) -> None:
        """At a server leader, at its step's first gradient: post a receive for every other leader's
        node sum of each bucket it serves, so a sum can travel as soon as its sender has it
        (gloo moves a point-to-point message once both ends have posted it)."""
        ps, h = self.ps, self.ps.hier
        for b, members in enumerate(ps.plan.buckets):
            i = members[0]
            if ps.server_of(i) != ps.rank:
                continue
            parts = []
            for leader in h.leaders():
                if leader != ps.rank:
                    parts.append(ps._recv_buf(members))
                    u.works.append(dist.irecv(parts[-1], ps.ranks[leader], group=h.link_group(leader, ps.plan.owner[i]),
                                              tag=b))
            u.incoming[b] = parts

    def push(self, u: Any, b: int, flat: Any, node_reduce: Any, server: int) -> None:
        """Bucket `b`'s push once `node_reduce` (its reduce within the node into `flat`) is issued."""
        ps, h = self.ps, self.ps.hier
        if not h.is_leader or (server == ps.rank and self.sent):
            u.works.append(node_reduce)
            if h.is_leader:  # the server adds the other nodes' sums in `_apply`
                u.sums.append((b, flat, u.incoming.pop(b)))
        elif self.sender is not None:
            item = self.sender.forward(node_reduce, flat, ps.ranks[server],
                                       h.link_group(ps.rank, ps.plan.owner[ps.plan.buckets[b][0]]), b,
                                       f"node sum of bucket {b} to its server")
            u.works.append(item)
            u.forwards.append((b, item))
        else:  # a reduce among the leaders, the server's own node sum included (`sends_point_to_point`)
            u.works.append(node_reduce)
            u.relay.append((b, node_reduce))

    def forward(self, u: Any, force: bool) -> None:
        """At a leader off gloo (NCCL): reduce each node sum that has landed to its server, in
        push order (so every leader reaches each group's reduces in the same order), at each
        hook and, with `force`, at `step()`."""
        ps = self.ps
        while u.relay:
            b, work = u.relay[0]
            if not force and not work.is_completed():
                return
            work.wait()
            u.relay.popleft()
            i = ps.plan.buckets[b][0]
            u.works.append(dist.reduce(u.flats[b], dst=ps.ranks[ps.server_of(i)],
                                       group=ps.hier.lead_push[ps.plan.owner[i]], async_op=True))

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
