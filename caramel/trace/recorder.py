"""The runtime's recorder: cheap enough to leave on.

Events are appended as tuples to a list (no dicts, no I/O on the hot path) and turned into
`TraceEvent`s only when saved. Times are wall-clock seconds (perf_counter anchored to
time.time() once), so ranks on one host, or hosts with synchronized clocks, line up.
"""
from __future__ import annotations

import time

from caramel.trace.events import Trace, TraceEvent


class Recorder:
    """Per-rank event log. `enabled=False` makes every call a no-op."""

    def __init__(self, rank: int, world_size: int, enabled: bool = True, max_events: int = 2_000_000):
        self.rank = rank
        self.world_size = world_size
        self.enabled = enabled
        self.iteration = 0
        self.max_events = max_events
        self._anchor = time.time() - time.perf_counter()
        self._events: list[tuple] = []

    def now(self) -> float:
        return time.perf_counter()

    def record(self, lane: str, kind: str, name: str, start: float, end: float,
               bucket: int | None = None, chunk: int | None = None, nbytes: int | None = None) -> None:
        """An interval [start, end) in perf_counter seconds."""
        if self.enabled and len(self._events) < self.max_events:
            self._events.append((lane, kind, name, start, end - start, self.iteration, bucket, chunk, nbytes))

    def instant(self, lane: str, kind: str, name: str, at: float | None = None,
                bucket: int | None = None, chunk: int | None = None, nbytes: int | None = None) -> None:
        if self.enabled and len(self._events) < self.max_events:
            t = time.perf_counter() if at is None else at
            self._events.append((lane, kind, name, t, 0.0, self.iteration, bucket, chunk, nbytes))

    def next_iteration(self) -> None:
        self.iteration += 1

    def events(self) -> list[TraceEvent]:
        a = self._anchor
        return [TraceEvent(self.rank, lane, kind, name, start + a, dur, it, b, c, n)
                for lane, kind, name, start, dur, it, b, c, n in self._events]

    def trace(self, meta: dict | None = None) -> Trace:
        return Trace("measured", self.world_size, self.events(), dict(meta or {}, rank=self.rank))

    def save(self, path, meta: dict | None = None) -> None:
        self.trace(meta).save(path)
