"""`check_trace(trace, plan)`: does a recorded timeline show the plan executed as promised?

For every rank and every step (a step is an iteration in which the rank recorded `ready`
instants), every bucket of the plan must appear exactly once: one `ready` instant, one `issue`
instant per chunk (or one per bucket when the runtime does not record chunks on issues), one
`comm` event per chunk carrying at least the plan's bytes for that chunk, and one `wait` that
consumes it, with

    ready <= issue <= done <= wait end

where `done` is the end of the chunk's collective. The k-th ready of a bucket on a rank is matched
with the k-th issue and collective of that bucket (collectives of one bucket complete in issue
order) and with the first wait that ends at or after that ready and before the next one; the
iteration number is used only to find steps, because a collective or wait recorded after
`optimizer.step()` carries the next iteration number.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from caramel.errors import MismatchError
from caramel.plan.plan import Plan
from caramel.trace.events import Trace, TraceEvent

# Times are perf_counter values plus one wall-clock anchor: near 1.7e9 s a double resolves about
# 2.4e-7 s, so two readings taken in order can compare reversed by one ulp after anchoring.
CLOCK_RESOLUTION_S = 1e-6


@dataclass
class TraceCheck:
    """What `check_trace` found: the problems (empty when the trace is consistent) and counts."""

    problems: list[str] = field(default_factory=list)
    steps_checked: int = 0
    buckets_checked: int = 0
    extra_bytes: int = 0
    """Bytes the collectives carried beyond the plan's gradient bytes (e.g. usage flags), summed."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _by(events: list[TraceEvent], kind: str) -> dict[tuple, list[TraceEvent]]:
    out: dict[tuple, list[TraceEvent]] = defaultdict(list)
    for e in events:
        if e.kind == kind and e.bucket is not None:
            out[(e.rank, e.bucket)].append(e)
    for v in out.values():
        v.sort(key=lambda e: (e.start_s, e.chunk if e.chunk is not None else -1))
    return out


def _from_step(events: list[TraceEvent], first_step: int) -> list[TraceEvent]:
    """Per rank, the events that start at or after the forward of iteration `first_step`.

    Collectives issued earlier (and their readies) belong to an earlier plan; a wait for one of
    them inside that forward stays, but ends before any ready of the checked steps and is skipped.
    """
    cut: dict[int, float] = {}
    for e in events:
        if e.kind == "forward" and e.iteration == first_step:
            cut[e.rank] = min(cut.get(e.rank, float("inf")), e.start_s)
    return [e for e in events if e.rank in cut and e.start_s >= cut[e.rank]]


