"""Collective cost models, each twice: as message-level steps and as a closed form.

Notation: n workers, S bytes to reduce per worker, alpha the per-message latency (one per
step), B the link bandwidth. Closed forms (switch topology, full-duplex NICs, no reduction cost):

- ring: 2(n-1) steps of S/n bytes to the next worker: 2(n-1)a + 2(n-1)/n * S/B
- tree (binomial reduce, then broadcast): 2*ceil(log2 n) steps of S bytes: 2*ceil(log2 n)(a + S/B)
- halving_doubling (Rabenseifner), p = 2^floor(log2 n): 2*log2(p)*a + 2(p-1)/p * S/B, plus,
  when n is not a power of two, a fold step before and an unfold step after: 2(a + S/B)
- ps (k servers, extra nodes on the switch): push S/k to each server, pull it back:
  2(a + max(S/B, n*S/(k*B)))
- gossip (send the whole S to each topology neighbour, d of them): a + d*S/B through one NIC
  (switch), a + S/B with a link per neighbour (ring, torus, fully_connected).

A message-level model yields *phases*: sets of flows that start together once the previous
phase is done; a phase costs alpha plus the time its flows take under max-min fair sharing
(`network.simulate_flows`). Identical phases are yielded once with a repeat count, so a ring
over 1024 workers is one phase simulated once. The two agree exactly where the closed form's
assumptions hold (tests check it); elsewhere (tree on a ring topology, uneven servers) the
message-level model is the one to trust.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator

from caramel.topology.spec import ClusterSpec
from caramel.plan.costs import fixed_cost_s
from caramel.sim.network import Flow, Network, simulate_flows

Phase = tuple[list[Flow], int]  # flows that start together, and how many identical times in a row


@dataclass(frozen=True)
class CollectiveModel:
    """One algorithm: its message-level phases and its closed form."""

    name: str
    phases: Callable[[Network, int, float, int], Iterator[Phase]]  # (network, n, S, servers)
    closed_form_s: Callable[[int, float, float, float, int, str], float]  # (n, S, alpha, B, servers, topology)


COLLECTIVE_MODELS: dict[str, CollectiveModel] = {}


def _register(name: str, phases, closed):
    assert name not in COLLECTIVE_MODELS
    COLLECTIVE_MODELS[name] = CollectiveModel(name, phases, closed)


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length()


# ---- ring -------------------------------------------------------------------------------

def _ring_phases(net: Network, n: int, S: float, servers: int) -> Iterator[Phase]:
    yield [Flow(i, (i + 1) % n, S / n) for i in range(n)], 2 * (n - 1)


def _ring_closed(n, S, a, B, servers, topology) -> float:
    return 2 * (n - 1) * a + 2 * (n - 1) / n * S * 8 / B


# ---- binomial tree: reduce to worker 0, then broadcast ----------------------------------

def _tree_phases(net: Network, n: int, S: float, servers: int) -> Iterator[Phase]:
    rounds = _log2_ceil(n)
    reduce = []
    for j in range(rounds):
        step = 1 << j
        reduce.append([Flow(i, i - step, S) for i in range(n) if i % (2 * step) == step])
    for flows in reduce:
        yield flows, 1
    for flows in reversed(reduce):
        yield [Flow(f.dst, f.src, f.bytes) for f in flows], 1


def _tree_closed(n, S, a, B, servers, topology) -> float:
    return 2 * _log2_ceil(n) * (a + S * 8 / B)


# ---- recursive halving-doubling (Rabenseifner) ------------------------------------------

def _hd_phases(net: Network, n: int, S: float, servers: int) -> Iterator[Phase]:
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    if extra:  # fold: workers p.. hand their whole vector to a partner among the first p
        yield [Flow(p + i, i, S) for i in range(extra)], 1
    k = p.bit_length() - 1
    halves = []
    for j in range(k):
        dist = p >> (j + 1)
        halves.append([Flow(i, i ^ dist, S / (2 ** (j + 1))) for i in range(p)])
    for flows in halves:  # reduce-scatter: exchange halves, quarters, ...
        yield flows, 1
    for flows in reversed(halves):  # all-gather: the same exchanges in reverse
        yield flows, 1
    if extra:
        yield [Flow(i, p + i, S) for i in range(extra)], 1


def _hd_closed(n, S, a, B, servers, topology) -> float:
    p = 1 << (n.bit_length() - 1)
    k = p.bit_length() - 1
    t = 2 * k * a + 2 * (p - 1) / p * S * 8 / B
    if n != p:
        t += 2 * (a + S * 8 / B)
    return t


# ---- parameter server: k servers (extra nodes), push shards, pull them back -------------

def _ps_phases(net: Network, n: int, S: float, servers: int) -> Iterator[Phase]:
    shard = S / servers
    yield [Flow(w, n + s, shard) for w in range(n) for s in range(servers)], 1
    yield [Flow(n + s, w, shard) for w in range(n) for s in range(servers)], 1


def _ps_closed(n, S, a, B, servers, topology) -> float:
    return 2 * (a + max(S * 8 / B, n * S * 8 / (servers * B)))


# ---- gossip: every worker sends its whole vector to each neighbour ----------------------

def _gossip_phases(net: Network, n: int, S: float, servers: int) -> Iterator[Phase]:
    yield [Flow(i, j, S) for i in range(n) for j in net.neighbours(i)], 1


def _gossip_closed(n, S, a, B, servers, topology) -> float:
    degree = len(Network(n, B, topology).neighbours(0))
    links_per_neighbour = topology != "switch"
    return a + (1 if links_per_neighbour else degree) * S * 8 / B


_register("ring", _ring_phases, _ring_closed)
_register("tree", _tree_phases, _tree_closed)
_register("halving_doubling", _hd_phases, _hd_closed)
_register("ps", _ps_phases, _ps_closed)
_register("gossip", _gossip_phases, _gossip_closed)


def _model(cluster: ClusterSpec) -> CollectiveModel:
    assert cluster.collective in COLLECTIVE_MODELS, cluster.collective  # ClusterSpec.validate names it for users
    return COLLECTIVE_MODELS[cluster.collective]


def _network(cluster: ClusterSpec) -> Network:
    extra = cluster.num_servers if cluster.collective == "ps" else 0
    return Network(cluster.world_size, cluster.bandwidth_bps, cluster.topology, extra_nodes=extra)


def closed_form_s(cluster: ClusterSpec, nbytes: float) -> float:
    """Closed-form time of one collective over `nbytes` per worker (0 with one worker)."""
    n = cluster.world_size
    if n <= 1:
        return 0.0
    return _model(cluster).closed_form_s(n, float(nbytes), cluster.latency_s, cluster.bandwidth_bps,
                                         cluster.num_servers, cluster.topology)


def message_level_s(cluster: ClusterSpec, nbytes: float) -> float:
    """Time of one collective by simulating its message steps on the cluster's network."""
    n = cluster.world_size
    if n <= 1:
        return 0.0
    net = _network(cluster)
    total = 0.0
    for flows, repeat in _model(cluster).phases(net, n, float(nbytes), cluster.num_servers):
        span = max(simulate_flows(flows, net), default=0.0)
        total += repeat * (cluster.latency_s + span)
    return total


