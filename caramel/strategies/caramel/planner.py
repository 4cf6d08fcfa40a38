"""The `caramel` planner: window-aware batching, chunking and priority, chosen by simulation.

Candidates come from the cluster's fitted cost model, time(S) = L + S * beta per collective
(`CommModel`): S_half = L / beta is the size at which latency equals transfer time, so bucket
caps at 1, 4, 16 and 64 x S_half keep latency at 50%, 20%, 6% and 1.5% of a bucket's time;
S_half is taken twice, with the latency of a collective on an idle link and with that of one
in a back-to-back train (`ClusterSpec.queued_latency_s`, `_Search.s_half_bytes` in
`candidate_search`; chunk caps use the latter, as a bucket's chunks go back to back); caps at
fractions of the model and the baselines' groupings (DDP's, Horovod's) are tried too.
Parameters are grouped in gradient-ready order (a bucket is ready when its last gradient is).
Issue orders:
- `ready`: buckets as they fill (what DDP does);
- `need`: what the next forward needs first goes first;
- `hybrid:k`: the first k buckets to fill go as they fill (they use backward time that would
  otherwise leave the network idle), the rest in need-first order; k estimated from the cost
  model, then searched.
The best groupings are then improved by a local search over bucket boundaries (merge two
neighbours, split one, move a boundary by one parameter), which finds the uneven groupings
(a small first bucket, a large last one) that uniform caps miss, and large buckets are
optionally cut into chunks. Every candidate is simulated (`caramel.sim`) with the overlap mode
the runtime will use; ties go to fewer collectives, then to the earlier candidate.
The search runs on the inputs as given; then every candidate it simulated (the baselines'
groupings in DDP's order among them) is simulated again over a spread of inputs (compute and
bandwidth each up to `input_spread` off, each point also with compute slowed beside communication
by `contention_spread`, `caramel.strategies.caramel.spread`), the lowest mean wins, and its
large buckets are tried in chunks on that mean: the inputs are measurements that move between
runs, and a plan tuned to one of them can sit on a cliff. (On the saved bench inputs, scoring
only the best ten again kept a third of the gain; searching on the spread from the start, or a
second local search on it, gained no more and cost several times the search.)
The search is bounded by candidate counts, never by the clock, so it is a pure function of
(profile, cluster, options) and every rank computes the identical plan.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from caramel.topology.spec import ClusterSpec, WorkerSpec
from caramel.errors import CaramelError
from caramel.plan.branch_order import check_branch_order
from caramel.plan.compute_schedule import (DEFAULT_MEMORY_FRACTION, ComputeSchedule, candidate_ks,
                                           check_compute_schedule, deferred_profile, max_k, memory_cap_bytes,
                                           schedule_for)
from caramel.plan.plan import Plan
from caramel.plan.planners import MB, PLANNERS, group_by_cap, ready_sorted, register_planner
from caramel.strategies.caramel.branch_choice import choose_branch_order
from caramel.strategies.caramel.candidate_search import PLAN_ITERATIONS, Candidate, Groups, _num_chunks, _Search
from caramel.strategies.caramel.spread import (DEFAULT_CONTENTION_SPREAD, DEFAULT_INPUT_SPREAD, check_contention_spread,
                                 check_input_spread, spread_scenarios, spread_step_time_s)
from caramel.profile.model_profile import ModelProfile
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import check_overlap, simulate

DEFAULT_BANDWIDTH_BPS = 1e9
DEFAULT_LATENCY_S = 50e-6
HALF_MULTIPLES = (1, 4, 16, 64)
MODEL_FRACTIONS = (1, 2, 4, 8, 16, 32)
FIXED_CAPS_BYTES = (1 * MB, 4 * MB, 25 * MB)
CHUNK_MULTIPLES = (4, 16)  # chunk caps, in queued S_half
TOP_GROUPINGS = 3
MAX_HYBRID_KS = 16
LOCAL_SEARCH_EVALS = 300  # simulations spent improving bucket boundaries
QUICK_RESCORE = 8  # screening a compute schedule: the best stage-1 candidates scored again on the spread
DEFER_MARGIN = 0.01  # a deferral must beat no deferral by more than 1% of the objective (else k = 0)


def default_cluster(world_size: int) -> ClusterSpec:
    """The cluster assumed when the runtime knows nothing better: uniform workers, 1 Gbit/s, 50 us."""
    return ClusterSpec.uniform(world_size, bandwidth_bps=DEFAULT_BANDWIDTH_BPS, latency_s=DEFAULT_LATENCY_S)


@register_planner("caramel")
def plan_caramel(profile: ModelProfile, cluster: ClusterSpec | None = None, world_size: int | None = None,
                 overlap: str = "forward", comm_model: str = "message",
                 input_spread: float = DEFAULT_INPUT_SPREAD, contention_spread: float = DEFAULT_CONTENTION_SPREAD,
                 collective_cpu_s: float | None = None, compute_schedule: str | int = "auto",
                 branch_order: str = "off", defer_memory_fraction: float = DEFAULT_MEMORY_FRACTION,
                 **unused: Any) -> Plan:
    """Simulate candidate bucket caps, chunk sizes and issue orders; return the fastest plan over
    the input spread, each point also with compute `1 + contention_spread` times slower beside a
    collective (`input_spread=0`: the fastest on the inputs exactly). `collective_cpu_s`, when
    given, replaces the cluster's CPU cost per collective (`ClusterSpec.collective_cpu_s`).

    `compute_schedule` (`caramel.plan.compute_schedule`): "auto" also chooses how many of the
    splittable modules nearest the input defer their weight gradients (k = 0 included; only
    within the memory cap: `defer_memory_fraction` of the undeferred peak), "off" defers none,
    an int k defers exactly k. The plan is made for
    the profile that deferral produces and carries it in `Plan.compute_schedule`.

    `branch_order` ("off" | "auto", `caramel.strategies.caramel.branch_choice`): "auto" may run a
    model's independent branches (`profile.meta["branches"]`) in another order, when simulation
    says it is faster; the plan is then made for that order and carries it in `Plan.module_order`."""
    check_overlap(overlap)
    input_spread = check_input_spread(input_spread)
    contention_spread = check_contention_spread(contention_spread)
    mode = check_compute_schedule(compute_schedule)
    cluster, resized = _cluster_for(cluster, world_size)
    if collective_cpu_s is not None:
        cluster = dataclasses.replace(cluster, collective_cpu_s=_check_collective_cpu_s(collective_cpu_s),
                                      meta=dict(cluster.meta))
    if not profile.trainable():
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to reduce")
    comm = CommModel(cluster, comm_model)
    module_order, branch_decision = None, {"mode": check_branch_order(branch_order)}
    if branch_order == "auto":
        profile, module_order, branch_decision = choose_branch_order(
            profile, comm.per_byte_s, lambda prof: _search_plan(prof, cluster, comm, overlap, input_spread, contention_spread, None))

    def full(k: int) -> tuple[Plan, float]:
        schedule = schedule_for(profile, k)
        return _search_plan(deferred_profile(profile, schedule), cluster, comm, overlap, input_spread,
                            contention_spread, schedule)

    decision: dict[str, Any] = {"mode": mode}
    if mode == "auto":
        # each k in {0, 1, 2, 4, ..., K} (K: all deferrable modules within the memory cap) is
        # screened by a short search (stage 1, its best candidates on the spread: ~0.07 s for 200
        # parameters); the full search then runs once, for the chosen k. k = 0 is kept unless a
        # deferral screens more than DEFER_MARGIN faster.
        cap_bytes = memory_cap_bytes(profile, defer_memory_fraction)
        k_max = max_k(profile, cap_bytes)
        ks = candidate_ks(k_max)
        chosen = 0
        decision.update(k_max=k_max, memory_cap_bytes=cap_bytes, candidates=ks)
        if k_max > 0:
            screened = {k: _search_plan(deferred_profile(profile, schedule_for(profile, k)), cluster, comm, overlap,
                                        input_spread, contention_spread, None, quick=True)[1] for k in ks}
            best_k = min(ks, key=lambda k: (screened[k], k))
            if screened[best_k] < screened[0] * (1 - DEFER_MARGIN):
                chosen = best_k
            decision["screened_s"] = {str(k): screened[k] for k in ks}
        decision["chosen"] = chosen
        plan, _ = full(chosen)
    else:
        plan, _ = full(0 if mode == "off" else mode)
    plan.options["compute_schedule"] = decision
    plan.options["branch_order"] = branch_decision
    plan.module_order = module_order
    if resized:
        plan.options["cluster_resized_from"] = resized
    return plan


def _search_plan(profile: ModelProfile, cluster: ClusterSpec, comm: CommModel, overlap: str, input_spread: float,
                 contention_spread: float, schedule: ComputeSchedule | None,
                 quick: bool = False) -> tuple[Plan, float]:
    """The plan search for one (possibly deferred) profile: the plan and its objective (the mean
    over the spread, or the step time on the inputs exactly with `input_spread=0`).

    `quick` (screening a compute schedule): stage 1 only on the inputs, then the best
    `QUICK_RESCORE` candidates scored on the spread; no plan is assembled (None)."""
    params = ready_sorted(profile)
    search = _Search(profile, cluster, comm, overlap)
    total = sum(p.bytes for p in params)
    s_half = search.s_half_bytes(total)
    s_half_queued = search.s_half_bytes(total, queued=True)

    # stage 1: groupings from caps and from the baselines, each with the three basic orders
    halves = [s_half * k for k in HALF_MULTIPLES] + [s_half_queued * k for k in HALF_MULTIPLES]
    caps = sorted({max(1.0, min(float(total), c)) for c in
                   halves + [total / k for k in MODEL_FRACTIONS] + list(FIXED_CAPS_BYTES)})
    groupings: list[Groups] = []
    for cap in caps:
        groupings.append(tuple(tuple(p.index for p in g) for g in group_by_cap(params, [max(1, int(cap))])))
    for name in ("fifo", "fusion"):
        baseline = PLANNERS[name](profile, cluster, world_size=cluster.world_size)
        groupings.append(tuple(tuple(b.params) for b in baseline.buckets))
    best_of: dict[Groups, tuple] = {}
    for groups in dict.fromkeys(groupings):
        for cand in search.basic_orders(groups):
            key = search.evaluate(cand)
            best_of[groups] = min(best_of.get(groups, key), key)

    if quick:
        if input_spread > 0:
            search.rescore(spread_scenarios(cluster, input_spread, search.comm, contention_spread), QUICK_RESCORE)
        return None, search.best_key[0]  # type: ignore[return-value]

    # stage 2: the best groupings with a sweep of k
    for groups in sorted(best_of, key=best_of.__getitem__)[:TOP_GROUPINGS]:
        nb = len(groups)
        ks = (sorted({round(i * nb / (MAX_HYBRID_KS - 1)) for i in range(MAX_HYBRID_KS)}) if nb >= MAX_HYBRID_KS
              else range(nb + 1))
        for k in ks:
            search.evaluate(search.hybrid_candidate(groups, k))

    # stage 3: local search over bucket boundaries from the best candidate
    search.local_search(LOCAL_SEARCH_EVALS)

    # stage 4: the objective becomes the mean over the input spread, and every candidate seen
    # so far (the baselines' groupings in DDP's order among them, from stage 1) is scored on it
    # again; a second local search on that mean gained nothing measurable on the saved bench
    # inputs and cost as much again, so the chunking below starts from the best of these
    if input_spread > 0:
        search.rescore(spread_scenarios(cluster, input_spread, search.comm, contention_spread))

    # stage 5: chunk the large buckets of the best candidate
    base = search.best
    for mult in CHUNK_MULTIPLES:
        chunk_cap = s_half_queued * mult  # a bucket's chunks go back to back
        chunks = tuple(_num_chunks(search.group_bytes(g), search.group_numel(g), chunk_cap) for g in base.groups)
        if chunks != base.chunks:
            search.evaluate(Candidate(base.groups, chunks, base.order_name, base.bucket_order, chunk_cap))
    best = search.best
    spread_s = (None if search.scenarios is None
                else spread_step_time_s(search._workload(best), search.scenarios, overlap, PLAN_ITERATIONS))
    plan = search.to_plan(best)
    plan.compute_schedule = schedule if schedule is not None and not schedule.empty else None
    result = simulate(profile, cluster, plan, overlap=overlap, trace=False, comm=search.comm)
    plan.predicted_step_time_s = result.step_time_s
    plan.options = {
        "overlap": overlap,
        "input_spread": input_spread,
        "contention_spread": contention_spread if input_spread > 0 else 0.0,
        "spread_step_time_s": spread_s,
        "chunk_cap_bytes": best.chunk_cap_bytes,
        "order": best.order_name,
        "candidates_evaluated": len(search._seen),
        "s_half_bytes": s_half,
        "s_half_queued_bytes": s_half_queued,
        "comm_model": search.comm.describe(),
        "cluster": {"workers": cluster.world_size, "bandwidth_bps": cluster.bandwidth_bps,
                    "latency_s": cluster.latency_s, "queued_latency_s": cluster.queued_latency_s,
                    "collective_cpu_s": cluster.collective_cpu_s,
                    "collective": cluster.collective, "topology": cluster.topology},
        "predicted": {k: getattr(result, k) for k in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_s")},
    }
    return plan, search.best_key[0]


def _check_collective_cpu_s(value: Any) -> float:
    """`collective_cpu_s` as a float, or a `CaramelError` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CaramelError(f"collective_cpu_s must be a number of seconds >= 0 (the CPU time each collective costs "
                           f"a worker's compute; 0: none), got {value!r}")
    return float(value)


def _cluster_for(cluster: ClusterSpec | None, world_size: int | None) -> tuple[ClusterSpec, dict | None]:
    """The cluster to plan for; a spec for another number of workers keeps its network, not its size."""
    if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
        raise CaramelError(f"world_size must be a positive integer, got {world_size!r}")
    if cluster is None:
        return default_cluster(world_size or 1), None
    cluster.validate()
    if world_size is None or world_size == cluster.world_size:
        return cluster, None
    resized = dataclasses.replace(cluster, workers=[WorkerSpec(f"w{i}") for i in range(world_size)], meta=dict(cluster.meta),
                                  **cluster.sharing_on(world_size))
    return resized, {"workers": cluster.world_size}