def inspect_trace(trace: Trace, plan: Plan, require_waits: bool = True, tol_s: float = CLOCK_RESOLUTION_S,
                  max_problems: int = 20, first_step: int = 0) -> TraceCheck:
    """All inconsistencies between `trace` and `plan` (see the module docstring), without raising.

    `first_step` > 0 checks only the steps from that iteration on (a run that re-planned after
    its first steps: check each stretch against the plan in force then).
    """
    result = TraceCheck()
    problems = result.problems
    nb = len(plan.buckets)
    events = _from_step(trace.events, first_step) if first_step else trace.events
    ready, issue, comm, wait = (_by(events, k) for k in ("ready", "issue", "comm", "wait"))
    for kind, table in (("ready", ready), ("issue", issue), ("comm", comm), ("wait", wait)):
        for (rank, b) in table:
            if b >= nb:
                problems.append(f"rank {rank}: {kind} event names bucket {b}, but the plan has {nb} buckets")
    ranks = sorted({e.rank for e in events})
    for rank in ranks:
        steps = sorted({e.iteration for e in events if e.rank == rank and e.kind == "ready"})
        if not steps:
            problems.append(f"rank {rank}: no 'ready' events, so no step can be checked")
            continue
        result.steps_checked += len(steps)
        for bucket in plan.buckets:
            b, chunks = bucket.id, bucket.num_chunks
            rs = ready.get((rank, b), [])
            per_step = defaultdict(int)
            for e in rs:
                per_step[e.iteration] += 1
            for step in steps:
                if per_step[step] != 1:
                    problems.append(f"rank {rank} step {step}: bucket {b} has {per_step[step]} ready events, expected 1")
            n = len(rs)
            iss = issue.get((rank, b), [])
            per_chunk_issue = any(e.chunk is not None for e in iss)
            if len(iss) != n * (chunks if per_chunk_issue else 1):
                problems.append(f"rank {rank}: bucket {b} has {len(iss)} issue events for {n} steps "
                                f"(expected {chunks if per_chunk_issue else 1} per step)")
            cms = comm.get((rank, b), [])
            if len(cms) != n * chunks:
                problems.append(f"rank {rank}: bucket {b} has {len(cms)} collectives for {n} steps, expected {chunks} per step")
            by_chunk_comm: dict[int, list[TraceEvent]] = defaultdict(list)
            for e in cms:
                by_chunk_comm[e.chunk if e.chunk is not None else 0].append(e)
            by_chunk_issue: dict[int, list[TraceEvent]] = defaultdict(list)
            for e in iss:
                by_chunk_issue[e.chunk if per_chunk_issue else 0].append(e)
            ws = sorted(wait.get((rank, b), []), key=lambda e: e.end_s)
            j = 0
            for k, r in enumerate(rs):
                result.buckets_checked += 1
                t_ready = r.start_s
                t_next = rs[k + 1].start_s if k + 1 < n else float("inf")
                where = f"rank {rank} step {r.iteration} bucket {b}"
                done = []
                for c in range(chunks):
                    cl = by_chunk_comm.get(c, [])
                    if k >= len(cl):
                        continue  # counted above
                    ev = cl[k]
                    il = by_chunk_issue.get(c if per_chunk_issue else 0, [])
                    t_issue = il[k].start_s if k < len(il) else ev.start_s
                    if t_issue < t_ready - tol_s:
                        problems.append(f"{where} chunk {c}: issued at {t_issue:.6f} before ready at {t_ready:.6f}")
                    if ev.end_s < t_issue - tol_s:
                        problems.append(f"{where} chunk {c}: done at {ev.end_s:.6f} before issue at {t_issue:.6f}")
                    if ev.bytes is not None:
                        # the wire may carry more than the gradients (the runtime appends per-parameter
                        # usage flags to a bucket's last chunk), never less
                        extra = ev.bytes - bucket.chunk_bytes(c)
                        if extra < 0:
                            problems.append(f"{where} chunk {c}: {ev.bytes} bytes, fewer than the plan's {bucket.chunk_bytes(c)}")
                        else:
                            result.extra_bytes += extra
                    done.append(ev.end_s)
                while j < len(ws) and ws[j].end_s < t_ready:
                    j += 1
                w = None
                if j < len(ws) and ws[j].end_s < t_next:
                    w = ws[j]
                    j += 1
                    if j < len(ws) and ws[j].end_s < t_next:
                        problems.append(f"{where}: waited on more than once before its next ready")
                if w is None:
                    if require_waits:
                        problems.append(f"{where}: no wait event consumes it")
                elif done and w.end_s < max(done) - tol_s:
                    problems.append(f"{where}: wait ended at {w.end_s:.6f} before the collective was done at {max(done):.6f}")
            if len(problems) >= max_problems:
                break
    del problems[max_problems:]
    return result


def check_trace(trace: Trace, plan: Plan, require_waits: bool = True, tol_s: float = CLOCK_RESOLUTION_S,
                first_step: int = 0) -> TraceCheck:
    """Raise `MismatchError` listing the first problems unless `trace` executes `plan` consistently.

    Every bucket appears exactly once per step on every rank with ready <= issue <= done <= wait
    end (see the module docstring for how events are matched). `require_waits=False` accepts
    buckets that no wait consumed (a runtime that records waits only when it actually blocked).
    `first_step` skips the steps before that iteration (see `inspect_trace`).
    Returns the `TraceCheck` with the counts on success.
    """
    result = inspect_trace(trace, plan, require_waits=require_waits, tol_s=tol_s, first_step=first_step)
    if not result.ok:
        listed = "; ".join(result.problems[:5])
        more = f" (and {len(result.problems) - 5} more)" if len(result.problems) > 5 else ""
        raise MismatchError(f"trace does not match plan {plan.fingerprint}: {listed}{more}")
    return result
