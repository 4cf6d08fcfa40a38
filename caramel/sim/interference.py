"""CPU interference between compute and communication on a small host: a first-order correction.

The event engine assumes a collective in flight costs the worker no compute, and compute costs
the collective nothing. On a host where the workers' compute threads, Gloo's threads and the
kernel's network stack share a few cores, neither holds: a training step runs slower while an
all-reduce streams beside it, and the all-reduce gets less goodput while the step runs
(docs/results/notes.md, "Interference").

`Interference` holds the two slowdown factors, measured once per cluster size before any
prediction (`experiments.validation.worker.measure_interference`). `corrected_step_time_s` applies
them to a finished simulation to first order: in the simulated steady state, let O be the time
per step during which the worker computes *and* a collective is in flight. If the step is bound
by compute (no wait), the overlapped compute takes `compute_slowdown` times longer, so the step
grows by (compute_slowdown - 1) * O; if it is bound by communication, the overlapped transfer
takes `comm_slowdown` times longer: (comm_slowdown - 1) * O. With factors of 1 nothing changes.
It does not re-run the schedule (later issue times, shifted windows): it is a first-order term.
"""
from __future__ import annotations

from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.sim.simulate import SimResult
from caramel.trace.events import TraceEvent
from caramel.trace.metrics import union_intervals


@dataclass(frozen=True)
class Interference:
    """Slowdown of compute while communication runs, and of communication while compute runs."""

    compute_slowdown: float = 1.0
    comm_slowdown: float = 1.0

    def __post_init__(self) -> None:
        for name in ("compute_slowdown", "comm_slowdown"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 1.0):
                raise CaramelError(f"interference {name} must be a factor >= 1, got {v!r}")


def _intersection_s(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _subtract(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union intervals `xs` minus union intervals `ys`."""
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def overlap_per_step_s(events: list[TraceEvent], rank: int, window: tuple[float, float], steps: int) -> float:
    """Mean time per step in `window` during which `rank` computes while a collective is in flight.

    Comm events span issue to completion; on one timeline their union is the time the backend
    is busy (a collective issued while another runs starts when that one ends).
    """
    assert steps >= 1
    lo, hi = window
    clip = lambda e: (max(e.start_s, lo), min(e.end_s, hi))  # noqa: E731
    # a forward event spans the waits inside it; blocked time is not compute
    waits = union_intervals([clip(e) for e in events if e.rank == rank and e.lane == "wait" and e.duration_s > 0])
    compute = _subtract(union_intervals([clip(e) for e in events if e.rank == rank and e.lane == "compute" and e.duration_s > 0]), waits)
    comm = union_intervals([clip(e) for e in events if e.rank == rank and e.kind == "comm" and e.duration_s > 0])
    return _intersection_s(compute, comm) / steps


def corrected_step_time_s(result: SimResult, interference: Interference) -> tuple[float, float]:
    """(step time with the interference term, overlap O per step) for a simulation with a trace."""
    if result.trace is None:
        raise CaramelError("the interference correction needs a simulation run with trace=True")
    rank = result.critical_path["rank"]
    starts = sorted({e.start_s for e in result.trace.events if e.rank == rank and e.kind == "forward"})
    if len(starts) < 3:
        return result.step_time_s, 0.0  # no steady state to measure (fewer than 3 unrolled steps)
    window = (starts[1], starts[-1])
    overlap = overlap_per_step_s(result.trace.events, rank, window, len(starts) - 2)
    factor = interference.comm_slowdown if result.critical_path["bound"] == "communication" else interference.compute_slowdown
    return result.step_time_s + (factor - 1.0) * overlap, overlap
