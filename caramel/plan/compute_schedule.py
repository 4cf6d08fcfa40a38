"""Computation scheduling, the offline half: which weight gradients backward defers, and what that does.

Backward computes each layer's input and weight gradients together, last layer first, so the
first layers' gradients, the ones the next forward needs first, exist last. With a split
backward (`caramel.profile.split_backward`) the modules nearest the input compute only their
input gradients in backward; their weight gradients then run first layer first, so the first
layers' gradients exist earlier and their transfers start while later layers' weight gradients
are still computed. A `ComputeSchedule` names those modules; `deferred_profile` is the profile
a backward with that deferral produces, which the planner and the simulator replay like any
other; the memory it costs is `ComputeSchedule.extra_bytes`, capped by default at
`DEFAULT_MEMORY_FRACTION` of an estimate of the undeferred peak.

The rule (`deferred_profile`), for the deferred region: the modules from the input up to the
last deferred one, in forward order.

- Modules after the region, and every parameter outside the region's modules, keep their
  measured ready times.
- The region's backward starts at T0 = (the latest measured ready time of its parameters, a
  tied weight's rows counted) - (the sum of its modules' `backward_time_s`), as measured. From T0, going from the region's
  last module to its first: a deferred module computes its input gradient
  (`input_grad_time_s`); any other module there runs its whole backward and its parameters are
  ready when it ends. Then the deferred weight gradients run in the schedule's order (first
  layer first), each module's parameters ready when its `weight_grad_time_s` ends.
- A deferred module's two parts are scaled to sum to its `backward_time_s`, so the region ends
  when it did and the total backward time is unchanged.
- A tied embedding's weight (`ParamInfo.rows_ready_time_s` set) keeps its ready time and its
  rows logic untouched: a module holding such a weight is never deferred, and that weight is
  never moved (its rows are gathered at the end of backward either way).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ready_orders

COMPUTE_SCHEDULE_MODES = ("auto", "off")
DEFAULT_MEMORY_FRACTION = 0.10  # extra bytes a deferral may keep alive, as a share of the undeferred peak estimate
META_KEY = "compute_schedule"  # in a deferred profile's meta: the schedule it was made with


@dataclass
class ComputeSchedule:
    """Deferred weight gradients: which modules, in which order their weight gradients run.

    JSON (inside a Plan): `{"k": 2, "modules": ["embed", "fc1"], "extra_bytes": 40960}`.
    """

    k: int  # how many splittable modules, counted from the input end, are deferred
    modules: list[str] = field(default_factory=list)  # their names, in run order (forward order: first layer first)
    extra_bytes: int = 0  # memory the deferral keeps alive longer: the sum of their ModuleInfo.deferred_bytes

    @property
    def empty(self) -> bool:
        return not self.modules

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "modules": list(self.modules), "extra_bytes": self.extra_bytes}


def check_compute_schedule(value: Any) -> str | int:
    """`value` as given when it is "auto", "off" or an integer k >= 0, else one `CaramelError` naming the option."""
    if isinstance(value, str) and value in COMPUTE_SCHEDULE_MODES:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise CaramelError(f"compute_schedule must be 'auto' (the planner decides), 'off' (no deferred weight gradients) "
                       f"or an integer k >= 0 (defer the weight gradients of the k splittable modules nearest the "
                       f"input), got {value!r}")


# -- which modules can be deferred

def _deferral_blocker(profile: ModelProfile, module: ModuleInfo) -> str | None:
    """Why `module`'s weight gradient cannot be deferred, or None when it can."""
    if not module.splittable:
        return "not splittable (or not measured split)"
    if module.input_grad_time_s is None or module.weight_grad_time_s is None or module.deferred_bytes is None:
        return "its split backward was not measured"
    if not module.params:
        return "it has no parameters of its own"
    for i in module.params:
        p = profile.params[i]
        if p.rows_ready_time_s is not None:
            return f"{p.name} is a tied embedding's weight, whose rows travel apart"
        if p.requires_grad and p.ready_time_s is None:
            return f"{p.name} has no measured ready time"
    return None


def deferrable_modules(profile: ModelProfile) -> list[int]:
    """Indices into `profile.modules` of the modules whose weight gradients can be deferred, in
    forward order: splittable, split times and bytes measured, no tied-embedding weight."""
    return [m for m, info in enumerate(profile.modules) if _deferral_blocker(profile, info) is None]


