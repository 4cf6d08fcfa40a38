"""The queues a small message waits in behind the ps strategy's bulk transfers, for its simulator.

Gloo moves a message of a send/recv pair (the ps pushes) or of a broadcast (the pulls, rank 0's
buffers at each bsp forward) only once the receiver has told the sender it is ready: its
"recv ready" note travels receiver -> sender before the data goes the other way. On a shaped
link a bulk transfer keeps its queue full (TCP fills it up to what the receiver's buffer
allows), so such a note, or a small broadcast, waits behind whatever bulk data is queued on
the way it travels. Measured on the emulated cluster (`experiments/ps_breakdown.py`, docs/ps.md,
"Simulator against runtime"): at 340 Mbit/s rank 0's buffer broadcast at each forward takes
20-25 ms, the time left of the other rank's pulls, and a push whose server posts its receive
while the other direction is busy starts that much later.

Per worker, two queues: its egress (what it sends: a server's pulls) and its ingress (what it
receives: a server's pushes, whichever of the ranks sends them). A message from a to b waits
behind a's egress and b's ingress; behind each for the rest of the run of back-to-back
transfers it entered, at most `cap_s` (the most one TCP flow keeps queued: its receive
buffer's worth at the link's rate; the emulated cluster's `receive_buffer_cap_bytes`).
"""
from __future__ import annotations

import bisect
import math


class Backlog:
    """One queue's bulk transfers as disjoint, ordered busy runs."""

    def __init__(self, cap_s: float = math.inf):
        if not cap_s >= 0:
            raise ValueError(f"a queue's cap must be >= 0 seconds, got {cap_s!r}")
        self.cap_s = cap_s
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, start_s: float, end_s: float) -> None:
        """A bulk transfer holds the queue over [start_s, end_s] (touching runs merge)."""
        if end_s <= start_s:
            return
        i = bisect.bisect_left(self.ends, start_s)
        j = bisect.bisect_right(self.starts, end_s)
        if i < j:
            start_s, end_s = min(start_s, self.starts[i]), max(end_s, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [start_s], [end_s]

    def wait(self, t_s: float) -> float:
        """How long a message entering at `t_s` waits: the rest of the run it lands in, at most the cap."""
        i = bisect.bisect_right(self.starts, t_s) - 1
        if i < 0 or self.ends[i] <= t_s:
            return 0.0
        return min(self.ends[i] - t_s, self.cap_s)

    def forget_before(self, t_s: float) -> None:
        i = bisect.bisect_right(self.ends, t_s)
        del self.starts[:i], self.ends[:i]


class Queues:
    """Every worker's egress and ingress backlog (module docstring)."""

    def __init__(self, workers: int, cap_s: float = math.inf):
        self.egress = [Backlog(cap_s) for _ in range(workers)]
        self.ingress = [Backlog(cap_s) for _ in range(workers)]

    def wait(self, src: int, dst: int, t_s: float) -> float:
        """A small message from worker `src` to worker `dst` sent at `t_s`: its wait in the queues."""
        return self.egress[src].wait(t_s) + self.ingress[dst].wait(t_s)

    def forget_before(self, t_s: float) -> None:
        for q in self.egress + self.ingress:
            q.forget_before(t_s)


def broadcast_rounds(queues: Queues, root: int, post_s: list[float], rounds: int, message_s: float
                     ) -> tuple[float, list[float]]:
    """`rounds` small blocking broadcasts from `root`, one after another (one per dtype of the
    buffers): each receiver posts its receive (the first at `post_s[w]`, each next when the
    previous landed), its note reaches the root through the queues, the root sends once every
    note is in and the data reaches each receiver through the queues plus `message_s` (its
    latency and bytes). Returns when the root is done and when each rank has the last round
    (the root's own entry: when it is done)."""
    got = list(post_s)
    root_done = post_s[root]
    for _ in range(rounds):
        ready = max([root_done] + [got[w] + queues.wait(w, root, got[w]) for w in range(len(got)) if w != root])
        root_done = ready
        got = [ready if w == root else ready + queues.wait(root, w, ready) + message_s for w in range(len(got))]
    return root_done, got
