"""The `caramel` planner: window-aware batching, chunking and priority, chosen by simulation.

Candidates come from the cluster's fitted cost model, time(S) = L + S * beta per collective
(`CommModel`): S_half = L / beta is the size at which latency equals transfer time, so bucket
caps at 1, 4, 16 and 64 x S_half keep latency at 50%, 20%, 6% and 1.5% of a bucket's time;
caps at fractions of the model and DDP's usual caps are tried too. Parameters are grouped in
gradient-ready order (a bucket is ready when its last gradient is). Issue orders:
- `ready`: buckets as they fill (what DDP does);
- `need`: what the next forward needs first goes first;
- `hybrid:k`: the first k buckets to fill go as they fill (they use backward time that would
  otherwise be idle on the network), the rest in need-first order; k estimated from the cost
  model and then searched.
Large buckets are optionally cut into chunks. Every candidate is simulated (`caramel.sim`) with
the overlap mode the runtime will use; the fastest wins, ties go to fewer collectives, then to
the earlier candidate. Everything is a pure function of (profile, cluster, options), so every
rank computes the identical plan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from caramel.cluster.spec import ClusterSpec, WorkerSpec
from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.plan.planners import MB, PLANNERS, group_by_cap, plan_from_groups, ready_sorted, register_planner
from caramel.profile.model_profile import ModelProfile, ParamInfo
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import check_overlap, simulate
from caramel.sim.workload import param_need_s, param_ready_s

DEFAULT_BANDWIDTH_BPS = 1e9
DEFAULT_LATENCY_S = 50e-6
HALF_MULTIPLES = (1, 4, 16, 64)
MODEL_FRACTIONS = (1, 2, 4, 8, 16, 32)
FIXED_CAPS_BYTES = (1 * MB, 4 * MB, 25 * MB)
CHUNK_MULTIPLES = (4, 16)  # chunk caps, in S_half
MAX_CHUNKS = 64
TOP_GROUPINGS = 3
MAX_HYBRID_KS = 16
REFINE_FACTORS = (0.5, 0.7071, 1.4142, 2.0)
PLAN_ITERATIONS = 3


def default_cluster(world_size: int) -> ClusterSpec:
    """The cluster assumed when the runtime knows nothing better: uniform workers, 1 Gbit/s, 50 us."""
    return ClusterSpec.uniform(world_size, bandwidth_bps=DEFAULT_BANDWIDTH_BPS, latency_s=DEFAULT_LATENCY_S)


@dataclass(frozen=True)
class Candidate:
    cap_bytes: float
    groups: tuple[tuple[int, ...], ...]  # parameter indices per bucket, in ready order
    chunks: tuple[int, ...]
    order_name: str
    bucket_order: tuple[int, ...]
    chunk_cap_bytes: float | None = None

    def items(self) -> list[tuple[int, int]]:
        return [(b, c) for b in self.bucket_order for c in range(self.chunks[b])]


@register_planner("caramel")
def plan_caramel(profile: ModelProfile, cluster: ClusterSpec | None = None, world_size: int | None = None,
                 overlap: str = "forward", comm_model: str = "message", **unused: Any) -> Plan:
    """Simulate candidate bucket caps, chunk sizes and issue orders; return the fastest plan."""
    check_overlap(overlap)
    cluster, resized = _cluster_for(cluster, world_size)
    comm = CommModel(cluster, comm_model)
    params = ready_sorted(profile)
    if not params:
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to reduce")
    by_index = {p.index: p for p in profile.params}
    ready = param_ready_s(profile)
    need = param_need_s(profile)
    search = _Search(profile, cluster, comm, overlap, by_index, ready, need)

    total = sum(p.bytes for p in params)
    s_half = comm.latency_s / comm.per_byte_s if comm.per_byte_s > 0 else float(total)
    caps = sorted({max(1.0, min(float(total), c)) for c in
                   [s_half * k for k in HALF_MULTIPLES] + [total / k for k in MODEL_FRACTIONS] + list(FIXED_CAPS_BYTES)})
    groupings: dict[tuple, float] = {}
    for cap in caps:
        groups = tuple(tuple(p.index for p in g) for g in group_by_cap(params, [max(1, int(cap))]))
        groupings.setdefault(groups, cap)
    # the baselines' own groupings, so that the search never does worse than DDP or Horovod
    for name in ("fifo", "fusion"):
        baseline = PLANNERS[name](profile, cluster, world_size=cluster.world_size)
        groupings.setdefault(tuple(tuple(b.params) for b in baseline.buckets), float(max(b.bytes for b in baseline.buckets)))

    # stage 1: every grouping with the three basic orders
    stage1: dict[tuple, tuple] = {}
    for groups, cap in groupings.items():
        ones = tuple(1 for _ in groups)
        k_est = search.estimate_k(groups)
        for name, order in (("ready", tuple(range(len(groups)))), ("need", search.hybrid(groups, 0)),
                            (f"hybrid:{k_est}", search.hybrid(groups, k_est))):
            key = search.evaluate(Candidate(cap, groups, ones, name, order))
            if groups not in stage1 or key < stage1[groups]:
                stage1[groups] = key
    # stage 2: the best groupings with a sweep of k
    best_groupings = sorted(stage1, key=lambda g: stage1[g])[:TOP_GROUPINGS]
    for groups in best_groupings:
        nb = len(groups)
        ks = sorted({round(i * nb / (MAX_HYBRID_KS - 1)) for i in range(MAX_HYBRID_KS)} if nb >= MAX_HYBRID_KS
                    else set(range(nb + 1)))
        for k in ks:
            search.evaluate(Candidate(groupings[groups], groups, tuple(1 for _ in groups), f"hybrid:{k}", search.hybrid(groups, k)))
    # stage 3: caps between the best one and its neighbours, with the best order policy
    base = search.best
    policy = base.order_name.split(":")[0]
    for factor in REFINE_FACTORS:
        cap = base.cap_bytes * factor
        groups = tuple(tuple(p.index for p in g) for g in group_by_cap(params, [max(1, int(cap))]))
        if groups in groupings:
            continue
        groupings[groups] = cap
        k = {"ready": len(groups), "need": 0}.get(policy, search.estimate_k(groups))
        search.evaluate(Candidate(cap, groups, tuple(1 for _ in groups), f"{policy}:{k}" if policy == "hybrid" else policy,
                                  search.hybrid(groups, k)))
    # stage 4: chunk the large buckets of the best candidate
    base = search.best
    for mult in CHUNK_MULTIPLES:
        chunk_cap = s_half * mult
        chunks = tuple(_num_chunks(sum(by_index[i].bytes for i in g), sum(by_index[i].numel for i in g), chunk_cap)
                       for g in base.groups)
        if chunks != base.chunks:
            search.evaluate(Candidate(base.cap_bytes, base.groups, chunks, base.order_name, base.bucket_order, chunk_cap))

    best = search.best
    plan = search.to_plan(best, options={})
    result = simulate(profile, cluster, plan, overlap=overlap, trace=False, comm=comm)
    plan.predicted_step_time_s = result.step_time_s
    plan.options = {
        "overlap": overlap,
        "bucket_cap_bytes": best.cap_bytes,
        "chunk_cap_bytes": best.chunk_cap_bytes,
        "order": best.order_name,
        "candidates_evaluated": search.count,
        "s_half_bytes": s_half,
        "comm_model": comm.describe(),
        "cluster": {"workers": cluster.world_size, "bandwidth_bps": cluster.bandwidth_bps,
                    "latency_s": cluster.latency_s, "collective": cluster.collective, "topology": cluster.topology},
        "predicted": {k: result.summary()[k] for k in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_s")},
    }
    if resized:
        plan.options["cluster_resized_from"] = resized
    return plan


class _Search:
    """Evaluates candidates by simulation and keeps the best (deterministic tie-breaks)."""

    def __init__(self, profile, cluster, comm, overlap, by_index, ready, need):
        self.profile, self.cluster, self.comm, self.overlap = profile, cluster, comm, overlap
        self.by_index: dict[int, ParamInfo] = by_index
        self.ready, self.need = ready, need
        self.best: Candidate | None = None
        self.best_key: tuple | None = None
        self.count = 0
        self._seen: dict[tuple, tuple] = {}

    def hybrid(self, groups: tuple, k: int) -> tuple[int, ...]:
        """First k buckets in ready order, the rest by first use in forward (ties: ready order)."""
        rest = sorted(range(k, len(groups)), key=lambda b: (min(self.need[i] for i in groups[b]), b))
        return tuple(range(k)) + tuple(rest)

    def estimate_k(self, groups: tuple) -> int:
        """How many buckets, sent as they fill, finish before backward ends."""
        t, k = 0.0, 0
        for g in groups:
            ready = max(self.ready[i] for i in g)
            t = max(t, ready) + self.comm.time_s(sum(self.by_index[i].bytes for i in g))
            if t > self.profile.backward_time_s:
                break
            k += 1
        return k

    def to_plan(self, cand: Candidate, options: dict) -> Plan:
        groups = [[self.by_index[i] for i in g] for g in cand.groups]
        return plan_from_groups("caramel", self.profile, self.cluster.world_size, groups,
                                chunks=list(cand.chunks), order=cand.items(), options=options)

    def evaluate(self, cand: Candidate) -> tuple:
        """Simulate a candidate (once per distinct plan); return its sort key."""
        ident = (cand.groups, cand.chunks, cand.bucket_order)
        if ident in self._seen:
            return self._seen[ident]
        plan = self.to_plan(cand, {})
        res = simulate(self.profile, self.cluster, plan, overlap=self.overlap, iterations=PLAN_ITERATIONS,
                       trace=False, comm=self.comm)
        # step times equal to 1 ns are ties; then fewer collectives, then the earlier candidate
        key = (round(res.step_time_s, 9), len(plan.order), self.count)
        self._seen[ident] = key
        self.count += 1
        if self.best_key is None or key < self.best_key:
            self.best, self.best_key = cand, key
        return key


def _num_chunks(nbytes: int, numel: int, chunk_cap: float) -> int:
    if chunk_cap <= 0 or nbytes <= 2 * chunk_cap:
        return 1
    return max(1, min(math.ceil(nbytes / chunk_cap), MAX_CHUNKS, numel))


def _cluster_for(cluster: ClusterSpec | None, world_size: int | None) -> tuple[ClusterSpec, dict | None]:
    """The cluster to plan for; a spec for another number of workers keeps its network, not its size."""
    if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
        raise CaramelError(f"world_size must be a positive integer, got {world_size!r}")
    if cluster is None:
        return default_cluster(world_size or 1), None
    cluster.validate()
    if world_size is None or world_size == cluster.world_size:
        return cluster, None
    resized = ClusterSpec([WorkerSpec(f"w{i}") for i in range(world_size)], cluster.bandwidth_bps, cluster.latency_s,
                          cluster.topology, cluster.collective, cluster.num_servers, dict(cluster.meta))
    return resized, {"workers": cluster.world_size}
