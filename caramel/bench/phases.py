"""Per-phase results of a bandwidth-trace run: which measured step ran at which link rate.

The controller logged when each rate change began and ended (`TraceController.applied`), and
every rank logged each measured step's wall-clock start and end (`TraceClock.stamps`), on the
one host's clock. Phase k's window runs from the end of its change plus `SETTLE_S` (the old
rate's queue draining) to the beginning of the next change; a step belongs to phase k when
it lies inside that window on every rank, and to no phase when it straddles a change (those
are counted, not used). Per phase and runner: the steps, their median and, for strategies,
samples per second over the phase's steps (the global batch per step over their total time).
"""
from __future__ import annotations

import math
from typing import Any

from caramel.bench.report import job_step_times
from caramel.stats import median
from caramel.units import format_rate

SETTLE_S = 0.1
"""seconds after a change before a step counts for the new phase: tbf's 50 ms queue, twice"""
BASELINES = ("compute", "comm", "concurrent")


def phase_windows(applied: list[dict[str, Any]], n_phases: int, settle_s: float = SETTLE_S
                  ) -> list[tuple[float, float] | None]:
    """Each phase's [start, end) on the wall clock; None for a phase never (or not fully) applied."""
    by_phase = {a["phase"]: a for a in applied}
    out: list[tuple[float, float] | None] = []
    for k in range(n_phases):
        a = by_phase.get(k)
        if a is None or "error" in a:
            out.append(None)
            continue
        start = a["ended"] + (settle_s if k > 0 else 0.0)
        nxt = by_phase.get(k + 1)
        end = nxt["began"] if nxt is not None else math.inf  # no next change: this rate held to the end
        out.append((start, end) if end > start else None)
    return out


def attribute(stamps_by_rank: list[list[list[float]]], windows: list[tuple[float, float] | None]) -> list[int | None]:
    """Per step index, the phase whose window holds that step on every rank, else None."""
    assert stamps_by_rank and all(len(s) == len(stamps_by_rank[0]) for s in stamps_by_rank), \
        "ranks must stamp the same steps"
    out: list[int | None] = []
    for i in range(len(stamps_by_rank[0])):
        lo = min(s[i][0] for s in stamps_by_rank)
        hi = max(s[i][1] for s in stamps_by_rank)
        out.append(next((k for k, w in enumerate(windows) if w is not None and w[0] <= lo and hi <= w[1]), None))
    return out


def phase_results(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per phase of the raw results of a trace run (module docstring)."""
    spec = raw["bandwidth_trace"]
    phases, applied = spec["phases"], spec.get("applied", [])
    windows = phase_windows(applied, len(phases))
    t0 = applied[0]["began"] if applied else None
    spr = raw["settings"]["steps_per_round"]
    samples = raw["meta"]["local_batch"] * raw["meta"]["world_size"]
    where = {n: attribute(raw["step_stamps_s"][n], windows) for n in raw["step_stamps_s"]}
    steps = {n: job_step_times(raw["step_times_s"][n], spr) for n in where}
    out = []
    for k, phase in enumerate(phases):
        w = windows[k]
        runners: dict[str, dict[str, Any]] = {}
        for name in where:
            sel = [d for d, p in zip(steps[name], where[name]) if p == k]
            # the mean and the longest show what a median hides: a re-plan's or a trial's slow steps
            row: dict[str, Any] = {"steps": len(sel), "median_step_s": median(sel) if sel else None,
                                   "mean_step_s": sum(sel) / len(sel) if sel else None, "max_step_s": max(sel, default=None)}
            if name not in BASELINES:
                row["samples_per_s"] = samples * len(sel) / sum(sel) if sel else None
            runners[name] = row
        best = max((r["samples_per_s"] for n, r in runners.items() if r.get("samples_per_s")), default=None)
        for name, row in runners.items():
            if row.get("samples_per_s") and best:
                row["vs_best"] = row["samples_per_s"] / best
        comp, comm = runners.get("compute", {}).get("median_step_s"), runners.get("comm", {}).get("median_step_s")
        out.append({"phase": k, "rate": phase["rate"], "rate_bps": phase["rate_bps"], "duration_s": phase["duration_s"],
                    "window_s": None if w is None or t0 is None else [w[0] - t0, None if math.isinf(w[1]) else w[1] - t0],
                    "comm_compute": comm / comp if comp and comm else None, "runners": runners})
    unplaced = {n: sum(p is None for p in ps) for n, ps in where.items()}
    if out:
        out[0]["unattributed_steps"] = unplaced  # straddling a change (or in a phase not applied)
    return out


def format_phases(results: list[dict[str, Any]], title: str = "") -> str:
    """Markdown: one table per phase, strategies by samples per second."""
    lines = [title] if title else []
    for ph in results:
        win = ph["window_s"]
        span = "not applied" if win is None else f"{win[0]:.1f}-{'end' if win[1] is None else f'{win[1]:.1f}'} s"
        ratio = f", measured comm/compute {ph['comm_compute']:.2f}" if ph["comm_compute"] else ""
        lines += ["", f"Phase {ph['phase'] + 1}: {ph['rate']} ({format_rate(ph['rate_bps'])}), {ph['duration_s']:g} s "
                      f"planned, steps counted in {span}{ratio}", "",
                  "| runner | steps | median step | mean step | longest | samples/s | vs best |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, r in ph["runners"].items():
            med, mean, top = (f"{r[k] * 1e3:.1f} ms" if r.get(k) is not None else "-"
                              for k in ("median_step_s", "mean_step_s", "max_step_s"))
            sps = f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else "-"
            vs = f"{r['vs_best']:.3f}" if r.get("vs_best") else "-"
            lines.append(f"| `{name}` | {r['steps']} | {med} | {mean} | {top} | {sps} | {vs} |")
    if results and results[0].get("unattributed_steps"):
        skipped = {n: c for n, c in results[0]["unattributed_steps"].items() if c}
        if skipped:
            lines += ["", "Steps straddling a rate change (in no phase): "
                      + ", ".join(f"{n} {c}" for n, c in skipped.items())]
    return "\n".join(lines)
