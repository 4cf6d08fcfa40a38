"""The caramel planner's candidate search: candidates, their simulation and the local search.

A `Candidate` is one bucket grouping with its chunks and issue order; `_Search` simulates each
distinct candidate once (`caramel.sim`), keeps the best under deterministic tie-breaks, builds
the basic and hybrid:k orders, rescores on an input spread and runs the local search over bucket
boundaries. `caramel.strategies.caramel.planner` decides which candidates to try and in what
stages; this module is the machinery that scores them, kept apart so each reads on its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from caramel.topology.spec import ClusterSpec
from caramel.plan.plan import Bucket, Plan
from caramel.plan.planners import plan_from_groups, ready_sorted
from caramel.strategies.caramel.spread import Scenario, spread_step_time_s
from caramel.profile.model_profile import ModelProfile, ParamInfo
from caramel.plan.costs import hidden_transfer_s
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import predict_step_time_s
from caramel.sim.workload import BucketLoad, Item, make_workload, param_need_s, param_ready_s

MAX_CHUNKS = 64
SPLIT_ANYWHERE_MAX = 8  # a bucket of at most this many parameters may be split anywhere
ALL_KS_MAX_BUCKETS = 6  # up to this many buckets, local search tries every k of hybrid:k
PLAN_ITERATIONS = 3

Groups = tuple[tuple[int, ...], ...]  # parameter indices per bucket, buckets in ready order


@dataclass(frozen=True)
class Candidate:
    groups: Groups
    chunks: tuple[int, ...]
    order_name: str  # "ready", "need" or "hybrid:k"
    bucket_order: tuple[int, ...]
    chunk_cap_bytes: float | None = None

    def items(self) -> list[tuple[int, int]]:
        return [(b, c) for b in self.bucket_order for c in range(self.chunks[b])]


class _Search:
    """Evaluates candidates by simulation and keeps the best (deterministic tie-breaks)."""

    def __init__(self, profile: ModelProfile, cluster: ClusterSpec, comm: CommModel, overlap: str):
        self.profile, self.cluster, self.comm, self.overlap = profile, cluster, comm, overlap
        self.by_index: dict[int, ParamInfo] = {p.index: p for p in profile.params}
        self.ready = param_ready_s(profile)
        self.need = param_need_s(profile)
        self.ready_list = [p.index for p in ready_sorted(profile)]
        self.total_bytes = sum(p.bytes for p in profile.trainable()) or 1
        self.best: Candidate | None = None
        self.best_key: tuple | None = None
        self.count = 0
        self._seen: dict[tuple, tuple[tuple, Candidate]] = {}  # identity -> (sort key, candidate)
        self.scenarios: list[Scenario] | None = None  # the spread's points; None: the inputs as given

    # -- sizes and the cost model
    def s_half_bytes(self, total: int, queued: bool = False) -> float:
        """Bytes at which one collective's latency equals its transfer time: on an idle link, or
        `queued` in a train of equal pieces, where each pays max(queued latency, lone latency
        less the previous piece's transfer), equal to its transfer at max(queued, lone / 2)."""
        latency_s = (max(self.comm.queued_latency_s, self.comm.latency_s / 2) if queued else self.comm.latency_s)
        return latency_s / self.comm.per_byte_s if self.comm.per_byte_s > 0 else float(total)

    def group_bytes(self, g) -> int:
        return sum(self.by_index[i].bytes for i in g)

    def group_numel(self, g) -> int:
        return sum(self.by_index[i].numel for i in g)

    # -- orders
    def hybrid(self, groups: Groups, k: int) -> tuple[int, ...]:
        """First k buckets in ready order, the rest by first use in forward (ties: ready order)."""
        rest = sorted(range(k, len(groups)), key=lambda b: (min(self.need[i] for i in groups[b]), b))
        return tuple(range(k)) + tuple(rest)

    def estimate_k(self, groups: Groups) -> int:
        """How many buckets, sent as they fill, finish before backward ends."""
        t, k, prev_transfer = 0.0, 0, 0.0
        for g in groups:
            ready, nbytes = max(self.ready[i] for i in g), self.group_bytes(g)
            t = max(t, ready) + self.comm.time_s(nbytes, hidden_transfer_s(ready, t, prev_transfer))
            prev_transfer = self.comm.transfer_s(nbytes)
            if t > self.profile.backward_time_s:
                break
            k += 1
        return k

    def hybrid_candidate(self, groups: Groups, k: int) -> Candidate:
        k = max(0, min(k, len(groups)))
        name = "ready" if k == len(groups) else ("need" if k == 0 else f"hybrid:{k}")
        return Candidate(groups, (1,) * len(groups), name, self.hybrid(groups, k))

    def basic_orders(self, groups: Groups) -> list[Candidate]:
        return [self.hybrid_candidate(groups, len(groups)), self.hybrid_candidate(groups, 0),
                self.hybrid_candidate(groups, self.estimate_k(groups))]

    # -- evaluation
    def evaluate(self, cand: Candidate) -> tuple:
        """Simulate a candidate (once per distinct plan); return its sort key."""
        ident = (cand.groups, cand.chunks, cand.bucket_order)
        if ident in self._seen:
            return self._seen[ident][0]
        work = self._workload(cand)
        step = (predict_step_time_s(work, self.cluster, self.comm, self.overlap, PLAN_ITERATIONS) if self.scenarios is None
                else spread_step_time_s(work, self.scenarios, self.overlap, PLAN_ITERATIONS))
        # step times within 1 ns are ties; then fewer collectives, then the earlier candidate
        key = (round(step, 9), sum(cand.chunks), self.count)
        self._seen[ident] = (key, cand)
        self.count += 1
        if self.best_key is None or key < self.best_key:
            self.best, self.best_key = cand, key
        return key

    def rescore(self, scenarios: list[Scenario], limit: int | None = None) -> None:
        """Make the mean step time over `scenarios` the objective, and score every candidate seen
        so far again on it, in the order they were first seen (the tie-break); with `limit`, only
        the best `limit` of them (in that order)."""
        seen = [cand for _, cand in self._seen.values()]
        if limit is not None:
            keep = {id(c) for _, c in sorted(self._seen.values(), key=lambda kc: kc[0])[:limit]}
            seen = [c for c in seen if id(c) in keep]
        self.scenarios = scenarios
        self._seen = {}
        self.best = self.best_key = None
        for cand in seen:
            self.evaluate(cand)

    def _workload(self, cand: Candidate):
        buckets = []
        for b, g in enumerate(cand.groups):
            nbytes = self.group_bytes(g)
            buckets.append(BucketLoad(b, nbytes, max(self.ready[i] for i in g), min(self.need[i] for i in g),
                                      self.profile.optimizer_time_s * nbytes / self.total_bytes))
        shapes = [Bucket(b, [], "", self.group_numel(g), buckets[b].bytes, cand.chunks[b]) for b, g in enumerate(cand.groups)]
        items = [Item(b, c, shapes[b].chunk_bytes(c)) for b, c in cand.items()]
        return make_workload(self.profile, buckets, items)

    def to_plan(self, cand: Candidate) -> Plan:
        groups = [[self.by_index[i] for i in g] for g in cand.groups]
        return plan_from_groups("caramel", self.profile, self.cluster.world_size, groups,
                                chunks=list(cand.chunks), order=cand.items())

    # -- local search over bucket boundaries
    def local_search(self, budget: int) -> None:
        """Best-improvement moves of bucket boundaries from the best candidate, `budget` simulations at most."""
        ready_order = self.ready_list
        pos = {p: i for i, p in enumerate(ready_order)}
        dtypes = [self.by_index[p].dtype for p in ready_order]
        stop_at = self.count + budget
        while self.count < stop_at:
            cur = self.best
            cuts = [pos[g[0]] for g in cur.groups[1:]]  # start position of every bucket but the first
            improved = False
            for new_cuts in self._neighbour_cuts(cuts, len(ready_order), dtypes):
                if self.count >= stop_at:
                    break
                groups = _groups_from_cuts(ready_order, new_cuts)
                k = cur.order_name
                k = len(groups) if k == "ready" else 0 if k == "need" else min(int(k.split(":")[1]), len(groups))
                k_est = self.estimate_k(groups)
                ks = range(len(groups) + 1) if len(groups) <= ALL_KS_MAX_BUCKETS else (k, k_est, max(k_est - 1, 0))
                for kk in dict.fromkeys(ks):
                    cand = self.hybrid_candidate(groups, kk)
                    before = self.best
                    self.evaluate(cand)
                    improved |= self.best is not before
            if not improved:
                return

    def _neighbour_cuts(self, cuts: list[int], n: int, dtypes: list[str]):
        bounds = [0] + cuts + [n]
        out = []
        for j in range(len(cuts)):  # merge bucket j and j+1
            if dtypes[bounds[j]] == dtypes[bounds[j + 2] - 1]:
                out.append(cuts[:j] + cuts[j + 1:])
        for j in range(len(bounds) - 1):  # split bucket j: anywhere if small, else at its byte quartiles
            lo, hi = bounds[j], bounds[j + 1]
            splits = range(lo + 1, hi) if hi - lo <= SPLIT_ANYWHERE_MAX else self._quantiles(lo, hi)
            out.extend(sorted(cuts + [c]) for c in dict.fromkeys(splits))
        for j, c in enumerate(cuts):  # move a boundary by one parameter
            for d in (-1, 1):
                c2 = c + d
                if bounds[j] < c2 < bounds[j + 2]:
                    out.append(cuts[:j] + [c2] + cuts[j + 1:])
        ok = []
        for cand in out:
            b = [0] + cand + [n]
            if all(len(set(dtypes[b[i]:b[i + 1]])) == 1 for i in range(len(b) - 1)):
                ok.append(cand)
        return ok

    def _quantiles(self, lo: int, hi: int) -> list[int]:
        """Cut positions in (lo, hi) closest to a quarter, half and three quarters of the bytes."""
        sizes = [self.by_index[self.ready_list[i]].bytes for i in range(lo, hi)]
        total, out = sum(sizes), []
        for q in (0.5, 0.25, 0.75):
            acc = 0
            for k, s in enumerate(sizes[:-1]):
                acc += s
                if acc >= q * total:
                    out.append(lo + k + 1)
                    break
        return out


def _groups_from_cuts(order: list[int], cuts: list[int]) -> Groups:
    bounds = [0] + list(cuts) + [len(order)]
    return tuple(tuple(order[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1))


def _num_chunks(nbytes: int, numel: int, chunk_cap: float) -> int:
    if chunk_cap <= 0 or nbytes <= 2 * chunk_cap:
        return 1
    return max(1, min(math.ceil(nbytes / chunk_cap), MAX_CHUNKS, numel))
