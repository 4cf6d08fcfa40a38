"""Per-step metrics of a trace: where each millisecond of a step went, per rank and overall.

A step of a rank runs from the start of its forward in iteration k to the start of its forward in
iteration k+1, so the last recorded iteration (no next forward) is not a complete step and is left
out. Within a step's window, per rank:

- `compute_s`: time covered by compute-lane events (forward, backward, optimizer);
- `comm_s`: time during which at least one collective is in flight;
- `hidden_comm_s`: communication time that overlaps compute; `exposed_comm_s = comm_s - hidden`;
  overlap percent is hidden / total communication, the formula HolisticTraceAnalysis uses;
- `wait_s`: time the rank was blocked on communication (wait lane);
- `bytes`: bytes of the collectives issued in the window; algorithm bandwidth is bytes over
  communication time, bus bandwidth `algbw * 2(n-1)/n`.

Across ranks a step takes as long as its slowest rank. The straggler gap of a step is the compute
time of the slowest rank minus that of the fastest: the time the fastest rank idles at collectives.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import CaramelError, FormatError
from caramel.jsonio import format_tag, write_json
from caramel.stats import percentile
from caramel.trace import metrics as m
from caramel.trace.events import Trace
from caramel.units import format_bytes

KIND = "trace_summary"


@dataclass
class RankStep:
    """One rank's share of one step (seconds, bytes)."""

    rank: int
    step: int
    start_s: float
    step_time_s: float
    compute_s: float
    comm_s: float
    hidden_comm_s: float
    exposed_comm_s: float
    wait_s: float
    bytes: int


@dataclass
class StepMetrics:
    """One step across ranks: the slowest rank's time, per-rank means, and the straggler gap."""

    step: int
    step_time_s: float
    compute_s: float
    comm_s: float
    hidden_comm_s: float
    exposed_comm_s: float
    wait_s: float
    bytes: float
    straggler_gap_s: float
    slowest_rank: int
    fastest_rank: int


@dataclass
class TraceSummary:
    """Per-step rows, per-rank means and the aggregate metrics of one trace."""

    source: str
    world_size: int
    steps: list[StepMetrics]
    ranks: list[dict[str, Any]]
    aggregate: dict[str, Any]
    rank_steps: list[RankStep] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": format_tag(KIND),
            "source": self.source,
            "world_size": self.world_size,
            "aggregate": _finite(self.aggregate),
            "ranks": [_finite(r) for r in self.ranks],
            "steps": [_finite(asdict(s)) for s in self.steps],
            "rank_steps": [_finite(asdict(s)) for s in self.rank_steps],
            "skipped_steps": self.skipped_steps,
        }

    def save(self, path) -> None:
        write_json(path, self.to_dict())


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN; a metric that cannot be computed (no communication at all) is null
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _rank_steps(trace: Trace) -> dict[int, dict[int, RankStep]]:
    by_rank: dict[int, list] = defaultdict(list)
    for e in trace.events:
        by_rank[e.rank].append(e)
    out: dict[int, dict[int, RankStep]] = {}
    for rank, events in by_rank.items():
        fwd_start: dict[int, float] = {}
        for e in events:
            if e.kind == "forward":
                fwd_start[e.iteration] = min(fwd_start.get(e.iteration, math.inf), e.start_s)
        iters = sorted(fwd_start)
        compute = [(e.start_s, e.end_s) for e in events if e.lane == "compute"]
        comm = [(e.start_s, e.end_s) for e in events if e.lane == "comm"]
        wait = [(e.start_s, e.end_s) for e in events if e.lane == "wait"]
        comm_bytes = sorted((e.start_s, e.bytes or 0) for e in events if e.kind == "comm")
        rows = {}
        for k, nxt in zip(iters, iters[1:]):
            t0, t1 = fwd_start[k], fwd_start[nxt]
            c = m.clip(compute, t0, t1)
            x = m.clip(comm, t0, t1)
            comm_s = m.total_length(x)
            hidden = m.intersect_length(c, x)
            rows[k] = RankStep(rank, k, t0, t1 - t0, m.total_length(c), comm_s, hidden, comm_s - hidden,
                               m.total_length(m.clip(wait, t0, t1)),
                               sum(b for t, b in comm_bytes if t0 <= t < t1))
        out[rank] = rows
    return out