def schedule_for(profile: ModelProfile, k: int) -> ComputeSchedule:
    """Defer the first `k` deferrable modules from the input end (k = 0: nothing deferred)."""
    k = check_compute_schedule(k)
    if not isinstance(k, int):
        raise CaramelError(f"schedule_for needs an integer k, got {k!r}")
    mods = deferrable_modules(profile)
    if k > len(mods):
        raise CaramelError(f"compute_schedule={k} asks to defer {k} modules' weight gradients, but profile "
                           f"{profile.model!r} has {len(mods)} splittable modules with a measured split backward "
                           f"(profile it with `caramel profile`; a tied embedding's modules are never deferred)")
    chosen = mods[:k]
    return ComputeSchedule(k=k, modules=[profile.modules[m].name for m in chosen],
                           extra_bytes=sum(profile.modules[m].deferred_bytes or 0 for m in chosen))


# -- memory

def extra_bytes(profile: ModelProfile, schedule: ComputeSchedule) -> int:
    """Bytes the schedule keeps alive longer: the sum of the deferred modules' `deferred_bytes`."""
    by_name = {m.name: m for m in profile.modules}
    return sum(by_name[n].deferred_bytes or 0 for n in schedule.modules if n in by_name)


def undeferred_peak_bytes(profile: ModelProfile) -> int:
    """An estimate of one step's peak memory without deferral: parameter bytes + gradient bytes +
    every module's input-activation bytes (`ModuleInfo.input_bytes`, 0 where unknown).

    An estimate, and a coarse one: it stands for what backward holds when it starts (parameters,
    the gradients it is about to fill, and the input most layers save for their backward). It
    leaves out optimizer state, outputs some ops save instead of inputs (ReLU, softmax),
    temporaries and the allocator's slack, and counts an input seen by several modules once per
    module. It only gives the cap on deferral a scale: it is not a prediction of the peak."""
    params = sum(p.bytes for p in profile.params)
    grads = sum(p.bytes for p in profile.trainable())
    return params + grads + sum(m.input_bytes or 0 for m in profile.modules)


def memory_cap_bytes(profile: ModelProfile, fraction: float = DEFAULT_MEMORY_FRACTION) -> int:
    """The most extra bytes a chosen deferral may keep alive: `fraction` of the undeferred peak estimate."""
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and fraction >= 0):
        raise CaramelError(f"the memory fraction for deferred weight gradients must be a number >= 0, got {fraction!r}")
    return int(fraction * undeferred_peak_bytes(profile))


def max_k(profile: ModelProfile, cap_bytes: int | None = None) -> int:
    """K: the most deferrable modules, from the input end, whose extra bytes fit `cap_bytes`
    (default `memory_cap_bytes(profile)`)."""
    cap = memory_cap_bytes(profile) if cap_bytes is None else cap_bytes
    total, k = 0, 0
    for m in deferrable_modules(profile):
        total += profile.modules[m].deferred_bytes or 0
        if total > cap:
            break
        k += 1
    return k


def candidate_ks(k_max: int) -> list[int]:
    """The k the planner tries: 0, 1, 2, 4, 8, ... and k_max itself (log-many, so planning stays cheap)."""
    ks, k = {0, k_max}, 1
    while k < k_max:
        ks.add(k)
        k *= 2
    return sorted(ks)


# -- the transform

def _region(profile: ModelProfile, schedule: ComputeSchedule) -> tuple[int, dict[int, int]]:
    """(index of the region's last module, module index -> its position in the run order), checked."""
    index = {m.name: i for i, m in enumerate(profile.modules)}
    position: dict[int, int] = {}
    for pos, name in enumerate(schedule.modules):
        if name not in index:
            raise CaramelError(f"compute schedule defers module {name!r}, which profile {profile.model!r} does not have")
        m = index[name]
        if m in position:
            raise CaramelError(f"compute schedule defers module {name!r} twice")
        why = _deferral_blocker(profile, profile.modules[m])
        if why is not None:
            raise CaramelError(f"compute schedule defers module {name!r}, whose weight gradient cannot be deferred: {why}")
        position[m] = pos
    return max(position), position


def _split(m: ModuleInfo) -> tuple[float, float]:
    """(input-gradient, weight-gradient) seconds of a deferred module, scaled to sum to its backward time."""
    i, w = max(m.input_grad_time_s or 0.0, 0.0), max(m.weight_grad_time_s or 0.0, 0.0)
    if i + w <= 0:
        return m.backward_time_s, 0.0
    scale = m.backward_time_s / (i + w)
    return i * scale, w * scale


def _moves(profile: ModelProfile, m: ModuleInfo) -> list[int]:
    """The parameters of module `m` whose ready time the deferral moves (not a tied embedding's weight)."""
    return [i for i in m.params if profile.params[i].ready_time_s is not None and profile.params[i].rows_ready_time_s is None]


def _done_s(profile: ModelProfile, i: int) -> float | None:
    """When parameter i's whole gradient was ready as measured (a tied weight's: when its rows were)."""
    p = profile.params[i]
    return p.rows_ready_time_s if p.rows_ready_time_s is not None else p.ready_time_s


