"""A virtual clock for the spawned balancer tests: stands in for `time` in the modules that
sleep or time a step (the emulated slow-downs, DDP's share hook) and, from `start`, is the
engine's clock too. Until then the slow-downs really sleep (profiling and planning run on wall
time); from then on time passes only in the slow-downs and in the holds the tests add (a peer's
lead in a collective), so a step's period is exactly its slowed compute plus the waits it was
held, whatever else runs on the host: on a loaded host wall-clock periods let noise decide.

(`balance_clock.py` is another thing: a per-rank cost line that drives the share controller
in threads, with no engine and no `time` to stand in for.)
"""
from __future__ import annotations

import time


class VirtualClock:
    """`time` with `sleep` and `perf_counter` on the virtual time `t` once started (None before)."""

    def __init__(self) -> None:
        self.t: float | None = None

    def start(self, engine) -> None:
        """Put `engine`'s recorder on this clock, the running step's period going on on it."""
        if self.t is None:
            self.t = engine._step_t0 if engine._step_t0 is not None else time.perf_counter()
            engine.recorder.now = lambda: self.t  # the one clock of its periods and waits

    def sleep(self, seconds: float) -> None:
        if self.t is None:
            time.sleep(seconds)
        else:
            self.t += seconds

    def perf_counter(self) -> float:
        return time.perf_counter() if self.t is None else self.t

    def __getattr__(self, name: str):
        return getattr(time, name)  # the rest of `time` as it is
