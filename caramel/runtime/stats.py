"""What the engine reports: step counters and times, the controller's notes, and the link
bandwidth its own collectives imply.

The numbers live apart from the engine so that the controller can record what it measured and
decided (`EngineStats.note`, `count_replan`, `log`) without reaching into the engine, and so
that the bandwidth estimate is a plain function of a completion log, testable without a group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from caramel.plan.costs import fixed_cost_s, hidden_transfer_s
from caramel.plan.plan import Plan


@dataclass
class EngineStats:
    step: int = 0
    last_wait_s: float = 0.0
    last_step_s: float | None = None
    """the last step's period, from the previous `step()` to this one; None until a step has one (a
    process's first step, a resumed run's included, has no previous step to time from)"""
    total_wait_s: float = 0.0
    replans: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, **values: Any) -> None:
        """Record measured or decided values under `extra` (shown by `stats_dict` and reports)."""
        self.extra.update(values)

    def count(self, key: str) -> None:
        """Count one more event of kind `key` under `extra`."""
        self.extra[key] = self.extra.get(key, 0) + 1

    def log(self, key: str, entry: dict[str, Any]) -> None:
        """Append `entry` to the list under `extra[key]`."""
        self.extra.setdefault(key, []).append(entry)

    def count_replan(self) -> None:
        self.replans += 1


def bandwidth_from_log(log: Iterable[tuple[float, float, int]], world_size: int, latency_s: float,
                       queued_latency_s: float | None = None) -> float | None:
    """Link bandwidth implied by completed all-reduces `(issue_s, done_s, nbytes)` (ring model).

    A collective's transfer starts at its issue or when the previous one finished, whichever is
    later, as the backend runs them one at a time. One that waited for the previous one pays the
    simulator's queued cost (`caramel.sim.collectives`): the lone latency less what was left of
    the previous transfer, at least `queued_latency_s` per message (`latency_s` when None).
    None if too little was sent to tell.
    """
    log = sorted(log, key=lambda e: e[1])
    n = world_size
    if n < 2 or not log:
        return None
    steps = 2 * (n - 1)
    lone = steps * latency_s
    queued = steps * (latency_s if queued_latency_s is None else queued_latency_s)
    total_bits, total_s, prev_done, prev_transfer = 0.0, 0.0, 0.0, 0.0
    for issue, done, nbytes in log:
        start = max(issue, prev_done)
        dur = done - start - fixed_cost_s(lone, queued, hidden_transfer_s(issue, prev_done, prev_transfer))
        prev_done, prev_transfer = done, max(dur, 0.0)
        if dur > 0:
            total_bits += 2 * (n - 1) / n * nbytes * 8
            total_s += dur
    if total_s < 1e-3:
        return None
    return total_bits / total_s


def plan_summary(plan: Plan | None) -> dict[str, Any] | None:
    """What the running plan is and what it was made for (None without a plan)."""
    if plan is None:
        return None
    cluster = plan.options.get("cluster", {})
    return {"planner": plan.planner, "order": plan.options.get("order"),
            "bucket_bytes": [b.bytes for b in plan.buckets], "items": len(plan.order),
            "predicted_step_time_s": plan.predicted_step_time_s,
            "bandwidth_bps": cluster.get("bandwidth_bps"), "latency_s": cluster.get("latency_s"),
            "queued_latency_s": cluster.get("queued_latency_s"),
            "collective_cpu_s": cluster.get("collective_cpu_s"),
            "deferred_modules": list(plan.compute_schedule.modules) if plan.compute_schedule else [],
            "compute_schedule": plan.options.get("compute_schedule")}
