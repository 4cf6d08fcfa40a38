"""The colocated servers' pushes as fluid flows: each push's rate changes as others start and end.

A push to server o is every other rank sending o a bucket: o's NIC receives (n - 1) copies.
The traffic probe times k servers receiving at once (k = 1..n; `caramel.bench.traffic_probe`,
`pushes_at_once_s`): while k pushes are on the wire, each server's NIC receives at
`efficiency[k - 1]` of the link rate (k = n is the probe's all-to-all, `push_efficiency`). A
bsp step hands its pushes over staggered, so the first runs alone at about the full rate and
the last ones too once the others have landed; charging every push the all-at-once rate
overstates the push phase (docs/ps.md, "The bsp errors, term by term").

Each push starts at its earliest (the hand-overs, the links, the queues: the caller's) or when
its server's previous push has landed, whichever is later; it pays the latency first, then its
bytes flow. Between two events (a flow starting or ending) the rates are constant, so each
flow's end is exact for the piecewise-constant rates. Nothing is fitted: every point of the
curve is a probe reading.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

FLUID_ROUNDS = 8  # the most rounds `settle_pushes` runs until two agree


@dataclass(frozen=True)
class Push:
    """One push: its server, the earliest it may start (s), its latency (s) and the bytes its
    server's NIC receives (every other rank's copy)."""

    server: int
    earliest_s: float
    latency_s: float
    nic_bytes: float


def check_curve(curve: object, world: int, key: str = "push_efficiency_by_count", most: list[float] | None = None,
                what: str = "the share of the link rate each server's NIC receives at while 1..{world} pushes run "
                            "at once") -> list[float]:
    """`meta.<key>` (default `push_efficiency_by_count`): `world` shares of the rate, for 1..world
    transfers at once, each in (0, `most[k - 1]`] (default 1); one clear error otherwise."""
    most = [1.0] * world if most is None else most
    ok = (isinstance(curve, (list, tuple)) and len(curve) == world
          and all(not isinstance(e, bool) and isinstance(e, (int, float)) and 0 < e <= m for e, m in zip(curve, most)))
    if not ok:
        bounds = "(0, 1]" if all(m == 1.0 for m in most) else "(0, cap] (caps " + ", ".join(f"{m:g}" for m in most) + ")"
        raise ValueError(f"ps: meta.{key} must be {world} numbers in {bounds} ({what.format(world=world)}), "
                         f"got {curve!r}")
    return [float(e) for e in curve]


def fluid_pushes(pushes: list[Push], rate_Bps: float, curve: list[float],
                 server_free_s: dict[int, float] | None = None) -> list[tuple[float, float]]:
    """(start, end) of each push, in the order given (each server's pushes go in that order).
    `curve[k - 1]`: the share of `rate_Bps` each server's NIC receives at while k pushes' bytes
    flow; `server_free_s`: when each server's earlier pushes landed (default: never busy)."""
    free = dict(server_free_s or {})
    queue: dict[int, list[int]] = {}
    for i, p in enumerate(pushes):
        queue.setdefault(p.server, []).append(i)
    spans: list[list[float]] = [[math.nan, math.nan] for _ in pushes]
    begins: list[tuple[float, int]] = []  # (when its bytes start to flow, push)
    left: dict[int, float] = {}  # flowing push -> bytes its NIC has still to receive

    def start_next(server: int) -> None:
        if queue[server]:
            i = queue[server].pop(0)
            p = pushes[i]
            spans[i][0] = max(p.earliest_s, free.get(server, -math.inf))
            begins.append((spans[i][0] + p.latency_s, i))

    for server in queue:
        start_next(server)
    t = -math.inf
    while begins or left:
        rate = rate_Bps * curve[min(len(left), len(curve)) - 1] if left else 0.0
        first = min(left, key=lambda i: (left[i], i)) if left else None
        end_at = t + max(left[first], 0.0) / rate if left else math.inf
        begin_at, nxt = min(begins) if begins else (math.inf, -1)
        now = min(end_at, begin_at)
        for i in left:
            left[i] -= rate * (now - t)
        t = now
        if end_at <= begin_at:  # a flow ends (before any starts at the same moment: no empty share)
            del left[first]
            spans[first][1] = t
            free[pushes[first].server] = t
            start_next(pushes[first].server)
        else:
            begins.remove((begin_at, nxt))
            if pushes[nxt].nic_bytes > 0:
                left[nxt] = pushes[nxt].nic_bytes
            else:
                spans[nxt][1] = t
                free[pushes[nxt].server] = t
                start_next(pushes[nxt].server)
    return [(a, b) for a, b in spans]


@dataclass(frozen=True)
class Settled:
    """`settle_pushes`' answer: each push's (start, end), the rounds run, whether the last two
    agreed and, where not, the most any start or end moved between them (s)."""

    spans: list[tuple[float, float]]
    rounds: int
    settled: bool
    change_s: float


def settle_pushes(pushes_for: Callable[[list[tuple[float, float]] | None], list[Push]], rate_Bps: float,
                  curve: list[float], server_free_s: dict[int, float], depends_on_spans: bool) -> Settled:
    """A step's pushes where their earliest starts depend on their own spans (the queues a small
    message waits in behind them): `pushes_for(spans)` gives the pushes from the previous
    round's spans (None at first), rerun until two rounds agree, at most `FLUID_ROUNDS`. Nothing
    shows the rounds must converge: where they do not, the last round's spans are kept and
    marked unsettled. With `depends_on_spans` False, one round."""
    spans: list[tuple[float, float]] | None = None
    rounds = FLUID_ROUNDS if depends_on_spans else 1
    for r in range(rounds):
        new = fluid_pushes(pushes_for(spans), rate_Bps, curve, server_free_s)
        if new == spans or not depends_on_spans:
            return Settled(new, r + 1, True, 0.0)
        last, spans = spans, new
    change_s = max((abs(x - y) for old, cur in zip(last or [], spans) for x, y in zip(old, cur)), default=math.inf)
    return Settled(spans, rounds, False, change_s)


def flag_unsettled(iters: int, pushes: dict[int, tuple[int, float]] | None,
                   pulls: dict[int, tuple[int, float]] | None) -> dict[str, float]:
    """The steps (updates) whose fluid pushes (pulls) never settled, each with its rounds and
    last change (s); None where that kind is not fluid. Warns about each kind that has some
    (the step time may be off) and gives their count and largest change for the result's meta."""
    meta: dict[str, float] = {}
    for kind, prefix, left in (("pushes", "fluid", pushes), ("pulls", "fluid_pull", pulls)):
        if left is None:
            continue
        change_s = max((c for _, c in left.values()), default=0.0)
        if left:
            warnings.warn(f"ps: the fluid {kind} did not settle in {max(r for r, _ in left.values())} rounds at "
                          f"{len(left)} of {iters} steps (the last two differ by up to {change_s:.3g} s); the step "
                          f"time may be off")
        meta.update({f"{prefix}_unsettled_steps": len(left), f"{prefix}_unsettled_change_s": change_s})
    return meta
