"""What the simulator replays: a profile and a plan reduced to per-bucket times and items.

Times are on the profiled worker (speed 1.0). Missing timings fall back sensibly, so a profile
with only sizes and orders (or nothing but sizes) still plans and simulates:
- a gradient-ready time that is missing is interpolated from its ready order over the backward
  pass, or, with no order either, put at the end of backward;
- a first-use time that is missing comes from its module's forward start, or is interpolated
  from the module's position over the forward pass, or is put at the end of forward (a
  parameter not used in forward is applied then).
"""
from __future__ import annotations

from dataclasses import dataclass

from caramel.errors import MismatchError
from caramel.plan.branch_order import reordered_profile
from caramel.plan.compute_schedule import profile_for_plan
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile, ParamInfo


@dataclass(frozen=True)
class BucketLoad:
    """One bucket as the simulator sees it."""

    id: int
    bytes: int
    ready_s: float  # last gradient ready, from backward start
    need_s: float  # first use in forward, from forward start
    apply_s: float  # optimizer cost of applying this bucket


@dataclass(frozen=True)
class Item:
    """One collective of the plan's issue order."""

    bucket: int
    chunk: int
    bytes: int


@dataclass(frozen=True)
class Workload:
    forward_s: float
    backward_s: float
    optimizer_s: float
    buckets: tuple[BucketLoad, ...]
    items: tuple[Item, ...]  # in plan issue order
    need_order: tuple[int, ...]  # bucket ids in the order forward needs them

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def total_bytes(self) -> int:
        return sum(b.bytes for b in self.buckets)


def param_ready_s(profile: ModelProfile) -> dict[int, float]:
    """Gradient-ready time from backward start per trainable parameter, with fallbacks."""
    params = profile.trainable()
    orders = [p.ready_order for p in params if p.ready_order is not None]
    span = (max(orders) + 1) if orders else 1
    out = {}
    for p in params:
        if p.ready_time_s is not None:
            t = p.ready_time_s
        elif p.ready_order is not None:
            t = profile.backward_time_s * (p.ready_order + 1) / span
        else:
            t = profile.backward_time_s
        out[p.index] = min(max(float(t), 0.0), profile.backward_time_s)
    return out


def param_need_s(profile: ModelProfile) -> dict[int, float]:
    """First-use time from forward start per trainable parameter, with fallbacks."""
    n_mod = len(profile.modules)
    out = {}
    for p in profile.trainable():
        t = _need(profile, p, n_mod)
        out[p.index] = min(max(float(t), 0.0), profile.forward_time_s)
    return out


def _need(profile: ModelProfile, p: ParamInfo, n_mod: int) -> float:
    if p.first_use_time_s is not None:
        return p.first_use_time_s
    if p.first_use_order is not None and 0 <= p.first_use_order < n_mod:
        m = profile.modules[p.first_use_order]
        if m.forward_start_s is not None and (m.forward_start_s > 0 or p.first_use_order == 0):
            return m.forward_start_s
        return profile.forward_time_s * p.first_use_order / n_mod
    return profile.forward_time_s


def check_plan_matches(profile: ModelProfile, plan: Plan) -> None:
    """Raise `MismatchError` naming the field when the plan was not made for this profile's model."""
    names = [p.name for p in profile.params]
    plan.check_model(profile.fingerprint(), names, source="plan.model_fingerprint")
    trainable = {p.index for p in profile.trainable()}
    covered: set[int] = set()
    for b in plan.buckets:
        for i in b.params:
            if i not in trainable:
                raise MismatchError(f"plan.buckets[{b.id}].params: parameter {names[i]!r} has no gradient in the profile")
            covered.add(i)
        want = sum(profile.params[i].bytes for i in b.params)
        if want != b.bytes:
            raise MismatchError(f"plan.buckets[{b.id}].bytes is {b.bytes}, but its parameters have {want} bytes in the profile")
    missing = sorted(trainable - covered)
    if missing:
        raise MismatchError(f"plan.buckets: trainable parameter {names[missing[0]]!r} is in no bucket ({len(missing)} missing)")


def make_workload(profile: ModelProfile, buckets: list[BucketLoad], items: list[Item]) -> Workload:
    """A workload from buckets and items already derived (the planner builds candidates this way)."""
    need_order = tuple(sorted(range(len(buckets)), key=lambda i: (buckets[i].need_s, i)))
    return Workload(profile.forward_time_s, profile.backward_time_s, profile.optimizer_time_s,
                    tuple(buckets), tuple(items), need_order)


def build_workload(profile: ModelProfile, plan: Plan) -> Workload:
    """Reduce a profile and a matching plan to what the event engine replays: the measured
    profile as the plan's compute schedule changes it (deferred weight gradients), if it has one."""
    check_plan_matches(profile, plan)
    plan.validate("plan")
    if plan.module_order is not None:
        profile = reordered_profile(profile, plan.module_order)
    profile = profile_for_plan(profile, plan.compute_schedule)
    ready = param_ready_s(profile)
    need = param_need_s(profile)
    total = plan.total_bytes() or 1
    buckets = [
        BucketLoad(
            id=b.id,
            bytes=b.bytes,
            ready_s=max(ready[i] for i in b.params) if b.params else 0.0,
            need_s=min(need[i] for i in b.params) if b.params else profile.forward_time_s,
            apply_s=profile.optimizer_time_s * b.bytes / total,
        )
        for b in plan.buckets
    ]
    items = [Item(bk, c, plan.buckets[bk].chunk_bytes(c)) for bk, c in plan.order]
    return make_workload(profile, buckets, items)
