"""The colocated servers' pulls as fluid flows: each pull's rate follows how many broadcasts run.

A pull from server o is a broadcast of one bucket to every other rank; the model charges it
(n - 1) copies through o's NIC. The traffic probe times k servers broadcasting at once (k =
1..n; `caramel.bench.traffic_probe`, `broadcasts_at_once_s`): while k pulls' bytes flow, each
runs at `curve[k - 1]` of the link rate (k = n is the probe's all-at-once broadcasts behind
`pull_efficiency`). gloo's broadcast relays through its receivers, so a pull with few others
in flight can beat the root's n - 1 copies: a point may exceed 1, up to what the links allow
(`pull_curve_caps`). The same fluid schedule as the pushes (`sim_flows.fluid_pushes`): each
pull starts at its earliest (its update applied everywhere, its server's pushes out, the
receivers' "ready" notes through the queues) or when its server's previous pull has landed,
latency first, then its bytes flow at the share of the pulls then on the wire. Nothing is
fitted: every point is a probe reading.
"""
from __future__ import annotations

from caramel.strategies.ps.queues import Backlog, Queues
from caramel.strategies.ps.sim_flows import Push, Settled, check_curve, settle_pushes


def pull_curve_caps(world: int) -> list[float]:
    """The most each point of a pull curve may be (the share is the root's world - 1 copies' time
    over the reading): while k < world ranks broadcast, a rank that sends none receives a copy of
    each, k copies through its ingress, so the reading is at least k copies' time (at most
    (world - 1) / k); with every rank broadcasting, each receives world - 1 copies (at most 1).
    The egress bound (k (world - 1) copies leaving by world NICs, world / k) is always looser."""
    return [(world - 1.0) / k if k < world else 1.0 for k in range(1, world + 1)]


def check_pull_curve(curve: object, world: int) -> list[float]:
    """`meta.pull_efficiency_by_count`: `world` shares of the rate, for 1..world pulls at once,
    each in (0, its cap]; one clear error otherwise."""
    return check_curve(curve, world, "pull_efficiency_by_count", pull_curve_caps(world),
                       "the share of the link rate each server's world - 1 copies go at while 1..{world} "
                       "broadcasts run at once")


def fluid_pulls(order: list[int], owner: list[int], nic_bytes: list[float], earliest_s: list[float],
                applied_s: list[float], queues: Queues | None, latency_s: float, rate_Bps: float,
                curve: list[float], server_free_s: dict[int, float]) -> Settled:
    """One update's pulls, in the order handed over (`order`: pull buckets; `owner`, `nic_bytes`:
    per bucket; `earliest_s`: per pull in `order`, by the apply and the links): their spans, in
    `order`. With `queues`, each receiver's "ready" note (sent at `applied_s[w]`) waits behind
    its own egress, this update's pulls included (their spans from the previous round, until two
    rounds agree: `settle_pushes`), and the server's ingress."""
    def pulls_for(spans: list[tuple[float, float]] | None) -> list[Push]:
        now = [Backlog(queues.egress[0].cap_s) for _ in applied_s] if queues is not None else []
        todo = []
        for j, b in enumerate(order):
            o, start = owner[b], earliest_s[j]
            if queues is not None:
                # this update's earlier pulls in their own backlog, the longer wait of the two taken
                # (as the pushes do): merged into the queue, a pull touching an older run would add
                # to it; kept apart, the spans of the previous round never enter the shared queues
                start = max([start] + [a + max(queues.egress[w].wait(a), now[w].wait(a)) + queues.ingress[o].wait(a)
                                       for w, a in enumerate(applied_s) if w != o])
                if spans is not None:
                    now[o].add(*spans[j])
            todo.append(Push(o, start, latency_s, nic_bytes[b]))
        return todo

    return settle_pushes(pulls_for, rate_Bps, curve, server_free_s, queues is not None)
