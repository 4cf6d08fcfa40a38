"""Planners: `ModelProfile` + `ClusterSpec` -> `Plan`. One registry, `PLANNERS`.

- `fifo`: what DDP does. Parameters in gradient-ready order (reverse registration order when
  no timing is known), cut into buckets at a fixed cap (`bucket_cap_mb`, 25 by default; the
  first bucket 1 MB, as DDP does), issued in the order they fill.
- `fusion`: what Horovod does. Gradients that become ready within one cycle
  (`cycle_time_ms`) are fused, up to a fixed threshold (`fusion_threshold_mb`).
- `caramel`: window-aware batching, chunking and priority, chosen by simulation; it lives with
  its strategy (`caramel.strategies.caramel.planner`) and registers here.
`caramel.strategies.planners.make_plan` runs any of them by name.
"""
from __future__ import annotations

from typing import Any, Callable

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.plan.compute_schedule import ComputeSchedule, check_compute_schedule, profile_for_plan, schedule_for
from caramel.plan.plan import Bucket, Plan
from caramel.profile.model_profile import ModelProfile, ParamInfo

PlannerFn = Callable[..., Plan]
PLANNERS: dict[str, PlannerFn] = {}

MB = 1024 * 1024


def register_planner(name: str):
    def deco(fn: PlannerFn) -> PlannerFn:
        assert name not in PLANNERS, f"planner {name} registered twice"
        PLANNERS[name] = fn
        return fn
    return deco


def ready_sorted(profile: ModelProfile) -> list[ParamInfo]:
    """Trainable parameters in the order their gradients become ready (unknown ones last, reverse index)."""
    params = profile.trainable()
    known = sorted((p for p in params if p.ready_order is not None), key=lambda p: (p.ready_order, -p.index))
    unknown = sorted((p for p in params if p.ready_order is None), key=lambda p: -p.index)
    return known + unknown


def make_bucket(bucket_id: int, params: list[ParamInfo], profile: ModelProfile, num_chunks: int = 1) -> Bucket:
    """A bucket over `params` (one dtype), with its wait point and ready time from the profile."""
    dtypes = {p.dtype for p in params}
    assert len(dtypes) == 1, f"bucket {bucket_id} mixes dtypes {dtypes}"
    uses = [(p.first_use_time_s, p.first_use_order) for p in params if p.first_use_order is not None]
    need_time, need_order = min(uses) if uses else (None, None)
    need_module = profile.modules[need_order].name if need_order is not None and need_order < len(profile.modules) else None
    readies = [p.ready_time_s for p in params if p.ready_time_s is not None]
    numel = sum(p.numel for p in params)
    return Bucket(
        id=bucket_id,
        params=[p.index for p in params],
        dtype=params[0].dtype,
        numel=numel,
        bytes=sum(p.bytes for p in params),
        num_chunks=max(1, min(num_chunks, numel)),
        need_module=need_module,
        need_time_s=need_time,
        ready_time_s=max(readies) if len(readies) == len(params) else None,
    )


def group_by_cap(params: list[ParamInfo], caps_bytes: list[int]) -> list[list[ParamInfo]]:
    """Cut an ordered parameter list into groups: a group closes once it reaches its cap
    (caps_bytes[i] for the i-th group, the last cap repeating) or the dtype changes."""
    groups: list[list[ParamInfo]] = []
    cur: list[ParamInfo] = []
    size = 0
    for p in params:
        if cur and p.dtype != cur[0].dtype:
            groups.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.bytes
        cap = caps_bytes[min(len(groups), len(caps_bytes) - 1)]
        if size >= cap:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    return groups


def plan_from_groups(name: str, profile: ModelProfile, world_size: int, groups: list[list[ParamInfo]],
                     chunks: list[int] | None = None, order: list[tuple[int, int]] | None = None,
                     options: dict[str, Any] | None = None) -> Plan:
    """Assemble a Plan; default issue order is bucket by bucket, chunk by chunk."""
    chunks = chunks or [1] * len(groups)
    buckets = [make_bucket(i, g, profile, c) for i, (g, c) in enumerate(zip(groups, chunks))]
    if order is None:
        order = [(b.id, c) for b in buckets for c in range(b.num_chunks)]
    plan = Plan(
        planner=name,
        world_size=world_size,
        model_fingerprint=profile.fingerprint(),
        param_names=[p.name for p in profile.params],
        buckets=buckets,
        order=order,
        options=dict(options or {}),
    )
    plan.validate()
    return plan


