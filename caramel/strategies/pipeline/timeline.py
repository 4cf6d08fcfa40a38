"""The pipeline simulator's shared types: the per-stage costs a replay walks, its result, and the
contention fixed point's pass limit. Both replays (`replay.replay`, after the drain, and
`overlap.replay_overlapped`, the replicas' reduction overlapped) read and return these, so they
live apart from either to keep the imports one-way (simulate -> replay and overlap -> timeline)."""
from __future__ import annotations

from dataclasses import dataclass, field

Action = tuple[int, str, int]  # (stage, "F" or "B", microbatch)
MAX_CONTENTION_PASSES = 12  # the transfers' intervals settle in a few passes; a cycle ends here, deterministically


@dataclass(frozen=True)
class ReduceBuckets:
    """One stage's replica reduction, per step, its buckets in issue order (last layers first):
    each bucket's collective, the stage's backward compute (of one microbatch) done when its
    gradients are all ready, the forward compute done before its parameters are first used, and
    its share of the optimizer step (all in seconds)."""

    time_s: list[float]
    ready_s: list[float]
    need_s: list[float]
    apply_s: list[float]
    queued_time_s: list[float]  # the collective when it starts queued behind the previous one
    # the CPU of every bucket's messages on the rank, charged on the step's last backward (the
    # spec's reduce_cpu="messages": `overlap.bucket_cpu_s`; 0 otherwise)
    cpu_s: float = 0.0
    # the buckets these collectives belong to, where a bucket may go in several chunks (the
    # planner's, `planner_buckets.py`); 0: one bucket per collective
    bucket_count: int = 0

    @property
    def buckets(self) -> int:
        """How many buckets the stage reduces per step."""
        return self.bucket_count or len(self.time_s)


@dataclass(frozen=True)
class StageCosts:
    """Per microbatch: each stage's forward and backward, each boundary's one-way transfer;
    per step: each stage's replica all-reduce, then its optimizer step; `buckets`: the same
    all-reduce bucket by bucket, where the replay overlaps it with compute (`overlap.py`);
    `latency_s`: the links' one-way latency (a recv's notice to its sender, `transport.py`)."""

    forward_s: list[float]
    backward_s: list[float]
    transfer_s: list[float]
    allreduce_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    buckets: list[ReduceBuckets] = field(default_factory=list)
    latency_s: float = 0.0


@dataclass(frozen=True)
class PipelineSim:
    step_time_s: float
    busy_s: list[float]  # compute per position
    finish_s: list[float]  # when each position's part of the step ends (see `bubble_fraction`)
    compute_s: list[list[tuple[float, float]]] = field(default_factory=list)  # each lane's compute intervals
    wire_s: list[list[tuple[float, float]]] = field(default_factory=list)  # each lane's transfers on the wire
    # per position, what the runtime's `StageTimer` counts (`timing.py`): `busy_s` plus the waits inside
    # its timed calls (the replicas' buckets: `overlap.py`, which always fills it, zeros included);
    # empty where the replay does not track those waits (`replay`, the "after" reduction)
    timed_busy_s: list[float] = field(default_factory=list)

    @property
    def timed_s(self) -> list[float]:
        """Per position, the busy time the runtime's timer would measure (`timed_busy_s`, else `busy_s`)."""
        return self.timed_busy_s or self.busy_s

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the positions over `max(finish_s)`. `replay.replay`: the schedule's
        span, before the replicas' all-reduce after the drain. `overlap.replay_overlapped`: the
        steady step, so it also counts what of the overlapped reduction stays exposed."""
        span = max(self.finish_s)
        return 1 - sum(self.busy_s) / (span * len(self.busy_s))

