"""The event engine: replay a plan on a cluster, step by step, as the runtime executes it.

Per worker (speed s scales every compute time by 1/s), per step:
- forward, during which bucket b is first needed at `need_s`; with `overlap="forward"` the
  update of the previous step's bucket b must be complete and applied right there (the wait is
  blocking, the apply costs `apply_s` of compute);
- backward, during which bucket b becomes ready at `ready_s`;
- item k of the plan's order is issued once its bucket is ready on that worker and item k-1 was
  issued (`overlap="none"`: everything is issued when backward ends);
- the backend runs collectives one at a time in issue order: a collective starts when every
  worker issued it and the previous one finished, and lasts `CommModel.time_s(bytes)`; when
  every worker had issued it before the previous one finished, its fixed cost overlaps what was
  left of that one's transfer at the issue (`CommModel.fixed_s`, `ClusterSpec.queued_latency_s`);
- step(): with `"backward"`/`"none"` it waits for every collective, then applies all buckets;
  with `"forward"` it returns at once and the updates happen in the next forward.

CPU contention (`compute_slowdown` f > 1): on a host where the network stack and the backend's
thread share the cores the model computes on, compute runs f times slower while a collective is
in flight. Compute then advances through the union of collective intervals at rate 1/f. This
stays causal in one pass: a bucket's ready time only depends on collectives that started
before it, and those are the items before it in the plan's order (issue times never decrease
along the order), so ready times are computed item by item as the collectives are placed.
Each collective also costs the cluster's `collective_cpu_s` of CPU: compute running when it
starts pauses that long (the backend's threads at real-time priority preempt it). A collective
that starts while the worker is blocked costs nothing: its core is free. So more, smaller
collectives slow compute more than fewer, larger ones with the same bytes.

Workers of equal speed have identical timelines, so the engine simulates one timeline per
distinct speed (a 1024-worker uniform cluster is one timeline) and writes trace events for the
ranks asked for. Several steps are unrolled; the steady-state step time is the mean period of
forward starts after the first step (whose forward has nothing to wait for).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from caramel.plan.costs import hidden_transfer_s
from caramel.sim.collectives import CommModel
from caramel.plan.plan import OVERLAPS
from caramel.sim.workload import Workload
from caramel.trace.events import TraceEvent



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


class Busy:
    """The collectives' intervals so far (disjoint, in time order: one collective at a time), and
    compute progress through them: at rate 1/slowdown inside one, after a pause of `cpu_s` at the
    start of each that begins while the compute runs (at or after the moment it resumed, and
    before the moment it would end)."""

    def __init__(self, slowdown: float, cpu_s: float = 0.0):
        assert slowdown >= 1.0 and cpu_s >= 0.0
        self.slowdown = slowdown
        self.cpu_s = cpu_s
        self.idle = slowdown == 1.0 and cpu_s == 0.0
        self.starts: list[float] = []
        self.ends: list[float] = []

    @classmethod
    def over(cls, slowdown: float, starts: list[float], ends: list[float]) -> "Busy":
        """A Busy over disjoint intervals already in time order (`starts[i]` to `ends[i]`)."""
        busy = cls(slowdown)
        if not busy.idle:
            busy.starts, busy.ends = starts, ends
        return busy

    def add(self, start: float, end: float) -> None:
        if self.idle or end < start:
            return
        assert not self.ends or start >= self.ends[-1] - 1e-12, "collectives run one at a time"
        self.starts.append(start)
        self.ends.append(end)

    def advance(self, t: float, work_s: float) -> float:
        """When `work_s` seconds of uncontended compute started at `t` finish."""
        if self.idle or work_s <= 0.0:
            return t + work_s
        f, t0 = self.slowdown, t
        i = bisect.bisect_right(self.ends, t)
        while i < len(self.starts):
            a, b = self.starts[i], self.ends[i]
            if t < a:
                if t + work_s <= a:  # not `work_s <= a - t`: a compute whose end starts `a` must never pay for it
                    return t + work_s
                work_s -= a - t
                t = a
            if a >= t0:
                # began while this compute ran (a pause that ran past the collective's start is
                # still owed: the CPU work is the same)
                t += self.cpu_s
            if t < b:
                busy = (b - t) / f
                if work_s <= busy:
                    return t + work_s * f
                work_s -= busy
                t = b
            i += 1
        return t + work_s


def pause_classes(speeds: list[float], pause_s: list[list[float]]) -> list[tuple[float, list[int]]]:
    """Ranks grouped by speed and pauses (`run_engine`'s `pause_s`), slowest first (ties keep rank order)."""
    groups: dict[tuple, list[int]] = {}
    for r, s in enumerate(speeds):
        groups.setdefault((float(s), tuple(pause_s[r])), []).append(r)
    return sorted(((k[0], ranks) for k, ranks in groups.items()), key=lambda kv: (kv[0], kv[1][0]))


def run_engine(work: Workload, speeds: list[float], comm: CommModel, overlap: str, iterations: int,
               record: bool, compute_slowdown: float = 1.0,
               pause_s: list[list[float]] | None = None) -> EngineRun:
    """Simulate `iterations` steps on every speed class; see the module docstring for semantics.
    `pause_s` (per rank, per step): a sleep after the forward (`caramel.sim.jitter`): not
    compute, so not slowed by transfers and free of their CPU cost; ranks of equal speed share a
    timeline only with equal pauses. Not recorded in the trace (a gap before the backward)."""
    assert overlap in OVERLAPS and iterations >= 1
    busy = Busy(compute_slowdown, comm.cluster.collective_cpu_s if comm.cluster.world_size > 1 else 0.0)
    classes = speed_classes(speeds) if pause_s is None else pause_classes(speeds, pause_s)
    lines = [Timeline(s, ranks) for s, ranks in classes]
    items = work.items
    transfers = [comm.transfer_s(it.bytes) if comm.cluster.world_size > 1 else 0.0 for it in items]
    prev_transfer = 0.0  # the bandwidth part of the collective before, in wire order
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
        bwd_starts: list[float] = []
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
                    t = busy.advance(t, (bl.need_s - u) / s)
                    u = bl.need_s
                    if done_prev[b] > t:
                        if record:
                            line.events.append(("wait", "wait", f"wait:b{b}", t, done_prev[b] - t, step, b, None, None))
                        waits.append((b, done_prev[b] - t))
                        waited += done_prev[b] - t
                        t = done_prev[b]
                    apply_end = busy.advance(t, bl.apply_s / s)
                    if record:
                        line.events.append(("compute", "optimizer", f"apply:b{b}", t, apply_end - t, step, b, None, None))
                    t = apply_end
            t = busy.advance(t, (work.forward_s - u) / s)
            if record:
                line.events.append(("compute", "forward", "forward", fwd_start, t - fwd_start, step, None, None, None))
            if pause_s is not None:
                t += pause_s[line.ranks[0]][step]
            bwd_starts.append(t)
            line.wait_s.append(waited)
            line.waits.append(waits)
            if overlap == "none":
                # nothing of this step is in flight before backward ends
                bwd_end = busy.advance(t, work.backward_s / s)
                bwd_ends.append(bwd_end)
                issues.append([bwd_end] * len(items))
            else:
                issues.append([])
        readies: list[list[float | None]] = [[None] * n_buckets for _ in lines]

        def ready_at(ci: int, b: int) -> float:
            # only collectives placed so far can slow this bucket's gradients (module docstring)
            r = readies[ci][b]
            if r is None:
                r = readies[ci][b] = busy.advance(bwd_starts[ci], work.buckets[b].ready_s / lines[ci].speed)
            return r

        starts, ends, gated = [], [], []
        done = [0.0] * n_buckets
        for k in range(len(items)):
            if overlap != "none":
                for ci in range(len(lines)):
                    issue_prev[ci] = max(issue_prev[ci], ready_at(ci, items[k].bucket))
                    issues[ci].append(issue_prev[ci])
            last_issue = max(iss[k] for iss in issues)
            start = max(comm_free, last_issue)
            end = start + comm.time_s(items[k].bytes, hidden_transfer_s(last_issue, comm_free, prev_transfer))
            prev_transfer = transfers[k]
            gated.append(last_issue >= comm_free)
            comm_free = end
            busy.add(start, end)
            starts.append(start)
            ends.append(end)
            b = items[k].bucket
            done[b] = max(done[b], end)
        all_start.append(starts)
        all_end.append(ends)
        all_gated.append(gated)
        if overlap != "none":
            bwd_ends = [busy.advance(bwd_starts[ci], work.backward_s / ln.speed) for ci, ln in enumerate(lines)]
        for ci, line in enumerate(lines):
            if record:
                line.events.append(("compute", "backward", "backward", bwd_starts[ci], bwd_ends[ci] - bwd_starts[ci],
                                    step, None, None, None))
                for b in range(n_buckets):
                    line.events.append(("comm", "ready", f"ready:b{b}", ready_at(ci, b), 0.0, step, b, None, None))

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
    # back to back: the first on an idle link, each next one queued behind the one before
    comm_time = sum(comm.time_s(it.bytes, transfers[k - 1] if k else None) for k, it in enumerate(items))
    transfer = sum(transfers)
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
