"""`simulate(profile, cluster, plan)`: predicted step time, a summary, and a predicted Trace.

The summary uses the project's metrics (shared/DESIGN.md): step time, compute time (no
communication), communication time (collectives alone), exposed communication (step time
minus compute time), link utilization, and what bounds the critical path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.plan.plan import OVERLAPS, Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.collectives import CommModel
from caramel.sim.compression import compress_workload
from caramel.sim.jitter import JITTER_STEPS, forward_pauses_s, job_steps_s, jitter_summary
from caramel.sim.event_loop import run_engine, steady_period_s, summarize_critical_path, trace_events
from caramel.sim.workload import Workload, build_workload
from caramel.trace.events import Trace

FULL_TRACE_MAX_WORKERS = 64  # above this, the trace holds one rank per distinct worker speed


@dataclass
class SimResult:
    """What one simulation predicts. Times are seconds per training step, in steady state."""

    step_time_s: float
    compute_time_s: float  # forward + backward + optimizer on the slowest worker, no communication
    comm_time_s: float  # every collective of one step back to back, nothing else running
    exposed_comm_s: float  # step_time_s - compute_time_s
    wait_time_s: float  # mean time a worker is blocked on communication per step
    link_utilization: float  # fraction of the step the links spend transferring (bandwidth part of comm)
    comm_busy_fraction: float  # fraction of the step some collective is in flight
    iteration_times_s: list[float]
    critical_path: dict[str, Any]
    planner: str
    overlap: str
    world_size: int
    num_items: int
    trace: Trace | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Everything but the trace, as JSON-ready data."""
        return {
            "planner": self.planner, "overlap": self.overlap, "workers": self.world_size, "items": self.num_items,
            "step_time_s": self.step_time_s, "compute_time_s": self.compute_time_s, "comm_time_s": self.comm_time_s,
            "exposed_comm_s": self.exposed_comm_s, "wait_time_s": self.wait_time_s,
            "link_utilization": self.link_utilization, "comm_busy_fraction": self.comm_busy_fraction,
            "iteration_times_s": list(self.iteration_times_s), "critical_path": dict(self.critical_path),
            "meta": dict(self.meta),
        }


def _busy_fraction(run, step_s: float) -> float:
    """Fraction of the last step's period some collective of it is in flight (the backend runs
    them one at a time, so their intervals do not overlap)."""
    if step_s <= 0 or not run.comm_start_s:
        return 0.0
    busy = sum(e - s for s, e in zip(run.comm_start_s[-1], run.comm_end_s[-1]))
    return min(busy / step_s, 1.0)


def check_overlap(overlap: str) -> None:
    if overlap not in OVERLAPS:
        raise CaramelError(f"overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")


def predict_step_time_s(work: Workload, cluster: ClusterSpec, comm: CommModel, overlap: str = "forward",
                        iterations: int = 4, compute_slowdown: float | None = None) -> float:
    """Steady-state step time only, for a prebuilt workload: the planner's fast path (no checks, no
    trace); `compute_slowdown` None takes the cluster's, as `simulate` does."""
    f = cluster.compute_slowdown if compute_slowdown is None else compute_slowdown
    run = run_engine(work, [w.speed for w in cluster.workers], comm, overlap, iterations, record=False,
                     compute_slowdown=f)
    return max(steady_period_s(ln) for ln in run.timelines)


