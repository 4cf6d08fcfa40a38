"""A synthetic 2-rank trace with hand-checkable numbers, shaped like the runtime's overlap="forward".

Times below are milliseconds from the start of step k (forward start), step k lasting L_k ms.

rank 0: forward [0, 3], backward [3, 7]; ready b1 @4, issue b1c0 @4, b1c1 @4.2; comm b1c0 [4, 6],
        b1c1 [4.2, 7.5]; ready b0 @6.5, issue b0 @6.5, comm b0 [6.5, L_k + 0.8] (spills into the
        next step, where forward waits for it: wait b0 [0, 0.8], apply b0 [0.8, 1.0]; b1 was done
        long before: wait b1 [1.0, 1.0], apply b1 [1.0, 1.3]).
rank 1: everything of its own 0.5 ms later (forward [0, 3.5], backward [3.5, 7.5], ready b1 @4.5,
        issues @4.5/4.7, ready b0 @7.0) but collectives end when rank 0's do (they are joint).
After the last step, synchronize() waits like the next forward would, but no forward is recorded.
"""
from __future__ import annotations

from caramel.plan.plan import Bucket, Plan
from caramel.trace.events import Trace, TraceEvent

MS = 1e-3


def synthetic_plan() -> Plan:
    """Bucket 0: 1000 float32, one chunk; bucket 1: 2000 float32 in two chunks of 4000 bytes."""
    return Plan(
        planner="fifo", world_size=2, model_fingerprint="synthetic", param_names=["w0", "w1", "w2"],
        buckets=[Bucket(0, [0], "float32", 1000, 4000, 1), Bucket(1, [1, 2], "float32", 2000, 8000, 2)],
        order=[(1, 0), (1, 1), (0, 0)],
    )


def two_rank_trace(step_lengths_ms=(10.0, 12.0, 10.0, 11.0), base_s: float = 100.0) -> Trace:
    """The trace described in the module docstring, as one multi-rank `Trace` (source measured)."""
    events: list[TraceEvent] = []
    starts = [0.0]
    for length in step_lengths_ms:
        starts.append(starts[-1] + length)
    n = len(step_lengths_ms)

    def add(rank, lane, kind, name, a_ms, b_ms, it, bucket=None, chunk=None, nbytes=None):
        events.append(TraceEvent(rank, lane, kind, name, base_s + a_ms * MS, (b_ms - a_ms) * MS, it, bucket, chunk, nbytes))

    for rank, lag in ((0, 0.0), (1, 0.5)):
        for k in range(n + 1):
            t = starts[k]
            if k >= 1:  # the forward (or the final synchronize) waits for step k-1's buckets
                add(rank, "wait", "wait", "wait:b0", t, t + 0.8, k, bucket=0)
                add(rank, "compute", "optimizer", "apply:b0", t + 0.8, t + 1.0, k, bucket=0)
                add(rank, "wait", "wait", "wait:b1", t + 1.0, t + 1.0, k, bucket=1)
                add(rank, "compute", "optimizer", "apply:b1", t + 1.0, t + 1.3, k, bucket=1)
            if k == n:
                break
            add(rank, "compute", "forward", "forward", t, t + 3 + lag, k)
            add(rank, "compute", "backward", "backward", t + 3 + lag, t + 7 + lag, k)
            add(rank, "comm", "ready", "ready:b1", t + 4 + lag, t + 4 + lag, k, bucket=1)
            add(rank, "comm", "issue", "issue:b1c0", t + 4 + lag, t + 4 + lag, k, bucket=1, chunk=0)
            add(rank, "comm", "comm", "allreduce:b1c0", t + 4 + lag, t + 6, k, bucket=1, chunk=0, nbytes=4000)
            add(rank, "comm", "issue", "issue:b1c1", t + 4.2 + lag, t + 4.2 + lag, k, bucket=1, chunk=1)
            add(rank, "comm", "comm", "allreduce:b1c1", t + 4.2 + lag, t + 7.5, k, bucket=1, chunk=1, nbytes=4000)
            add(rank, "comm", "ready", "ready:b0", t + 6.5 + lag, t + 6.5 + lag, k, bucket=0)
            add(rank, "comm", "issue", "issue:b0c0", t + 6.5 + lag, t + 6.5 + lag, k, bucket=0, chunk=0)
            # recorded at completion, after optimizer.step(): carries the next iteration number
            add(rank, "comm", "comm", "allreduce:b0c0", t + 6.5 + lag, starts[k + 1] + 0.8, k + 1, bucket=0, chunk=0, nbytes=4000)
    return Trace("measured", 2, events, {"synthetic": True})


def split_by_rank(trace: Trace) -> list[Trace]:
    """Per-rank traces, as the runtime writes them."""
    return [Trace(trace.source, trace.world_size, [e for e in trace.events if e.rank == r], {"rank": r})
            for r in range(trace.world_size)]