def deferred_profile(profile: ModelProfile, schedule: ComputeSchedule) -> ModelProfile:
    """The profile a backward deferring `schedule`'s weight gradients produces (module docstring's
    rule): new `ready_time_s` and `ready_order` for the region's parameters, everything else
    shared with `profile` (which is not changed). `profile` itself when nothing is deferred, or
    when it already is this schedule's deferred profile."""
    if schedule.empty or profile.meta.get(META_KEY) == schedule.to_dict():
        return profile
    if profile.meta.get(META_KEY) is not None:
        raise CaramelError(f"profile {profile.model!r} is already deferred by another compute schedule "
                           f"({profile.meta[META_KEY]}); defer the measured profile instead")
    last, position = _region(profile, schedule)
    region = profile.modules[:last + 1]
    end = max(_done_s(profile, i) for m in region for i in m.params if _done_s(profile, i) is not None)
    t = max(end - sum(m.backward_time_s for m in region), 0.0)
    ready: dict[int, float] = {}
    for m_idx in range(last, -1, -1):  # input gradients, last module first
        m = profile.modules[m_idx]
        if m_idx in position:
            t += _split(m)[0]
        else:
            t += m.backward_time_s
            ready.update((i, t) for i in _moves(profile, m))
    for m_idx in sorted(position, key=position.__getitem__):  # deferred weight gradients, in run order
        m = profile.modules[m_idx]
        t += _split(m)[1]
        ready.update((i, t) for i in _moves(profile, m))
    params = [dataclasses.replace(p, ready_time_s=ready.get(p.index, p.ready_time_s)) for p in profile.params]
    orders = ready_orders({p.index: p.ready_time_s for p in params if p.ready_time_s is not None})
    for p in params:
        p.ready_order = orders.get(p.index)
    meta = dict(profile.meta)
    meta[META_KEY] = schedule.to_dict()
    return dataclasses.replace(profile, params=params, meta=meta)


def deferred_profile_reference(profile: ModelProfile, schedule: ComputeSchedule) -> ModelProfile:
    """The same transform, written as plainly as possible (a deep copy and an explicit list of
    backward tasks), to check `deferred_profile` against."""
    out = copy.deepcopy(profile)
    if not schedule.modules:
        return out
    names = [m.name for m in out.modules]
    deferred = [names.index(n) for n in schedule.modules]
    last = max(deferred)
    tied = {p.index for p in out.params if p.rows_ready_time_s is not None}
    tasks: list[tuple[float, list[int]]] = []  # (seconds, parameters ready when it ends), in execution order
    for m_idx in reversed(range(last + 1)):
        m = out.modules[m_idx]
        if m_idx in deferred:
            i, w = m.input_grad_time_s, m.weight_grad_time_s
            total = i + w
            tasks.append((m.backward_time_s * i / total if total > 0 else m.backward_time_s, []))
        else:
            tasks.append((m.backward_time_s, [p for p in m.params if p not in tied]))
    for m_idx in deferred:
        m = out.modules[m_idx]
        i, w = m.input_grad_time_s, m.weight_grad_time_s
        total = i + w
        tasks.append((m.backward_time_s * w / total if total > 0 else 0.0, [p for p in m.params if p not in tied]))
    done = [out.params[p].rows_ready_time_s if p in tied else out.params[p].ready_time_s
            for m in out.modules[:last + 1] for p in m.params]
    t = max(d for d in done if d is not None) - sum(m.backward_time_s for m in out.modules[:last + 1])
    t = max(t, 0.0)
    for seconds, ps in tasks:
        t += seconds
        for p in ps:
            if out.params[p].ready_time_s is not None:
                out.params[p].ready_time_s = t
    orders = ready_orders({p.index: p.ready_time_s for p in out.params if p.ready_time_s is not None})
    for p in out.params:
        p.ready_order = orders.get(p.index)
    out.meta[META_KEY] = schedule.to_dict()
    return out


def profile_for_plan(profile: ModelProfile, schedule: ComputeSchedule | None) -> ModelProfile:
    """The profile a plan with `schedule` (`Plan.compute_schedule`) replays: `profile` deferred by
    it, or `profile` itself when the plan defers nothing (or the profile already is deferred so)."""
    return profile if schedule is None else deferred_profile(profile, schedule)


def window_table(profile: ModelProfile, schedule: ComputeSchedule) -> list[tuple[int, float, float]]:
    """(parameter index, window without deferral, window with it) in seconds, per trainable parameter."""
    before = {w.param: w.length_s for w in profile.windows("forward")}
    after = {w.param: w.length_s for w in deferred_profile(profile, schedule).windows("forward")}
    return [(i, before[i], after[i]) for i in before]