def simulate(profile: ModelProfile, cluster: ClusterSpec, plan: Plan, overlap: str = "forward",
             iterations: int = 4, *, trace: bool = True, trace_ranks: list[int] | None = None,
             comm: CommModel | str = "message", compute_slowdown: float | None = None) -> SimResult:
    """Predict how `plan` runs for `profile` on `cluster`.

    `iterations` steps are unrolled (at least 2 for a steady state that includes the overlap
    with the next forward). `comm` is "message" (message-level collectives with max-min fair
    link sharing), "closed" (closed forms), or a prebuilt `CommModel` for this cluster (the
    planner reuses one across candidates). The trace holds every rank up to
    64 workers, else one rank per distinct worker speed, unless `trace_ranks` says otherwise.
    `compute_slowdown` (>= 1) is how much slower compute runs while a collective is in flight
    (CPU contention; `experiments.validation.calibrate.measure_slowdown` measures it for a model);
    None takes the cluster's (`ClusterSpec.compute_slowdown`).
    """
    check_overlap(overlap)
    if compute_slowdown is None:
        compute_slowdown = cluster.compute_slowdown
    if isinstance(compute_slowdown, bool) or not isinstance(compute_slowdown, (int, float)) or not compute_slowdown >= 1.0:
        raise CaramelError(f"compute_slowdown must be a factor >= 1 (1 = no CPU contention), got {compute_slowdown!r}")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise CaramelError(f"iterations must be a positive integer, got {iterations!r}")
    cluster.validate()
    if isinstance(comm, str):
        comm = CommModel(cluster, comm)
    assert comm.cluster is cluster or comm.cluster.world_size == cluster.world_size
    work = compress_workload(build_workload(profile, plan), profile, plan)
    speeds = [w.speed for w in cluster.workers]
    pauses = forward_pauses_s(profile, cluster, max(iterations, JITTER_STEPS + 1))
    if pauses is not None:  # the bench's jitter: a pause after each forward, many steps (`caramel.sim.jitter`)
        iterations = len(pauses[0])
    run = run_engine(work, speeds, comm, overlap, iterations, record=trace, compute_slowdown=float(compute_slowdown),
                     pause_s=pauses)

    step = max(steady_period_s(ln) for ln in run.timelines)
    jitter_meta = {}
    if pauses is not None:
        jitter_meta = jitter_summary(job_steps_s([ln.forward_start_s for ln in run.timelines]))
        step = jitter_meta["job_step_mean_s"]
    slow = min(speeds)
    compute = work.compute_s / slow
    if pauses is not None:  # a sleep is no communication: the longest pause of each step, on average
        compute += sum(max(p[k] for p in pauses) for k in range(iterations)) / iterations
    measured = range(1, iterations) if iterations >= 2 else range(0, 1)
    per_rank_wait = [sum(ln.wait_s[i] for i in measured) / len(measured) for ln in run.timelines]
    wait = sum(w * len(ln.ranks) for w, ln in zip(per_rank_wait, run.timelines)) / cluster.world_size
    iter_times = [max(ln.forward_start_s[i + 1] - ln.forward_start_s[i] for ln in run.timelines)
                  for i in range(iterations)]
    result = SimResult(
        step_time_s=step,
        compute_time_s=compute,
        comm_time_s=run.comm_time_s,
        exposed_comm_s=max(step - compute, 0.0),
        wait_time_s=wait,
        link_utilization=min(run.transfer_time_s / step, 1.0) if step > 0 else 0.0,
        comm_busy_fraction=_busy_fraction(run, step),
        iteration_times_s=iter_times,
        critical_path=summarize_critical_path(run, step),
        planner=plan.planner,
        overlap=overlap,
        world_size=cluster.world_size,
        num_items=len(work.items),
        meta={"comm_model": comm.describe(), "iterations": iterations, "plan_fingerprint": plan.fingerprint,
              "plan_world_size": plan.world_size, "bandwidth_bps": cluster.bandwidth_bps,
              "latency_s": cluster.latency_s, "queued_latency_s": cluster.queued_latency_s,
              "collective_cpu_s": cluster.collective_cpu_s, "compute_slowdown": float(compute_slowdown),
              **jitter_meta},
    )
    if trace:
        if trace_ranks is None:
            trace_ranks = (list(range(cluster.world_size)) if cluster.world_size <= FULL_TRACE_MAX_WORKERS
                           else [ln.ranks[0] for ln in run.timelines])
        bad = [r for r in trace_ranks if not 0 <= r < cluster.world_size]
        if bad:
            raise CaramelError(f"trace_ranks: rank {bad[0]} is not in a cluster of {cluster.world_size} workers")
        result.trace = Trace("predicted", cluster.world_size, trace_events(run, trace_ranks),
                             meta={"planner": plan.planner, "overlap": overlap, "plan_fingerprint": plan.fingerprint,
                                   "ranks": sorted(trace_ranks), "step_time_s": step, "model": profile.model})
    return result
