"""TicTac's orders (Hashemi et al., MLSys'19) for the parameters the servers send back.

A worker's next forward is a DAG whose roots are the parameter transfers ("recv" ops) and whose
other nodes are computation. TicTac orders the recvs so the computation can start, and keep
going, as early as possible. Its definitions (shared/background/caramel_tictac.md), for the set
R of outstanding recvs:

- `dep(op)`: the recvs an op depends on, directly or transitively;
- `op.M = sum(Time(r) for r in dep(op) & R)`; a recv's own `M` is its time;
- `P(r)`: the time of the compute ops whose outstanding dependencies are exactly {r};
- `M+(r)`: the least `op.M` over the ops that depend on r and on another outstanding recv
  (infinity when there is none).

TIC: every compute op costs 0 and every recv 1, R = all recvs, priority = M+ ascending (equal
values share a priority). TAC: measured times; repeatedly pick the recv that is least under
`A < B iff min(P_B, M_A) < min(P_A, M_B)` (ties: smaller M+), remove it from R, recompute.
Ties left by both are broken by the first compute op that needs the recv, then its index, so
every rank derives the same order. `makespan` replays an order on one link and one compute
lane; `efficiency` gives TicTac's E and S from it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile


@dataclass(frozen=True)
class PullGraph:
    """The next forward as TicTac sees it. Compute ops are listed in a topological order."""

    recv_s: tuple[float, ...]  # per recv: its transfer time
    compute_s: tuple[float, ...]  # per compute op: its time
    uses: tuple[tuple[int, ...], ...]  # per compute op: the recvs it reads directly
    preds: tuple[tuple[int, ...], ...]  # per compute op: the compute ops it waits for
    names: tuple[str, ...] = ()  # per recv, for reports (parameter names)

    def __post_init__(self) -> None:
        n, k = len(self.recv_s), len(self.compute_s)
        if len(self.uses) != k or len(self.preds) != k:
            raise CaramelError(f"pull graph: {k} compute ops but {len(self.uses)} use lists and {len(self.preds)} predecessor lists")
        for op, (us, ps) in enumerate(zip(self.uses, self.preds)):
            if any(not 0 <= r < n for r in us) or any(not 0 <= p < op for p in ps):
                raise CaramelError(f"pull graph: compute op {op} names a recv outside 0..{n - 1} or a predecessor "
                                   f"that is not an earlier op")

    def deps(self) -> list[frozenset[int]]:
        """dep(op) for every compute op (the recvs it needs, transitively)."""
        out: list[frozenset[int]] = []
        for us, ps in zip(self.uses, self.preds):
            d = set(us)
            for p in ps:
                d |= out[p]
            out.append(frozenset(d))
        return out

    def first_need(self) -> list[int]:
        """Per recv: the first compute op that depends on it (len(compute_s) when none does)."""
        deps = self.deps()
        return [next((op for op, d in enumerate(deps) if r in d), len(deps)) for r in range(len(self.recv_s))]


def properties(graph: PullGraph, outstanding: set[int], recv_s: tuple[float, ...] | None = None,
               compute_s: tuple[float, ...] | None = None,
               deps: list[frozenset[int]] | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """(P, M+) of every outstanding recv, under the given time oracle (the graph's own by default);
    `deps` is `graph.deps()` when the caller has it already."""
    recv_s = graph.recv_s if recv_s is None else recv_s
    compute_s = graph.compute_s if compute_s is None else compute_s
    P = {r: 0.0 for r in outstanding}
    Mp = {r: math.inf for r in outstanding}
    for op, dep in enumerate(graph.deps() if deps is None else deps):
        live = dep & outstanding
        if len(live) == 1:
            (r,) = live
            P[r] += compute_s[op]
        elif len(live) > 1:
            m = sum(recv_s[r] for r in live)
            for r in live:
                Mp[r] = min(Mp[r], m)
    return P, Mp


def tic_priorities(graph: PullGraph) -> dict[int, float]:
    """TIC's priority of every recv (lower first; equal values are equal priorities)."""
    n = len(graph.recv_s)
    _, Mp = properties(graph, set(range(n)), recv_s=(1.0,) * n, compute_s=(0.0,) * len(graph.compute_s))
    return Mp


def tic_order(graph: PullGraph) -> list[int]:
    """The recvs by TIC priority; ties by first need, then index."""
    pri, need = tic_priorities(graph), graph.first_need()
    return sorted(range(len(graph.recv_s)), key=lambda r: (pri[r], need[r], r))


def _tac_before(a: int, b: int, P: dict[int, float], M: tuple[float, ...], Mp: dict[int, float]) -> bool:
    """TAC's comparator: a goes before b."""
    left, right = min(P[b], M[a]), min(P[a], M[b])
    if left != right:
        return left < right
    return Mp[a] < Mp[b]


def tac_order(graph: PullGraph) -> list[int]:
    """TAC: pick the least outstanding recv under the comparator, remove it, recompute."""
    need, deps = graph.first_need(), graph.deps()
    outstanding = set(range(len(graph.recv_s)))
    order: list[int] = []
    while outstanding:
        P, Mp = properties(graph, outstanding, deps=deps)
        best = None
        for r in sorted(outstanding, key=lambda r: (need[r], r)):  # the tie-break: earliest candidate kept
            if best is None or _tac_before(r, best, P, graph.recv_s, Mp):
                best = r
        order.append(best)
        outstanding.remove(best)
    return order


def makespan(graph: PullGraph, order: list[int]) -> float:
    """One link sends the recvs back to back in `order`; one lane runs the compute ops in their
    listed order, each once its predecessors are done and its recvs have arrived."""
    if sorted(order) != list(range(len(graph.recv_s))):
        raise CaramelError(f"order {order} is not a permutation of the {len(graph.recv_s)} recvs")
    arrive = [0.0] * len(graph.recv_s)
    t = 0.0
    for r in order:
        t += graph.recv_s[r]
        arrive[r] = t
    done: list[float] = []
    lane = 0.0
    for op, (us, ps) in enumerate(zip(graph.uses, graph.preds)):
        start = max([lane] + [arrive[r] for r in us] + [done[p] for p in ps])
        lane = start + graph.compute_s[op]
        done.append(lane)
    return max([lane] + arrive)


def efficiency(compute_s: float, comm_s: float, makespan_s: float) -> tuple[float, float]:
    """TicTac's (E, S): E = (U - m) / (U - L), S = (U - L) / L with U = compute + comm (nothing
    overlaps) and L = max(compute, comm) (perfect overlap). E is 1 when U == L (nothing to gain)."""
    U, L = compute_s + comm_s, max(compute_s, comm_s)
    E = 1.0 if U - L <= 0 else (U - makespan_s) / (U - L)
    S = 0.0 if L <= 0 else (U - L) / L
    return E, S


def graph_from_profile(profile: ModelProfile, latency_s: float, bandwidth_Bps: float) -> tuple[PullGraph, list[int]]:
    """The pull graph of a profiled model and the parameter index of each recv (the trainable
    parameters). Compute ops are the profiled modules in forward order, a chain (each waits for
    the previous); a module reads the parameters it uses first; a recv costs latency + bytes/bandwidth."""
    if bandwidth_Bps <= 0 or latency_s < 0:
        raise CaramelError(f"pull graph: bandwidth must be > 0 and latency >= 0, got {bandwidth_Bps} B/s, {latency_s} s")
    params = profile.trainable()
    pos = {p.index: r for r, p in enumerate(params)}
    uses: list[list[int]] = [[] for _ in profile.modules]
    for p in params:
        if p.first_use_order is not None and p.first_use_order < len(uses):
            uses[p.first_use_order].append(pos[p.index])
    graph = PullGraph(
        recv_s=tuple(latency_s + p.bytes / bandwidth_Bps for p in params),
        compute_s=tuple(m.forward_time_s for m in profile.modules),
        uses=tuple(tuple(u) for u in uses),
        preds=tuple(() if k == 0 else (k - 1,) for k in range(len(profile.modules))),
        names=tuple(p.name for p in params))
    return graph, [p.index for p in params]


E_MIN_S = 0.2
"""Below this S the bounds U and L lie under a fifth of L apart: E = (U - m) / (U - L) divides by
that gap, so a few percent of step noise move E by whole units and it says nothing."""


def e_reading(E: float | None, S: float | None) -> tuple[float | None, str | None]:
    """A measured E as a number where it means something, else (None, why): E is defined on
    [0, 1] (U, no overlap, and L, perfect overlap, bound the makespan); at S under `E_MIN_S`
    the gap it divides by is noise, and outside [0, 1] the profiled bounds do not describe the
    step (the makespan lies beyond them), which (m - U) / L = -E S states in units of L."""
    if E is None or S is None:
        return None, "not measured"
    if S < E_MIN_S:
        return None, f"n/a (S {S:.2f} < {E_MIN_S:g})"
    if not 0.0 <= E <= 1.0:
        return None, f"out of bounds ({E:.2f})"
    return E, None


def steady_medians(log: list[dict]) -> dict:
    """TicTac's E and S of a run's per-step log, as `stats_dict()` reports them: medians over the
    same steps (the log's last three quarters, the first being warm-up, those that measured E),
    and `(m - U) / L = -E S` over them; one definition for the runtime and the experiments that
    rescore a log (a last-step S beside a median E would pair two steps' numbers)."""
    timed = [x for x in log[len(log) // 4:] if "E" in x]
    if not timed:
        return {"E_median": None, "S": None, "beyond_U_over_L_median": None, "E_steps": 0}
    return {"E_median": statistics.median(x["E"] for x in timed), "S": statistics.median(x["S"] for x in timed),
            "beyond_U_over_L_median": statistics.median(-x["E"] * x["S"] for x in timed), "E_steps": len(timed)}
