"""How early the first-needed bucket's transfer window opens, measured from a timeline.

Without deferred weight gradients, the bucket the next forward needs first holds the first
layers' gradients, which backward produces last: its window opens as backward ends. Deferring
weight gradients (`compute_schedule`) runs the first layer's weight gradient before the other
deferred ones, so that bucket is ready while they still compute. Per step and rank:

- `lead_s`: end of the step's backward compute (its deferred work included) minus the
  first-needed bucket's `ready` event; about 0 without deferral, the window gained with it;
- `deferred_s`: the step's deferred weight-gradient time (`deferred` events).

The first-needed bucket is the plan's (`window_meta`, written into the trace's meta): the
bucket whose first use in forward comes earliest by the profile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from caramel.trace.events import Trace

BACKWARD_KINDS = ("backward", "deferred")


def window_meta(plan: Any) -> dict[str, Any]:
    """The facts about `plan` a timeline needs for window metrics: the first-needed bucket's id
    and the modules whose weight gradients it defers (in run order)."""
    timed = [b for b in plan.buckets if b.need_time_s is not None and math.isfinite(b.need_time_s)]
    first = min(timed, key=lambda b: (b.need_time_s, b.id)).id if timed else None
    schedule = getattr(plan, "compute_schedule", None)
    return {"first_needed_bucket": first, "deferred_modules": list(schedule.modules) if schedule else []}


@dataclass
class WindowLead:
    rank: int
    iteration: int
    lead_s: float
    deferred_s: float


def first_bucket_leads(trace: Trace, skip_iterations: int = 0) -> list[WindowLead]:
    """One `WindowLead` per rank and iteration that has the first-needed bucket's `ready` event
    and backward compute; [] when the trace does not name that bucket (no plan, or an old trace).
    The first `skip_iterations` iterations (profiling, planning, warm-up) are left out."""
    bucket = trace.meta.get("first_needed_bucket")
    if bucket is None:
        return []
    ready: dict[tuple[int, int], float] = {}
    bwd_end: dict[tuple[int, int], float] = {}
    deferred: dict[tuple[int, int], float] = {}
    for e in trace.events:
        key = (e.rank, e.iteration)
        if e.kind == "ready" and e.bucket == bucket:
            ready[key] = max(ready.get(key, -math.inf), e.start_s)
        elif e.lane == "compute" and e.kind in BACKWARD_KINDS:
            bwd_end[key] = max(bwd_end.get(key, -math.inf), e.end_s)
            if e.kind == "deferred":
                deferred[key] = deferred.get(key, 0.0) + e.duration_s
    first_iteration = min((it for _, it in bwd_end), default=0) + skip_iterations
    return [WindowLead(r, it, bwd_end[(r, it)] - ready[(r, it)], deferred.get((r, it), 0.0))
            for (r, it) in sorted(ready) if (r, it) in bwd_end and it >= first_iteration]


def mean_lead(trace: Trace, skip_iterations: int = 0) -> dict[str, float] | None:
    """Mean `lead_s` and `deferred_s` over the counted steps, or None without any."""
    leads = first_bucket_leads(trace, skip_iterations)
    if not leads:
        return None
    return {"first_bucket_lead_s": sum(x.lead_s for x in leads) / len(leads),
            "deferred_s": sum(x.deferred_s for x in leads) / len(leads)}