def forced_schedule(profile: ModelProfile, compute_schedule: str | int) -> ComputeSchedule | None:
    """The compute schedule of a planner that does not choose one (`fifo`, `fusion`): none for
    "auto" and "off" (DDP and Horovod defer nothing), the first k deferrable modules for an int k."""
    value = check_compute_schedule(compute_schedule)
    if isinstance(value, str) or value == 0:
        return None
    return schedule_for(profile, value)


def _with_schedule(plan: Plan, schedule: ComputeSchedule | None) -> Plan:
    plan.compute_schedule = schedule
    if schedule is not None:
        plan.options["compute_schedule"] = schedule.k
    return plan


@register_planner("fifo")
def plan_fifo(profile: ModelProfile, cluster: ClusterSpec | None = None, world_size: int | None = None,
              bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0, compute_schedule: str | int = "auto",
              **unused: Any) -> Plan:
    """DDP's plan: ready order, fixed cap (first bucket smaller), issue as buckets fill.
    `compute_schedule=k` defers the first k splittable modules' weight gradients (the buckets
    follow the ready order that produces); "auto" and "off" defer nothing."""
    _check_positive(bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb)
    schedule = forced_schedule(profile, compute_schedule)
    profile = profile_for_plan(profile, schedule)
    groups = group_by_cap(ready_sorted(profile), [int(first_bucket_mb * MB), int(bucket_cap_mb * MB)])
    return _with_schedule(plan_from_groups("fifo", profile, _world(cluster, world_size), groups,
                                           options={"bucket_cap_mb": bucket_cap_mb, "first_bucket_mb": first_bucket_mb}),
                          schedule)


@register_planner("fusion")
def plan_fusion(profile: ModelProfile, cluster: ClusterSpec | None = None, world_size: int | None = None,
                fusion_threshold_mb: float = 64.0, cycle_time_ms: float = 5.0, compute_schedule: str | int = "auto",
                **unused: Any) -> Plan:
    """Horovod's plan: fuse what is ready within one cycle, up to a fixed threshold.
    `compute_schedule` as for `fifo`: an int k is forced, "auto" and "off" defer nothing."""
    _check_positive(fusion_threshold_mb=fusion_threshold_mb, cycle_time_ms=cycle_time_ms)
    schedule = forced_schedule(profile, compute_schedule)
    profile = profile_for_plan(profile, schedule)
    cap = int(fusion_threshold_mb * MB)
    cycle = cycle_time_ms / 1000.0
    groups: list[list[ParamInfo]] = []
    cur: list[ParamInfo] = []
    size, cycle_end = 0, None
    for p in ready_sorted(profile):
        t = p.ready_time_s if p.ready_time_s is not None else profile.backward_time_s
        if cur and (p.dtype != cur[0].dtype or size + p.bytes > cap or (cycle_end is not None and t > cycle_end)):
            groups.append(cur)
            cur, size, cycle_end = [], 0, None
        if cycle_end is None:
            cycle_end = (int(t / cycle) + 1) * cycle
        cur.append(p)
        size += p.bytes
    if cur:
        groups.append(cur)
    return _with_schedule(plan_from_groups("fusion", profile, _world(cluster, world_size), groups,
                                           options={"fusion_threshold_mb": fusion_threshold_mb,
                                                    "cycle_time_ms": cycle_time_ms}),
                          schedule)


def _world(cluster: ClusterSpec | None, world_size: int | None) -> int:
    if world_size is not None:
        return world_size
    return cluster.world_size if cluster is not None else 1


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and v > 0):
            raise CaramelError(f"{name} must be a positive number, got {v!r}")
