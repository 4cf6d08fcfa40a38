"""Running a bandwidth trace: the launcher changes the links, the workers time their steps.

Two sides that share only the host's clock and a file (the workers run in network namespaces,
the shaping is done from outside them):

- `TraceClock`, in the bench harness on every rank: when the measured rounds begin, rank 0
  writes the wall-clock time into the job's marker file (the trace's time zero); every measured
  step's wall-clock start and end are kept; rounds go on, all ranks agreeing after each one,
  until the trace's last phase has run its duration.
- `TraceController`, a thread beside the launcher: waits for the marker, then at each phase
  boundary (time zero + the phase's start) sets every worker's link to the phase's rate and
  logs when the change began and ended, so each step can be put in its phase afterwards
  (`caramel.bench.phases`).

Phase 0's rate is in force from the cluster's start (warm-up and settling run at it).
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

MARKER_POLL_S = 0.05


class TraceClock:
    """The harness side (module docstring); `stamps[name]` holds [start, end] per measured step."""

    def __init__(self, spec: dict[str, Any], rank: int, clock: Callable[[], float] = time.time):
        self.marker = Path(spec["marker"])
        self.total_s = float(sum(p["duration_s"] for p in spec["phases"]))
        self.rank, self.clock = rank, clock
        self.t0: float | None = None
        self.stamps: dict[str, list[list[float]]] = {}

    @classmethod
    def from_job(cls, job: dict[str, Any], rank: int) -> "TraceClock | None":
        spec = job.get("bandwidth_trace")
        return cls(spec, rank) if spec else None

    def start(self) -> None:
        """Time zero of the trace: rank 0 tells the launcher (write to a temporary name, then
        rename, so the controller never reads a half-written number)."""
        self.t0 = self.clock()
        if self.rank == 0:
            tmp = self.marker.with_suffix(".tmp")
            tmp.write_text(repr(self.t0))
            tmp.replace(self.marker)

    def stamps_for(self, name: str) -> list[list[float]]:
        return self.stamps.setdefault(name, [])

    def running(self) -> bool:
        """Rank 0's view: has the trace's last phase not yet run its full duration?"""
        assert self.t0 is not None, "start() the trace clock first"
        return self.clock() - self.t0 < self.total_s

    def more(self, rounds_done: int) -> bool:
        """Another round? At least one; then rank 0's answer, the same on every rank."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if rounds_done == 0 or (self.rank == 0 and self.running()) else 0], dtype=torch.int64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            from caramel.distributed import collective_device

            flag = flag.to(collective_device())  # NCCL reduces CUDA tensors only
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class TraceController(threading.Thread):
    """The launcher side (module docstring). `set_rate(bps)` changes every link; `applied` logs
    one entry per phase: index, rate_bps, began/ended (wall clock, seconds) or error."""

    def __init__(self, phases: list[dict[str, Any]], marker: str | Path, set_rate: Callable[[float], None],
                 clock: Callable[[], float] = time.time, log=None):
        super().__init__(name="caramel-bandwidth-trace", daemon=True)
        self.phases, self.marker, self.set_rate, self.clock = phases, Path(marker), set_rate, clock
        self.log = log if log is not None else sys.stderr
        self.applied: list[dict[str, Any]] = []
        self.t0: float | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _wait_marker(self) -> float | None:
        while not self._halt.is_set():
            if self.marker.exists():
                try:
                    return float(self.marker.read_text())
                except ValueError:
                    pass  # created but not yet written: read it again at the next poll
            self._halt.wait(MARKER_POLL_S)
        return None

    def run(self) -> None:
        t0 = self._wait_marker()
        if t0 is None:
            return  # the job ended before its measured rounds began
        self.t0 = t0
        first = self.phases[0]
        self.applied.append({"phase": 0, "rate_bps": first["rate_bps"], "began": t0, "ended": t0})
        for k, phase in enumerate(self.phases[1:], start=1):
            if self._halt.wait(max(0.0, t0 + phase["start_s"] - self.clock())):
                return
            began = self.clock()
            try:
                self.set_rate(phase["rate_bps"])
            except Exception as e:  # noqa: BLE001 - logged: the phases after it are not attributed
                self.applied.append({"phase": k, "rate_bps": phase["rate_bps"], "began": began, "error": str(e)})
                print(f"caramel bench: bandwidth trace phase {k + 1} ({phase['rate']}) could not be applied: {e}",
                      file=self.log, flush=True)
                return
            self.applied.append({"phase": k, "rate_bps": phase["rate_bps"], "began": began, "ended": self.clock()})
            print(f"caramel bench: bandwidth trace phase {k + 1}/{len(self.phases)}: links at {phase['rate']} "
                  f"({phase['rate_bps'] / 1e6:.3g} Mbit/s), {self.clock() - began:.2f} s to apply", file=self.log, flush=True)
