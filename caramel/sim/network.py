"""The network model: nodes, links, routes, and max-min fair sharing of link bandwidth.

A flow moves `bytes` from one node to another along a route of *resources* (a NIC's send side,
a NIC's receive side, or a directed link), each with a capacity in bits per second. Concurrent
flows share each resource max-min fairly (progressive filling), and rates are recomputed
whenever a flow starts or ends: the fluid model that Proteus and ASTRA-sim's congestion-aware
backend use; packet-level detail buys little at the sizes we care about.

Topologies (ClusterSpec.topology):
- `switch`: every node has a full-duplex NIC to one non-blocking switch; a flow uses the
  sender's `tx` and the receiver's `rx`.
- `fully_connected`: a dedicated directed link per ordered pair of nodes.
- `ring`: directed links between ring neighbours; a flow takes the shorter direction
  (clockwise on ties), hop by hop.
- `torus`: a 2-D torus (the squarest factorization of the node count), dimension-order routing,
  shorter direction per dimension.
Extra nodes (parameter servers) always hang off the switch: they have NICs, not torus links.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

Resource = Hashable


@dataclass(frozen=True)
class Flow:
    """`bytes` from node `src` to node `dst`, entering the network at `start_s`."""

    src: int
    dst: int
    bytes: float
    start_s: float = 0.0


class Network:
    """Routes and capacities for `num_nodes` nodes (workers first, then `extra_nodes` servers)."""

    def __init__(self, num_workers: int, bandwidth_bps: float, topology: str = "switch", extra_nodes: int = 0):
        assert num_workers >= 1 and bandwidth_bps > 0 and extra_nodes >= 0
        self.num_workers = num_workers
        self.num_nodes = num_workers + extra_nodes
        self.bandwidth_bps = float(bandwidth_bps)
        self.topology = topology
        if topology == "torus":
            self.torus_dims = torus_dims(num_workers)
        elif topology not in ("switch", "fully_connected", "ring"):
            raise AssertionError(f"unknown topology {topology}")  # ClusterSpec.validate names it for users

    def capacity_bps(self, resource: Resource) -> float:
        """Every NIC side and every directed link runs at the cluster's bandwidth."""
        return self.bandwidth_bps

    def route(self, src: int, dst: int) -> tuple[Resource, ...]:
        """The resources a flow from `src` to `dst` occupies."""
        assert src != dst, "a node does not send to itself over the network"
        if src >= self.num_workers or dst >= self.num_workers or self.topology == "switch":
            return (("tx", src), ("rx", dst))
        if self.topology == "fully_connected":
            return (("link", src, dst),)
        if self.topology == "ring":
            return tuple(self._ring_hops(src, dst, self.num_workers, lambda i: i))
        rows, cols = self.torus_dims
        hops: list[Resource] = []
        (r0, c0), (r1, c1) = divmod(src, cols), divmod(dst, cols)
        # dimension order: first along the row index, then along the column index
        hops += self._ring_hops(r0, r1, rows, lambda r: r * cols + c0)
        hops += self._ring_hops(c0, c1, cols, lambda c: r1 * cols + c)
        return tuple(hops)

    @staticmethod
    def _ring_hops(a: int, b: int, n: int, node) -> list[Resource]:
        if a == b:
            return []
        forward = (b - a) % n
        step = 1 if forward <= n - forward else -1
        hops, i = [], a
        while i != b:
            j = (i + step) % n
            hops.append(("link", node(i), node(j)))
            i = j
        return hops

    def neighbours(self, node: int) -> list[int]:
        """Gossip neighbours of a worker: topology neighbours; on a switch, ring neighbours."""
        n = self.num_workers
        if n == 1:
            return []
        if self.topology == "fully_connected":
            return [j for j in range(n) if j != node]
        if self.topology in ("switch", "ring"):
            return sorted({(node + 1) % n, (node - 1) % n} - {node})
        rows, cols = self.torus_dims
        r, c = divmod(node, cols)
        cand = {((r + 1) % rows) * cols + c, ((r - 1) % rows) * cols + c,
                r * cols + (c + 1) % cols, r * cols + (c - 1) % cols}
        return sorted(cand - {node})


def torus_dims(n: int) -> tuple[int, int]:
    """The squarest rows x cols = n, rows <= cols (a prime n gives a 1 x n ring)."""
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def max_min_rates(routes: Sequence[Sequence[Resource]], capacity_bps) -> list[float]:
    """Max-min fair rates (bits/s) for flows with the given routes, by progressive filling.

    `capacity_bps(resource)` gives each resource's capacity. A flow with an empty route
    (sender and receiver on the same node) is not limited by the network: rate inf.
    """
    rates = [math.inf] * len(routes)
    users: dict[Resource, list[int]] = {}
    for f, route in enumerate(routes):
        for r in route:
            users.setdefault(r, []).append(f)
    remaining = {r: float(capacity_bps(r)) for r in users}
    unfixed = {r: len(fs) for r, fs in users.items()}
    fixed = [not route for route in routes]
    while unfixed:
        share = min(remaining[r] / unfixed[r] for r in unfixed)
        # every resource at the bottleneck share saturates now; fix all flows through them
        tol = share * 1e-12
        saturated = [r for r in unfixed if remaining[r] / unfixed[r] <= share + tol]
        for r in saturated:
            for f in users[r]:
                if fixed[f]:
                    continue
                fixed[f] = True
                rates[f] = share
                for q in routes[f]:
                    remaining[q] -= share
                    unfixed[q] -= 1
        unfixed = {r: k for r, k in unfixed.items() if k > 0}
    return rates


def simulate_flows(flows: Sequence[Flow], network: Network) -> list[float]:
    """Finish time (seconds) of each flow under max-min fair sharing, rates recomputed at every
    arrival and departure. Zero-byte flows finish when they start."""
    finish = [0.0] * len(flows)
    pending = sorted(range(len(flows)), key=lambda i: (flows[i].start_s, i))
    remaining_bits = [f.bytes * 8.0 for f in flows]
    routes = [network.route(f.src, f.dst) if f.src != f.dst else () for f in flows]
    active: list[int] = []
    t = flows[pending[0]].start_s if pending else 0.0
    k = 0
    while k < len(pending) or active:
        while k < len(pending) and flows[pending[k]].start_s <= t:
            i = pending[k]
            k += 1
            if remaining_bits[i] <= 0 or not routes[i]:
                finish[i] = max(t, flows[i].start_s)
            else:
                active.append(i)
        if not active:
            if k >= len(pending):
                break
            t = flows[pending[k]].start_s
            continue
        rates = max_min_rates([routes[i] for i in active], network.capacity_bps)
        dt = min(remaining_bits[i] / r for i, r in zip(active, rates))
        next_arrival = flows[pending[k]].start_s if k < len(pending) else math.inf
        step = min(dt, next_arrival - t)
        still = []
        for i, r in zip(active, rates):
            remaining_bits[i] -= r * step
            # a flow within rounding of done is done: avoids a zero-length extra event
            if remaining_bits[i] <= 1e-9 * max(flows[i].bytes * 8.0, 1.0):
                finish[i] = t + step
            else:
                still.append(i)
        active = still
        t += step
    return finish