def summarize(trace: Trace, warmup_steps: int = 0) -> TraceSummary:
    """Per-step and aggregate metrics of `trace`; the first `warmup_steps` complete steps are skipped."""
    if warmup_steps < 0:
        raise CaramelError(f"warmup steps must be >= 0, got {warmup_steps}")
    per_rank = _rank_steps(trace)
    if not any(e.kind == "forward" for e in trace.events):
        raise FormatError("trace has no 'forward' events, so step boundaries cannot be found")
    ranks = sorted(per_rank)
    common = set.intersection(*(set(per_rank[r]) for r in ranks)) if ranks else set()
    every = set().union(*(set(per_rank[r]) for r in ranks)) if ranks else set()
    complete = sorted(common)
    skipped = sorted(every - common) + complete[:warmup_steps]
    counted = complete[warmup_steps:]
    if not counted:
        raise FormatError(f"trace has {len(complete)} complete step(s) on every rank; need more than the "
                          f"{warmup_steps} warm-up step(s) skipped (a step ends where the next forward starts)")

    steps: list[StepMetrics] = []
    rank_steps: list[RankStep] = []
    for k in counted:
        rows = [per_rank[r][k] for r in ranks]
        rank_steps.extend(rows)
        slow = max(rows, key=lambda x: (x.compute_s, -x.rank))
        fast = min(rows, key=lambda x: (x.compute_s, x.rank))
        steps.append(StepMetrics(
            step=k,
            step_time_s=max(x.step_time_s for x in rows),
            compute_s=m.mean([x.compute_s for x in rows]),
            comm_s=m.mean([x.comm_s for x in rows]),
            hidden_comm_s=m.mean([x.hidden_comm_s for x in rows]),
            exposed_comm_s=m.mean([x.exposed_comm_s for x in rows]),
            wait_s=m.mean([x.wait_s for x in rows]),
            bytes=m.mean([x.bytes for x in rows]),
            straggler_gap_s=slow.compute_s - fast.compute_s,
            slowest_rank=slow.rank,
            fastest_rank=fast.rank,
        ))

    rank_rows = []
    for r in ranks:
        rows = [per_rank[r][k] for k in counted]
        comm_total = sum(x.comm_s for x in rows)
        hidden_total = sum(x.hidden_comm_s for x in rows)
        rank_rows.append({
            "rank": r,
            "step_time_s": m.mean([x.step_time_s for x in rows]),
            "compute_s": m.mean([x.compute_s for x in rows]),
            "comm_s": m.mean([x.comm_s for x in rows]),
            "hidden_comm_s": m.mean([x.hidden_comm_s for x in rows]),
            "exposed_comm_s": m.mean([x.exposed_comm_s for x in rows]),
            "wait_s": m.mean([x.wait_s for x in rows]),
            "overlap_percent": m.overlap_percent(hidden_total, comm_total),
        })

    comm_total = sum(x.comm_s for x in rank_steps)
    hidden_total = sum(x.hidden_comm_s for x in rank_steps)
    algbw = m.algbw_bytes_per_s(sum(x.bytes for x in rank_steps), comm_total)
    times = [s.step_time_s for s in steps]
    by_compute = sorted(rank_rows, key=lambda r: (r["compute_s"], r["rank"]))
    aggregate = {
        "steps": len(steps),
        "step_time_p50_s": percentile(times, 50),
        "step_time_p90_s": percentile(times, 90),
        "step_time_mean_s": m.mean(times),
        "compute_s": m.mean([s.compute_s for s in steps]),
        "comm_s": m.mean([s.comm_s for s in steps]),
        "hidden_comm_s": m.mean([s.hidden_comm_s for s in steps]),
        "exposed_comm_s": m.mean([s.exposed_comm_s for s in steps]),
        "wait_s": m.mean([s.wait_s for s in steps]),
        "overlap_percent": m.overlap_percent(hidden_total, comm_total),
        "bytes_per_step": m.mean([s.bytes for s in steps]),
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": m.busbw_bytes_per_s(algbw, trace.world_size),
        "straggler_gap_s": m.mean([s.straggler_gap_s for s in steps]),
        "fastest_rank": by_compute[0]["rank"],
        "slowest_rank": by_compute[-1]["rank"],
    }
    return TraceSummary(trace.source, trace.world_size, steps, rank_rows, aggregate, rank_steps, skipped)


