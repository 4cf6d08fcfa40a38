"""What the ps simulator's links do with the transfers it schedules: `Wire` keeps every push and
pull in flight (for CPU contention), `Links` orders what a rank sends where its pushes and
pulls leave by one NIC (colocated, flat servers). Kept apart from `simulate.py`'s step loop,
which calls them; neither needs its state.
"""
from __future__ import annotations

import bisect

from caramel.sim.event_loop import Busy


class Wire:
    """Every push and pull scheduled so far, as disjoint intervals in time order, for CPU
    contention: compute runs `slowdown` times slower while any of them is in flight (every
    worker takes part in every shard's transfers)."""

    def __init__(self, slowdown: float):
        self.slowdown = slowdown
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, spans: list[tuple[float, float]]) -> None:
        if self.slowdown > 1.0:
            for a, b in spans:
                _merge_into(self.starts, self.ends, a, b)

    def busy(self, after_s: float, extra: list[tuple[float, float]] = ()) -> Busy:
        """The event engine's `Busy` over the intervals (and `extra`) that end after `after_s`."""
        if self.slowdown <= 1.0:
            return Busy(1.0)
        i = bisect.bisect_right(self.ends, after_s)
        starts, ends = self.starts[i:], self.ends[i:]
        for a, b in extra:
            _merge_into(starts, ends, a, b)
        return Busy.over(self.slowdown, starts, ends)

    def forget_before(self, t_s: float) -> None:
        """Drop the intervals that ended before `t_s`, when no worker computes before it any more."""
        i = bisect.bisect_right(self.ends, t_s)
        del self.starts[:i], self.ends[:i]


class Links:
    """What a serving rank sends out of its NIC: its pushes to the other shards and its own
    shard's pulls leave one after another, never side by side at full rate each. Colocated,
    flat servers: the serving rank's pushes travel on its own shard's pull group
    (`PsEngine.link_group`; gloo, one connection per pair and group). Hierarchical leaders
    (indexed by shard, `ranks` = `serving` = nodes): their pulls and, on NCCL, their reduces
    among the leaders (`lead_push`, a group of its own) use `pull_start` and `push_start` here;
    on gloo their node sums go on their pull group (`Hierarchy.link_group`) and `LeaderSends`
    (`sim_hier.py`) queues them behind the pulls handed over before, as `push_start` would,
    with `pull_start` as here for the pulls. One NIC egress either way.
    Serialized or sharing the NIC, the bytes a step are the same.
    In the order handed over: a push waits for the pulls its sender handed over before it, a
    pull for its server's pushes handed over before it. The runtime's sender thread hands pull
    buckets over one at a time, so a push ready amid a backlog of pulls may slip between two
    of them; the model sends it after them (the link carries the same bytes per step either
    way). Ranks that serve nothing (`servers` < ranks) push on the server's own group."""

    def __init__(self, ranks: int, serving: int):
        self.serving = serving
        self.pushes_end = [0.0] * ranks  # per rank: when the pushes it has handed over have left

    def push_start(self, start_s: float, owner: int, pulls_end: list[float]) -> float:
        """The earliest a push to shard `owner` (every other rank sends) can start: after the
        pulls each serving sender handed over before it (`pulls_end`, per shard)."""
        return max([start_s] + [pulls_end[w] for w in range(self.serving) if w != owner])

    def pushed(self, owner: int, end_s: float) -> None:
        for w in range(self.serving):
            if w != owner:
                self.pushes_end[w] = max(self.pushes_end[w], end_s)

    def pull_start(self, start_s: float, server: int) -> float:
        """The earliest shard `server`'s next pull can start: after its server's pushes."""
        return max(start_s, self.pushes_end[server])


def _merge_into(starts: list[float], ends: list[float], a: float, b: float) -> None:
    """Add [a, b] to the disjoint, ordered intervals `starts`/`ends`, merging what it touches."""
    if b <= a:
        return
    i = bisect.bisect_left(ends, a)  # the first interval that does not end before a
    j = bisect.bisect_right(starts, b)  # the intervals from i to j touch [a, b]
    if i < j:
        a, b = min(a, starts[i]), max(b, ends[j - 1])
    starts[i:j], ends[i:j] = [a], [b]