def message_counts(cluster: ClusterSpec) -> tuple[int, float]:
    """(steps per collective, bytes each worker sends per byte reduced), from the message model."""
    n = cluster.world_size
    if n <= 1:
        return 0, 0.0
    net = _network(cluster)
    steps, sent = 0, 0.0
    for flows, repeat in _model(cluster).phases(net, n, 1.0, cluster.num_servers):
        steps += repeat
        sent += repeat * sum(f.bytes for f in flows if f.src < n)
    return steps, sent / n


class CommModel:
    """Collective time as a function of bytes, for the engine: `latency_s + nbytes * per_byte_s`
    on an idle link. A collective that starts while the link is still busy with the previous one
    spends its fixed cost while that one's bytes drain: it pays `latency_s` less the previous
    transfer's time, but at least `queued_latency_s` (`ClusterSpec.queued_latency_s`); behind a
    tiny collective it pays nearly the whole latency, behind a large one only the queued part.

    Every flow of every model scales with S and routes do not depend on S, so under the fluid
    model a collective's time is exactly affine in S. We therefore run the message-level model
    once (at a reference size) and scale, which keeps a 1024-worker simulation fast.
    `mode="closed"` uses the closed forms instead.
    """

    REFERENCE_BYTES = float(1 << 20)

    def __init__(self, cluster: ClusterSpec, mode: str = "message"):
        if mode not in ("message", "closed"):
            raise ValueError(f"comm model mode must be 'message' or 'closed', got {mode!r}")
        cluster.validate()
        self.cluster = cluster
        self.mode = mode
        fn = message_level_s if mode == "message" else closed_form_s
        self.latency_s = fn(cluster, 0.0)
        full = fn(cluster, self.REFERENCE_BYTES)
        self.per_byte_s = max(full - self.latency_s, 0.0) / self.REFERENCE_BYTES
        self.steps, self.sent_per_byte = message_counts(cluster)
        # the same messages, each paying the queued latency (zero bytes: the fixed part only)
        queued = cluster.effective_queued_latency_s
        self.queued_latency_s = (self.latency_s if queued == cluster.latency_s
                                 else fn(dataclasses.replace(cluster, latency_s=queued), 0.0))

    def time_s(self, nbytes: float, after_transfer_s: float | None = None) -> float:
        """Duration of one collective over `nbytes` per worker: on an idle link, or, with
        `after_transfer_s`, queued behind a collective whose bandwidth part took that long."""
        if self.cluster.world_size <= 1:
            return 0.0
        return self.fixed_s(after_transfer_s) + nbytes * self.per_byte_s

    def fixed_s(self, after_transfer_s: float | None = None) -> float:
        """The latency part of one collective (see the class docstring)."""
        return fixed_cost_s(self.latency_s, self.queued_latency_s, after_transfer_s)

    def transfer_s(self, nbytes: float) -> float:
        """The bandwidth part only (no latency): what perfect batching could reach."""
        return nbytes * self.per_byte_s

    def describe(self) -> dict:
        return {"collective": self.cluster.collective, "topology": self.cluster.topology, "mode": self.mode,
                "latency_s": self.latency_s, "queued_latency_s": self.queued_latency_s,
                "per_byte_s": self.per_byte_s, "steps": self.steps}
