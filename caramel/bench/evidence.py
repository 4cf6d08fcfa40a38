"""Timeline evidence for a report: what the engine's own trace says about where a step's time went.

With `caramel bench --trace DIR`, every caramel strategy writes one timeline per rank. The
trace tools summarize it per step (compute, communication, hidden/exposed communication, time
blocked waiting); set next to the compute-only and comm-only baselines of the same job, this
shows whether a slow step was exposed communication, or compute and communication slowing
each other down when they run at the same time (on a small host they share the cores).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from caramel.bench.strategies import trace_file_stem
from caramel.errors import CaramelError

FIELDS = ("compute_s", "comm_s", "hidden_comm_s", "exposed_comm_s", "wait_s")


def timeline_evidence(trace_dir: str | Path, strategy_name: str, skip_steps: int = 0) -> dict[str, float] | None:
    """Mean per-step compute/comm/hidden/exposed/wait (seconds) from a strategy's traces, or None.

    `skip_steps` leaves out the first steps (warm-up: the engine profiles and plans there).
    """
    stem = trace_file_stem(strategy_name)
    files = sorted(f for f in Path(trace_dir).glob(f"{stem}*.json") if f.name == f"{stem}.json"
                   or (f.name.startswith(f"{stem}.rank") and f.name[len(stem) + 5:-5].isdigit()))
    if not files:
        return None
    try:
        from caramel.trace.load import load_traces
        from caramel.trace.summary import summarize
        from caramel.trace.windows import mean_lead

        trace = load_traces([str(f) for f in files])
        try:
            summary = summarize(trace, warmup_steps=skip_steps)
        except CaramelError:  # fewer steps than the warm-up: use them all
            summary = summarize(trace)
        agg = dict(summary.aggregate)
        agg.update(_net_of_waiting(trace, summary.rank_steps))
        agg.update(mean_lead(trace, skip_steps) or {})
    except Exception as e:  # evidence is an extra; a trace the tools cannot read must not fail the bench
        print(f"caramel bench: cannot summarize the timeline of {strategy_name}: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    out = {k: float(agg[k]) for k in FIELDS + NET_FIELDS + WINDOW_FIELDS if isinstance(agg.get(k), (int, float)) and math.isfinite(agg[k])}
    return out or None


NET_FIELDS = ("busy_compute_s", "busy_hidden_comm_s")
WINDOW_FIELDS = ("first_bucket_lead_s", "deferred_s")  # caramel.trace.windows


def _net_of_waiting(trace, rank_steps) -> dict[str, float]:
    """Compute that is not time blocked on communication, and communication hidden behind *that*.

    The compute lane's `forward` event spans the whole forward, including time blocked in the
    engine's pre-hooks (the wait lane), so the trace tools' compute and hidden communication
    count waiting as computing. Subtracting the wait lane gives the real overlap.
    """
    from caramel.trace import metrics as m

    by_rank: dict[int, dict[str, list]] = {}
    for e in trace.events:
        lanes = by_rank.setdefault(e.rank, {"compute": [], "comm": [], "wait": []})
        if e.lane in lanes and e.duration_s > 0:
            lanes[e.lane].append((e.start_s, e.end_s))
    busy, hidden = [], []
    for rs in rank_steps:
        lanes = by_rank.get(rs.rank)
        if lanes is None:
            continue
        t0, t1 = rs.start_s, rs.start_s + rs.step_time_s
        c, x, w = (m.clip(lanes[k], t0, t1) for k in ("compute", "comm", "wait"))
        cw = m.intersect(c, w)
        busy.append(m.total_length(c) - m.total_length(cw))
        hidden.append(m.intersect_length(x, c) - m.intersect_length(x, cw))
    if not busy:
        return {}
    return {"busy_compute_s": sum(busy) / len(busy), "busy_hidden_comm_s": sum(hidden) / len(hidden)}


def attach_evidence(raw: dict[str, Any], trace_dir: str | None) -> None:
    """Add `raw["timeline"][strategy]` for every strategy whose traces are in `trace_dir`."""
    if not trace_dir:
        return
    timeline = {}
    skip = int(raw.get("settings", {}).get("warmup_steps", 0)) + 1
    for s in raw.get("strategies", []):
        ev = timeline_evidence(trace_dir, s["name"], skip)
        if ev is not None:
            timeline[s["name"]] = ev
    raw["timeline"] = timeline
