"""The event engine: replay a plan on a cluster, step by step, as the runtime executes it.

Per worker (speed s scales every compute time by 1/s), per step:
- forward, during which bucket b is first needed at `need_s`; with `overlap="forward"` the
  update of the previous step's bucket b must be complete and applied right there (the wait is
  blocking, the apply costs `apply_s` of compute);
- backward, during which bucket b becomes ready at `ready_s`;
- item k of the plan's order is issued once its bucket is ready on that worker and item k-1 was
  issued (`overlap="none"`: everything is issued when backward ends);
- the backend runs collectives one at a time in issue order: a collective starts when every
  worker issued it and the previous one finished, and lasts `CommModel.time_s(bytes)`;
- step(): with `"backward"`/`"none"` it waits for every collective, then applies all buckets;
  with `"forward"` it returns at once and the updates happen in the next forward.

Workers of equal speed have identical timelines, so the engine simulates one timeline per
distinct speed (a 1024-worker uniform cluster is one timeline) and writes trace events for the
ranks asked for. Several steps are unrolled; the steady-state step time is the mean period of
forward starts after the first step (whose forward has nothing to wait for).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from caramel.sim.collectives import CommModel
from caramel.sim.workload import Workload
from caramel.trace.events import TraceEvent

OVERLAPS = ("forward", "backward", "none")


@dataclass
class Timeline:
    """One speed class's simulated steps."""

    speed: float
    ranks: list[int]
    forward_start_s: list[float] = field(default_factory=list)  # one per step, plus the one after the last
    wait_s: list[float] = field(default_factory=list)  # blocked time per step
    waits: list[list[tuple[int, float]]] = field(default_factory=list)  # per step: (bucket, seconds)
    events: list[tuple] = field(default_factory=list)  # (lane, kind, name, start, dur, it, bucket, chunk, bytes)


@dataclass
class EngineRun:
    timelines: list[Timeline]
    comm_start_s: list[list[float]]  # [step][item]
    comm_end_s: list[list[float]]
    gated_by_issue: list[list[bool]]  # [step][item]: started when the last worker issued it (not the backend)
    comm_time_s: float  # collective time per step
    transfer_time_s: float  # its bandwidth part


def speed_classes(speeds: list[float]) -> list[tuple[float, list[int]]]:
    """Ranks grouped by speed, slowest first (ties keep rank order)."""
    groups: dict[float, list[int]] = {}
    for r, s in enumerate(speeds):
        groups.setdefault(float(s), []).append(r)
    return sorted(groups.items(), key=lambda kv: (kv[0], kv[1][0]))


def run_engine(work: Workload, speeds: list[float], comm: CommModel, overlap: str, iterations: int,
               record: bool) -> EngineRun:
    """Simulate `iterations` steps on every speed class; see the module docstring for semantics."""
    assert overlap in OVERLAPS and iterations >= 1
    lines = [Timeline(s, ranks) for s, ranks in speed_classes(speeds)]
    items = work.items
    costs = [comm.time_s(it.bytes) for it in items]
    n_buckets = len(work.buckets)
    last_item_of = [-1] * n_buckets
    for k, it in enumerate(items):
        last_item_of[it.bucket] = k
    done_prev: list[float] | None = None  # previous step's completion time per bucket
    comm_free = 0.0
    for line in lines:
        line.forward_start_s.append(0.0)
    all_start, all_end, all_gated = [], [], []
    issue_prev = [-math.inf] * len(lines)

    for step in range(iterations):
        issues: list[list[float]] = []
        bwd_ends: list[float] = []
        for ci, line in enumerate(lines):
            s = line.speed
            t = line.forward_start_s[step]
            fwd_start = t
            u = 0.0
            waited, waits = 0.0, []
            if overlap == "forward" and done_prev is not None:
                for b in work.need_order:
                    bl = work.buckets[b]
                    t += (bl.need_s - u) / s
                    u = bl.need_s
                    if done_prev[b] > t:
                        if record:
                            line.events.append(("wait", "wait", f"wait:b{b}", t, done_prev[b] - t, step, b, None, None))
                        waits.append((b, done_prev[b] - t))
                        waited += done_prev[b] - t
                        t = done_prev[b]
                    if record:
                        line.events.append(("compute", "optimizer", f"apply:b{b}", t, bl.apply_s / s, step, b, None, None))
                    t += bl.apply_s / s
            t += (work.forward_s - u) / s
            if record:
                line.events.append(("compute", "forward", "forward", fwd_start, t - fwd_start, step, None, None, None))
                line.events.append(("compute", "backward", "backward", t, work.backward_s / s, step, None, None, None))
            ready = [t + bl.ready_s / s for bl in work.buckets]
            bwd_end = t + work.backward_s / s
            if record:
                for b, r in enumerate(ready):
                    line.events.append(("comm", "ready", f"ready:b{b}", r, 0.0, step, b, None, None))
            if overlap == "none":
                iss = [bwd_end] * len(items)
            else:
                iss, prev = [], issue_prev[ci]
                for it in items:
                    prev = max(prev, ready[it.bucket])
                    iss.append(prev)
                if iss:
                    issue_prev[ci] = iss[-1]
            issues.append(iss)
            bwd_ends.append(bwd_end)
            line.wait_s.append(waited)
            line.waits.append(waits)

        starts, ends, gated = [], [], []
        done = [0.0] * n_buckets
        for k in range(len(items)):
            last_issue = max(iss[k] for iss in issues)
            start = max(comm_free, last_issue)
            end = start + costs[k]
            gated.append(last_issue >= comm_free)
            comm_free = end
            starts.append(start)
            ends.append(end)
            b = items[k].bucket
            done[b] = max(done[b], end)
        all_start.append(starts)
        all_end.append(ends)
        all_gated.append(gated)

        for ci, line in enumerate(lines):
            s = line.speed
            t = bwd_ends[ci]
            if record:
                for k, it in enumerate(items):
                    name = f"b{it.bucket}c{it.chunk}"
                    line.events.append(("comm", "issue", f"issue:{name}", issues[ci][k], 0.0, step, it.bucket, it.chunk, it.bytes))
                    line.events.append(("comm", "comm", f"allreduce:{name}", issues[ci][k], ends[k] - issues[ci][k], step, it.bucket, it.chunk, it.bytes))
            if overlap != "forward":
                t = _wait_and_apply(line, work, done, t, step, record, order=sorted(range(n_buckets), key=lambda b: (done[b], b)))
            line.forward_start_s.append(t)
        done_prev = done

    if overlap == "forward" and record and done_prev is not None:
        # optimizer.synchronize() after the last step: every pending update applied
        for line in lines:
            _wait_and_apply(line, work, done_prev, line.forward_start_s[-1], iterations, True, order=list(work.need_order))
    comm_time = sum(costs)
    transfer = sum(comm.transfer_s(it.bytes) for it in items) if comm.cluster.world_size > 1 else 0.0
    return EngineRun(lines, all_start, all_end, all_gated, comm_time, transfer)


