"""A replicated stage's buckets as Caramel's engine plans them, for the pipeline simulator.

The runtime hands each stage of an equal hybrid to Caramel's engine (`replica_reduce.py`), whose
controller plans the stage's buckets, chunks and issue order with the caramel planner, from a
profile of one microbatch of that stage, for the cluster the engine is given: the pipeline gives
it none, so `default_cluster(r)` (r replicas, 1 Gbit/s, 50 us). `replica_plan` is that call,
with the engine's options (`replica_options.replica_engine_options`, the runtime's setting).

Under the spec's `reduce_buckets="planner"` the simulator reduces each replicated stage in that
plan's collectives (`planned_buckets`) instead of one bucket per layer (`overlap.stage_buckets`):
the planner is fed the stage's part of the run's profile (`stage_profile`), each module's times
scaled to one microbatch by its layer's cost at that size (the simulator's own layer costs, so
the stage profile's forward and backward are the stage's), and its collectives are priced on the
stage's real link, issued in the plan's order, each once its bucket's gradients are ready.

Simplified: a parameter's gradient is ready when the backward of the module that first uses it
ends (modules run backward in reverse forward order), and is first needed when that module's
forward starts; the profile's own per-parameter times are not carried over.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile, ready_orders
from caramel.sim.collectives import CommModel
from caramel.strategies.caramel.planner import default_cluster
from caramel.strategies.pipeline.planner import LayerCost
from caramel.strategies.pipeline.profile_costs import layer_of
from caramel.strategies.pipeline.replica_options import replica_engine_options
from caramel.strategies.pipeline.timeline import ReduceBuckets
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec

PLAN_CACHE = 256  # stage plans kept: the sharing passes replay the same stages
_CACHE: dict[tuple[str, int], "PlannedReduce"] = {}


def replica_plan(profile: ModelProfile, replicas: int, cluster: ClusterSpec | None = None) -> Plan:
    """The plan the runtime's engine makes for a stage profiled as `profile`, over `replicas`
    ranks: a copy of its controller's call (`Controller.plan_from_profile`, without its
    compression step: the engine compresses nothing) with the engine's options, for
    `cluster` or, as the pipeline gives the engine none, `default_cluster(replicas)`."""
    options = replica_engine_options()
    return make_plan(options.planner, profile, cluster or default_cluster(replicas), world_size=replicas,
                     overlap=options.overlap, **options.planner_options())


def stage_profile(profile: ModelProfile, names: list[str], costs: list[LayerCost], first: int, end: int,
                  samples: int, optimizer_s: float) -> ModelProfile:
    """The part of `profile` for the stage of top-level layers `names[first:end]`: its modules and
    the parameters first used there (re-indexed in order), each module's forward and backward
    scaled so that its layer's sum is `costs[k]` (one microbatch of `samples`); `optimizer_s`
    the stage's optimizer step. Ready and first-use times follow from the module times
    (module docstring)."""
    layer = {n: k for k, n in enumerate(names)}
    # the cumulative times below need execution order (sorted stably: a tie keeps the listed order)
    mods = sorted((m for m in profile.modules if first <= layer[layer_of(profile, m.name)] < end),
                  key=lambda m: m.forward_start_s)
    owners: dict[int, list[str]] = {}
    for m in mods:
        for i in m.params:
            owners.setdefault(i, []).append(m.name)
    shared = {i: ms for i, ms in owners.items() if len(ms) > 1}
    if shared:
        i, ms = next(iter(shared.items()))
        raise CaramelError(f"profile {profile.model!r}: parameter {i} ({profile.params[i].name}) is listed under "
                           f"modules {', '.join(ms)}; the planner's buckets expect each parameter in one module")
    fwd_sum = {k: sum(m.forward_time_s for m in mods if layer[layer_of(profile, m.name)] == k) for k in range(first, end)}
    bwd_sum = {k: sum(m.backward_time_s for m in mods if layer[layer_of(profile, m.name)] == k) for k in range(first, end)}

    def scaled(m, k):
        f = costs[k].forward_s / fwd_sum[k] if fwd_sum[k] else 0.0
        b = costs[k].backward_s / bwd_sum[k] if bwd_sum[k] else 0.0
        return m.forward_time_s * f, m.backward_time_s * b

    times = [scaled(m, layer[layer_of(profile, m.name)]) for m in mods]
    starts = list(itertools.accumulate((f for f, _ in times), initial=0.0))
    backward = sum(b for _, b in times)
    # a module's backward ends once every module after it and itself have run backward
    bwd_done = [backward - s for s in itertools.accumulate((b for _, b in times), initial=0.0)][:-1]
    old = [i for m in mods for i in m.params]
    new = {i: j for j, i in enumerate(old)}
    home = {i: k for k, m in enumerate(mods) for i in m.params}
    params = [dataclasses.replace(profile.params[i], index=new[i], ready_order=None,
                                  ready_time_s=bwd_done[home[i]] if profile.params[i].requires_grad else None,
                                  first_use_order=home[i], first_use_time_s=starts[home[i]], rows_ready_time_s=None,
                                  use_modules=[u for u in profile.params[i].use_modules if u in {m.name for m in mods}])
              for i in old]
    orders = ready_orders({p.index: p.ready_time_s for p in params if p.ready_time_s is not None})
    params = [dataclasses.replace(p, ready_order=orders.get(p.index)) for p in params]
    modules = [dataclasses.replace(m, forward_start_s=s, forward_time_s=f, backward_time_s=b,
                                   params=[new[i] for i in m.params], splittable=False, input_grad_time_s=None,
                                   weight_grad_time_s=None, small_batch_forward_time_s=None,
                                   small_batch_backward_time_s=None)
               for m, (f, b), s in zip(mods, times, starts)]
    return ModelProfile(f"{profile.model}[{names[first]}:{names[end - 1]}]", max(1, int(round(samples))),
                        starts[-1], backward, optimizer_s, params, modules)


@dataclass(frozen=True)
class PlannedReduce:
    """A stage's plan as the simulator replays it, at the stage's profile's speed: per collective
    (a bucket's chunk) in issue order, its bytes, the backward done when its bucket's gradients
    are all ready and the forward done before its parameters are first used; and the plan's
    bucket count."""

    nbytes: list[int]
    ready_s: list[float]
    need_s: list[float]
    buckets: int


def plan_reduce(profile: ModelProfile, replicas: int) -> PlannedReduce:
    """`replica_plan` of a stage profile as collectives (cached on the profile's content)."""
    key = hashlib.sha256(json.dumps(profile.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    return _plan_reduce(key, profile, replicas)


def _plan_reduce(key: str, profile: ModelProfile, replicas: int) -> PlannedReduce:
    # keyed by the profile's hash (a ModelProfile is not hashable); the oldest entry goes first
    hit = _CACHE.get((key, replicas))
    if hit is None:
        hit = _CACHE[(key, replicas)] = _collectives(profile, replica_plan(profile, replicas))
        if len(_CACHE) > PLAN_CACHE:
            _CACHE.pop(next(iter(_CACHE)))
    return hit


def _collectives(profile: ModelProfile, plan: Plan) -> PlannedReduce:
    """The plan's (bucket, chunk) collectives in issue order, timed from the stage profile."""
    by_index = {p.index: p for p in profile.params}
    nbytes, ready, need = [], [], []
    for b, c in plan.order:
        bucket = plan.buckets[b]
        ps = [by_index[i] for i in bucket.params]
        nbytes.append(bucket.chunk_bytes(c))
        ready.append(max(p.ready_time_s or 0.0 for p in ps))
        need.append(min(p.first_use_time_s or 0.0 for p in ps))
    return PlannedReduce(nbytes, ready, need, len(plan.buckets))


def planned_buckets(planned: PlannedReduce, speed: float, replicas: int, cluster: ClusterSpec,
                    update_s: float, cpu_per_bucket_s: float) -> ReduceBuckets:
    """`planned` as the overlapped replay's `ReduceBuckets` for a stage at `speed`: each
    collective priced over the stage's `replicas` on the spec's link (queued behind the previous
    one as `overlap.stage_buckets` prices it), `update_s` shared by bytes, `cpu_per_bucket_s`
    per bucket of the plan."""
    ring = ClusterSpec.uniform(replicas, cluster.bandwidth_bps, cluster.latency_s,
                               queued_latency_s=cluster.queued_latency_s)
    comm = CommModel(ring, mode="closed")
    total = sum(planned.nbytes)
    first_transfer = [comm.transfer_s(b) for b in planned.nbytes]
    return ReduceBuckets([comm.time_s(b) for b in planned.nbytes],
                         [r / speed for r in planned.ready_s],
                         [n / speed for n in planned.need_s],
                         [update_s * b / total if total else 0.0 for b in planned.nbytes],
                         [comm.time_s(b, after_transfer_s=t)
                          for b, t in zip(planned.nbytes, [0.0, *first_transfer[:-1]])],
                         planned.buckets * cpu_per_bucket_s, bucket_count=planned.buckets)