def compare(measured: TraceSummary, predicted: TraceSummary) -> dict[str, float]:
    """Predicted vs measured median step time and the simulator error |pred - meas| / meas."""
    meas = measured.aggregate["step_time_p50_s"]
    pred = predicted.aggregate["step_time_p50_s"]
    return {"measured_step_time_p50_s": meas, "predicted_step_time_p50_s": pred,
            "step_time_error": m.relative_error(pred, meas)}


def _ms(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.2f}"


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.1f}%"


def _rate(bytes_per_s: float) -> str:
    if bytes_per_s is None or not math.isfinite(bytes_per_s):
        return "-"
    return f"{bytes_per_s * 8 / 1e9:.3f} Gbit/s"


def format_summary(s: TraceSummary, max_rows: int = 20) -> str:
    """The human-readable report: per-step table (ms), per-rank table, aggregate lines."""
    a = s.aggregate
    lines = [f"{s.source} trace, {s.world_size} rank(s), {a['steps']} step(s)"
             + (f" (skipped {len(s.skipped_steps)}: warm-up or incomplete)" if s.skipped_steps else "")]
    header = f"{'step':>5} {'time':>9} {'compute':>9} {'comm':>9} {'hidden':>9} {'exposed':>9} {'wait':>9} {'bytes':>10} {'stragl':>8}"
    lines += ["", "per step (ms; compute/comm/wait are means over ranks, time is the slowest rank's)", header]
    shown = s.steps if len(s.steps) <= max_rows else s.steps[:max_rows // 2] + s.steps[-max_rows // 2:]
    for i, st in enumerate(shown):
        if len(s.steps) > max_rows and i == max_rows // 2:
            lines.append(f"{'...':>5}")
        lines.append(f"{st.step:>5} {_ms(st.step_time_s):>9} {_ms(st.compute_s):>9} {_ms(st.comm_s):>9} "
                     f"{_ms(st.hidden_comm_s):>9} {_ms(st.exposed_comm_s):>9} {_ms(st.wait_s):>9} "
                     f"{format_bytes(st.bytes):>10} {_ms(st.straggler_gap_s):>8}")
    lines += ["", "per rank (ms, mean per step)",
              f"{'rank':>5} {'time':>9} {'compute':>9} {'comm':>9} {'hidden':>9} {'exposed':>9} {'wait':>9} {'overlap':>8}"]
    for r in s.ranks:
        lines.append(f"{r['rank']:>5} {_ms(r['step_time_s']):>9} {_ms(r['compute_s']):>9} {_ms(r['comm_s']):>9} "
                     f"{_ms(r['hidden_comm_s']):>9} {_ms(r['exposed_comm_s']):>9} {_ms(r['wait_s']):>9} {_pct(r['overlap_percent']):>8}")
    lines += [
        "",
        f"step time      p50 {_ms(a['step_time_p50_s'])} ms   p90 {_ms(a['step_time_p90_s'])} ms",
        f"compute        {_ms(a['compute_s'])} ms/step",
        f"communication  {_ms(a['comm_s'])} ms/step: hidden {_ms(a['hidden_comm_s'])}, exposed {_ms(a['exposed_comm_s'])}, "
        f"overlap {_pct(a['overlap_percent'])} (hidden/total, as HTA)",
        f"blocked (wait) {_ms(a['wait_s'])} ms/step",
        f"bytes/step     {format_bytes(a['bytes_per_step'])}   algbw {_rate(a['algbw_bytes_per_s'])}   busbw {_rate(a['busbw_bytes_per_s'])}",
        f"straggler gap  {_ms(a['straggler_gap_s'])} ms/step (compute of slowest rank {a['slowest_rank']} minus fastest rank {a['fastest_rank']})",
    ]
    return "\n".join(lines)