def _wait_and_apply(line: Timeline, work: Workload, done: list[float], t: float, step: int, record: bool,
                    order: list[int]) -> float:
    """Block until every bucket is reduced (in `order`), then apply them all; return the end time."""
    waited = 0.0
    waits = []
    for b in order:
        if done[b] > t:
            if record:
                line.events.append(("wait", "wait", f"wait:b{b}", t, done[b] - t, step, b, None, None))
            waits.append((b, done[b] - t))
            waited += done[b] - t
            t = done[b]
    if step < len(line.wait_s):
        line.wait_s[step] += waited
        line.waits[step].extend(waits)
    for b in sorted(order):
        bl = work.buckets[b]
        if record:
            line.events.append(("compute", "optimizer", f"apply:b{b}", t, bl.apply_s / line.speed, step, b, None, None))
        t += bl.apply_s / line.speed
    return t


def trace_events(run: EngineRun, ranks: list[int]) -> list[TraceEvent]:
    """The recorded events of the given ranks, sorted by (rank, start)."""
    wanted = set(ranks)
    out = []
    for line in run.timelines:
        for r in line.ranks:
            if r not in wanted:
                continue
            out.extend(TraceEvent(r, lane, kind, name, start, dur, it, b, c, n)
                       for lane, kind, name, start, dur, it, b, c, n in line.events)
    out.sort(key=lambda e: (e.rank, e.start_s, -e.duration_s))
    return out


def steady_period_s(line: Timeline) -> float:
    """Mean step period after the first step (whose forward waits for nothing)."""
    fs = line.forward_start_s
    steps = len(fs) - 1
    if steps >= 2:
        return (fs[-1] - fs[1]) / (steps - 1)
    return fs[1] - fs[0]


def summarize_critical_path(run: EngineRun, step_time_s: float) -> dict[str, Any]:
    """What bounds the last simulated step on the slowest timeline: compute or communication."""
    line = run.timelines[0]  # the slowest workers: every collective waits for them
    last = len(line.forward_start_s) - 2
    step_s = line.forward_start_s[last + 1] - line.forward_start_s[last]
    wait = line.wait_s[last] if last < len(line.wait_s) else 0.0
    top = sorted(line.waits[last], key=lambda bw: -bw[1])[:5] if last < len(line.waits) else []
    gated = run.gated_by_issue[last] if run.gated_by_issue else []
    return {
        "rank": line.ranks[0],
        "speed": line.speed,
        "step": last,
        "step_s": step_s,
        "compute_s": step_s - wait,
        "wait_s": wait,
        "bound": "communication" if wait > 1e-9 * max(step_time_s, 1e-12) else "compute",
        "top_waits": [{"bucket": b, "wait_s": w} for b, w in top],
        "collectives_gated_by_issue": sum(gated),
        "collectives_gated_by_backend": len(gated) - sum(gated),
    }
