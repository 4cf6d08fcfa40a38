"""The measured bubble of a synchronous pipeline, from the runtime's own timing of its stages.

Each rank times every compute action of its stage(s) in a step: torch's
`PipelineStage.forward_one_chunk` (plus the schedule's loss on the last stage) and
`backward_one_chunk`, wrapped on the instances, so the time a rank spends receiving, sending or
waiting falls outside them. Per step a rank records its busy time and its first start and last
end (one clock, its own).

Definition (the one GPipe's `(p-1)/(m+p-1)` speaks of): the *step span* is the first
position's, from its first compute to its last; in GPipe and 1F1B (and interleaved) the first
position starts a step's first forward and ends its last backward, so this span holds every
stage's work. A position's bubble fraction is its idle share of that span,
`1 - busy / span`: the idle time between its own first and last compute plus the time it waits
before its first and after its last. Only durations cross ranks, never clock readings, so the
measure holds across hosts whose clocks differ. With p equal stages and m microbatches every
position's fraction is `(p-1)/(m+p-1)`.

Where Caramel's engine reduces a stage's replicas, the timer also keeps that reduction
(`watch_reduces`): the engine's bucket plan (each item's bucket, chunk and bytes, in issue
order) and, per step, each collective's bytes, issue and completion on the same clock as the
actions, so a trace shows which actions the buckets overlapped (the simulator's buckets are its
own model of that plan, `overlap.py`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from caramel.errors import CaramelError
from caramel.trace.events import TraceEvent

MAX_STEPS = 256  # steps of timing kept (a long run keeps the most recent)


@dataclass
class StepTiming:
    first_start_s: float
    last_end_s: float
    busy_s: float
    actions: list[tuple[str, int, int, float, float]] = field(default_factory=list)  # (F|B, stage, mb, start, end)
    # the replicas' collectives this step issued (Caramel's engine): (bytes, issue, done), issue order
    reduces: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        return self.last_end_s - self.first_start_s


class StageTimer:
    """Times the compute actions of this rank's stages, one step at a time."""

    def __init__(self) -> None:
        self.steps: list[StepTiming] = []
        self._actions: list[tuple[str, int, int, float, float]] = []
        self.reduce_plan: list[tuple[int, int, int]] = []  # (bucket, chunk, bytes) in issue order
        self._reduce_log: Any = None  # the engine's dispatcher log of completed collectives

    def watch_reduces(self, dispatcher: Any, plan: list[tuple[int, int, int]]) -> None:
        """Record the collectives of Caramel's engine dispatcher (`caramel.runtime.dispatch`):
        its log of (issue, done, bytes) while measuring, on `time.perf_counter` like the actions.
        `plan`: its items (bucket, chunk, bytes) in issue order. The timer empties that log each
        step, so it suits an engine that measures nothing itself from it (the pipeline's: no
        online profiling, trial or periodic check, `replica_reduce.caramel_replicas`; checked
        there by `replica_reduce.watch_engine_reduces`); here: no one else measuring already."""
        if dispatcher.measurers:
            raise CaramelError(f"stage timer: the engine's collective log already has {dispatcher.measurers} "
                               "reader(s) (online profiling, a trial or a bandwidth check), and the timer empties "
                               "it every step; watch an engine that measures nothing itself")
        dispatcher.start_measuring()
        self._reduce_log = dispatcher.log
        self.reduce_plan = list(plan)

    @property
    def watching_reduces(self) -> bool:
        """Whether `watch_reduces` was called (an engine reduces this rank's stage)."""
        return self._reduce_log is not None

    def wrap_stage(self, stage: Any) -> None:
        """Time `stage.forward_one_chunk` and `stage.backward_one_chunk` (torch's PipelineStage)."""
        index = stage.stage_index
        self._wrap(stage, "forward_one_chunk", lambda a, k: ("F", index, _mb(a, k)))
        self._wrap(stage, "backward_one_chunk", lambda a, k: ("B", index, _mb(a, k)))

    def wrap_loss(self, schedule: Any) -> None:
        """Count the schedule's loss (on the last stage) as that stage's forward work."""
        self._wrap(schedule, "_maybe_compute_loss", lambda a, k: ("F", getattr(a[0], "stage_index", -1), -1))

    def _wrap(self, obj: Any, method: str, label: Callable[[tuple, dict], tuple[str, int, int]]) -> None:
        orig = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                self._actions.append((*label(args, kwargs), t0, time.perf_counter()))

        setattr(obj, method, timed)

    def end_step(self) -> None:
        acts, self._actions = self._actions, []
        if acts:
            self.steps.append(StepTiming(min(a[3] for a in acts), max(a[4] for a in acts),
                                         sum(a[4] - a[3] for a in acts), acts))
            del self.steps[:-MAX_STEPS]
        self.take_reduces()

    def take_reduces(self) -> None:
        """Move the collectives completed so far to the step that issued them (the last one begun
        at or before the issue): a step's buckets may complete during the next step, the last
        step's after its `end_step` (call again before reading them)."""
        log = self._reduce_log
        while log:
            issue, done, nbytes = log.popleft()  # the backend's thread only appends
            step = next((st for st in reversed(self.steps) if st.first_start_s <= issue), None)
            if step is not None:
                step.reduces.append((int(nbytes), issue, done))

    def events(self, rank: int, first_iteration: int = 0) -> list[TraceEvent]:
        """The recorded actions as trace events on this rank's compute lane (loss merged into F)."""
        out = []
        for k, st in enumerate(self.steps):
            for kind, stage, mb, a, b in st.actions:
                if mb < 0:
                    continue
                out.append(TraceEvent(rank, "compute", "forward" if kind == "F" else "backward",
                                      f"stage{stage}.{kind}{mb}", a, b - a, first_iteration + k))
        return out


def _mb(args: tuple, kwargs: dict) -> int:
    return int(args[0]) if args else int(kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1)))


def bubble_fractions(per_position: list[list[tuple[float, float]]], skip_steps: int = 1) -> dict[str, Any]:
    """From every position's per-step (span_s, busy_s), position 0 first: each position's median
    bubble fraction over the steps (after `skip_steps` warm-up steps, when there are more), and
    their mean. Fractions of a step use position 0's span of that step."""
    steps = min(len(p) for p in per_position)
    if steps == 0:
        return {"bubble_fraction": None, "bubble_fraction_per_stage": [], "bubble_steps": 0}
    first = skip_steps if steps > skip_steps else 0
    per_stage, busy = [], []
    for pos in per_position:
        fr = [1 - pos[k][1] / per_position[0][k][0] for k in range(first, steps) if per_position[0][k][0] > 0]
        per_stage.append(statistics.median(fr) if fr else None)
        busy.append(statistics.median(pos[k][1] for k in range(first, steps)))
    known = [f for f in per_stage if f is not None]
    return {"bubble_fraction": sum(known) / len(known) if known else None, "bubble_fraction_per_stage": per_stage,
            "busy_s_per_stage": busy, "bubble_steps": steps - first}
