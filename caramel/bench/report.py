"""Bench arithmetic and reports: raw per-step times -> records -> table, markdown, JSON.

Definitions (shared/DESIGN.md, "Metrics everyone uses here"):

- a job's step time is, per step index, how far the slowest rank's clock advanced: the job
  progresses as fast as its slowest rank, so its clock after step k is the largest of the
  ranks' cumulative times, and step k takes the difference (summed over a round: the slowest
  rank's wall time). T = the median of those steps, p90 their 90th percentile. Not the slowest
  rank's time per step index: a step boundary is not a synchronization point (with forward
  overlap a rank waits for its peers in the next forward), ranks' step times can run in
  opposite phase (80, 111, 68, 103 ms against 109, 72, 107, 58 ms), and the per-index maximum
  then counts one delay twice, once on each rank (96 ms per step measured that way for a
  schedule whose ranks both ran at 84 ms per step);
- T_comm is the median of the comm-only baseline; T_compute is the median over rounds of the
  compute-only baseline's pace, the slowest rank's mean step in the round: its ranks never wait
  for one another, so with more workers than cores the scheduler can run some ranks alone on a
  core (32 ms steps) while others queue (150-180 ms steps), and the per-step series would then
  take most of its steps from whichever rank happened to run (a median of 44 ms for four ranks
  whose slowest took 69 ms per step over the round, measured);
- U = T_compute + T_comm (no overlap), L = max(T_compute, T_comm) (perfect overlap);
- T_concurrent is the median of the concurrent baseline (all of a step's communication beside
  all of its compute, independent): perfect overlap as this host really runs it, contention
  for the cores included, dependencies left out;
- the estimated ceiling is max(bound, min(T_concurrent, U)): the simulator's lower bound has the
  dependencies (a gradient is sent after it is computed, a layer waits for its update) but
  no contention, T_concurrent the contention but no dependencies, U what no overlap at all
  would cost; a schedule pays for both, so it is not expected to beat the ceiling, and
  DDP / ceiling estimates the most any schedule could gain over DDP on this host (an estimate,
  not a proof: a partial overlap could contend less than the concurrent baseline does), and
  the ceiling's own E, (U - ceiling) / (U - L), is the most of E's range this host leaves to
  any schedule;
- exposed communication = max(T - T_compute, 0); efficiency E = (U - T) / (U - L)
  (the formulas are caramel.trace.metrics', shared with the trace tools);
- speedup over DDP = T_ddp / T (same job, interleaved); its 95% interval comes from the rounds:
  round k's DDP median over the strategy's median is one paired sample of the ratio (drift
  between rounds hits both alike), and the interval is the point speedup times
  exp(+-t * sd / sqrt(k)) of the per-round log ratios (Student's t, k - 1 degrees of freedom).

A configuration's measured regime comes from comm/compute: below 0.75 compute-bound, up to
1.5 balanced, above that communication-bound.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from caramel.jsonio import format_tag, write_json
from caramel.strategies.caramel.trial import confirmation_note
from caramel.trace import metrics

KIND = "bench"
BALANCED_MIN_RATIO = 0.75
COMM_BOUND_MIN_RATIO = 1.5
# Targets from issue 3.
MAX_SLOWDOWN = 0.03
MIN_GEOMEAN_SPEEDUP = 1.3
MIN_MEDIAN_EFFICIENCY = 0.9
PLAN_LINE_BUCKETS = 8  # bucket sizes a report's plan line lists before "..."


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation (numpy's default); shared with trace metrics."""
    xs = list(values)
    assert xs, "percentile of no values"
    return metrics.percentile(xs, q)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50.0)


def geomean(values: Iterable[float]) -> float:
    xs = list(values)
    assert xs and all(x > 0 for x in xs), "geometric mean needs positive values"
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def job_step_times(rank_times: list[list[float]], steps_per_round: int | None = None) -> list[float]:
    """Per step index, how far the slowest rank's clock advanced (module docstring); the clocks
    start together at each round of `steps_per_round` steps (default: one round)."""
    assert rank_times and all(len(t) == len(rank_times[0]) for t in rank_times), "ranks must time the same steps"
    n = len(rank_times[0])
    block = steps_per_round or n or 1
    out: list[float] = []
    for start in range(0, n, block):
        clocks = [0.0] * len(rank_times)
        job = 0.0
        for k in range(start, min(start + block, n)):
            for r, ts in enumerate(rank_times):
                clocks[r] += ts[k]
            step = max(clocks) - job
            job += step
            out.append(step)
    return out


def round_means(steps: list[float], steps_per_round: int | None = None) -> list[float]:
    """The mean of each round of `steps_per_round` steps (default: one round) of a job's series:
    over a round, `job_step_times` adds up to the slowest rank's time for the round."""
    block = steps_per_round or len(steps) or 1
    return [sum(steps[i:i + block]) / len(steps[i:i + block]) for i in range(0, len(steps), block)]


def free_running_pace_s(rank_times: list[list[float]], steps_per_round: int | None = None) -> list[float]:
    """Per round, the slowest rank's mean step: the pace of ranks that never synchronize (the
    compute-only baseline; module docstring)."""
    return round_means(job_step_times(rank_times, steps_per_round), steps_per_round)


def efficiency(step_s: float, compute_s: float, comm_s: float) -> float | None:
    """E = (U - T) / (U - L); None when U == L (nothing to overlap: one of the two is zero)."""
    e = metrics.scheduling_efficiency(step_s, compute_s, comm_s)
    return None if math.isnan(e) else e


# Student's t, two-sided 95%, by degrees of freedom (1..30); beyond, the normal 1.96.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
MIN_ROUNDS_FOR_INTERVAL = 3


def speedup_interval(ddp_s: list[float], strategy_s: list[float], steps_per_round: int) -> tuple[float, float] | None:
    """95% interval of T_ddp / T from the per-round paired log ratios (module docstring), or None
    with fewer than 3 rounds."""
    assert steps_per_round > 0
    k = min(len(ddp_s), len(strategy_s)) // steps_per_round
    if k < MIN_ROUNDS_FOR_INTERVAL:
        return None
    logs = [math.log(median(ddp_s[i * steps_per_round:(i + 1) * steps_per_round])
                     / median(strategy_s[i * steps_per_round:(i + 1) * steps_per_round])) for i in range(k)]
    mean = sum(logs) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (k - 1))
    half = (_T95[k - 2] if k - 1 <= len(_T95) else 1.96) * sd / math.sqrt(k)
    point = median(ddp_s) / median(strategy_s)
    return point * math.exp(-half), point * math.exp(half)


def regime_of(comm_s: float, compute_s: float) -> str:
    ratio = comm_s / compute_s
    if ratio < BALANCED_MIN_RATIO:
        return "compute-bound"
    return "balanced" if ratio <= COMM_BOUND_MIN_RATIO else "comm-bound"


@dataclass
class Record:
    """One configuration x strategy: the row of every report."""

    model: str
    workers: int
    bandwidth: str | None
    strategy: str
    step_time_median_s: float | None
    step_time_p90_s: float | None
    step_time_mean_s: float | None
    compute_s: float
    comm_s: float
    exposed_comm_s: float | None
    speedup_vs_ddp: float | None
    efficiency: float | None
    comm_compute_ratio: float
    regime: str
    """measured: compute-bound, balanced or comm-bound"""
    intended_regime: str
    batch_size: int | None
    model_options: dict[str, Any]
    network: str
    steps: int
    grad_bytes: int | None
    lower_bound_s: float | None = None
    concurrent_s: float | None = None
    """the concurrent baseline's median: perfect overlap as this host runs it (None in older raw files)"""
    speedup_ci95: tuple[float, float] | None = None
    """95% interval of speedup_vs_ddp from the per-round paired ratios (None: fewer than 3 rounds, or no DDP)"""
    engine_wait_per_step_s: float | None = None
    """caramel strategies: the engine's own time blocked on communication per step (rank 0, all steps)"""
    load_average: float | None = None
    """the host's 1-minute load average when the configuration's rounds ended"""
    overlap_trial: dict[str, Any] | None = None
    """caramel with overlap="auto": the trial's step period per candidate schedule (slowest rank) and the one chosen"""
    delegated_to_ddp: bool = False
    """caramel: the trial kept DDP's schedule and torch DDP ran it from then on (the engine's timeline stops there)"""
    plan: dict[str, Any] | None = None
    """caramel: the plan the engine ran last (`Engine.stats_dict()["plan"]`): order, bucket sizes, prediction, the link it assumed"""
    comm_priority: dict[str, Any] | None = None
    """the CPU priority its communication threads ran at (`caramel.runtime.comm_priority.CommPriority.to_dict()`);
    None for DDP as users run it (normal priority, the job's own group)"""
    baseline_priority: dict[str, Any] | None = None
    """the priority the comm-only and concurrent baselines' communication threads ran at (as the
    engine's by default, `caramel.bench.strategies.baseline_group`); None: the job's own group"""
    timeline: dict[str, float] | None = None
    """with --trace: mean per-step compute_s, comm_s, hidden_comm_s, exposed_comm_s, wait_s from the timeline"""
    skipped: str | None = None


def summarize(raw: dict[str, Any]) -> list[Record]:
    """Records for every strategy of one raw job (see module docstring for the arithmetic)."""
    cfg, meta = raw["config"], raw.get("meta", {})
    spr = raw.get("settings", {}).get("steps_per_round")
    series = {name: job_step_times(rt, spr) for name, rt in raw["step_times_s"].items()}
    compute_s = median(round_means(series["compute"], spr))  # its pace (free_running_pace_s)
    comm_s = median(series["comm"])
    concurrent_s = median(series["concurrent"]) if series.get("concurrent") else None
    ddp = series.get("ddp")
    ddp_s = median(ddp) if ddp else None
    ratio = comm_s / compute_s
    common = dict(model=cfg["model"], workers=cfg["workers"], bandwidth=cfg.get("bandwidth"), compute_s=compute_s,
                  comm_s=comm_s, comm_compute_ratio=ratio, regime=regime_of(comm_s, compute_s),
                  intended_regime=cfg.get("regime", "custom"), batch_size=cfg.get("batch_size"),
                  model_options=dict(cfg.get("model_options", {})), network=meta.get("network", "unknown"),
                  grad_bytes=meta.get("grad_bytes"), lower_bound_s=raw.get("lower_bound_s"), concurrent_s=concurrent_s,
                  load_average=(meta.get("load_average") or [None])[0],
                  baseline_priority=raw.get("stats", {}).get("comm", {}).get("comm_priority"))
    records = []
    for s in raw["strategies"]:
        name = s["name"]
        if name not in series:
            records.append(Record(strategy=name, step_time_median_s=None, step_time_p90_s=None, step_time_mean_s=None,
                                  exposed_comm_s=None, speedup_vs_ddp=None, efficiency=None, steps=0,
                                  skipped=raw.get("skipped", {}).get(name, "not measured"), **common))
            continue
        xs = series[name]
        t = median(xs)
        st = raw.get("stats", {}).get(name, {})
        wait = st["total_wait_s"] / st["step"] if st.get("step") and "total_wait_s" in st else None
        ci = speedup_interval(ddp, xs, spr) if ddp and spr and name != "ddp" else None
        records.append(Record(
            strategy=name, step_time_median_s=t, step_time_p90_s=percentile(xs, 90), step_time_mean_s=sum(xs) / len(xs),
            exposed_comm_s=metrics.exposed_comm_s(t, compute_s), speedup_vs_ddp=(ddp_s / t) if ddp_s else None,
            efficiency=efficiency(t, compute_s, comm_s), steps=len(xs), engine_wait_per_step_s=wait, speedup_ci95=ci,
            overlap_trial=st.get("overlap_trial"), delegated_to_ddp=bool(st.get("delegated_to_ddp")),
            plan=st.get("plan"), comm_priority=st.get("comm_priority"), timeline=raw.get("timeline", {}).get(name),
            **common))
    return records


@dataclass
class TargetResult:
    name: str
    met: bool | None
    """None: not evaluable (e.g. no caramel records)"""
    value: str
    detail: str


def check_targets(records: list[Record], strategy: str = "caramel") -> list[TargetResult]:
    """Issue 3's three targets for `strategy` against ddp, evaluated honestly on what was measured."""
    rows = [r for r in records if r.strategy == strategy and r.step_time_median_s is not None]
    out = []
    vs = [r for r in rows if r.speedup_vs_ddp is not None]
    if vs:
        worst = min(vs, key=lambda r: r.speedup_vs_ddp)
        slowdown = 1.0 / worst.speedup_vs_ddp - 1.0
        ci = (f" (95% interval of its speedup {worst.speedup_ci95[0]:.3f}x-{worst.speedup_ci95[1]:.3f}x)"
              if worst.speedup_ci95 else "")
        out.append(TargetResult(f"{strategy} never slower than DDP by more than {MAX_SLOWDOWN:.0%}", slowdown <= MAX_SLOWDOWN,
                                f"worst {slowdown:+.1%}", f"worst configuration: {config_label(worst)}{ci}"))
    else:
        out.append(TargetResult(f"{strategy} never slower than DDP by more than {MAX_SLOWDOWN:.0%}", None, "n/a",
                                f"no configuration measured both {strategy} and ddp"))
    bound = [r for r in vs if r.regime != "compute-bound"]
    if bound:
        g = geomean(r.speedup_vs_ddp for r in bound)
        detail = f"over {len(bound)} configuration(s) with comm/compute >= {BALANCED_MIN_RATIO}"
        ceilings = [c for c in (ceiling_speedup(r) for r in bound) if c is not None]
        if len(ceilings) == len(bound):
            detail += (f"; the estimated ceiling on this host (DDP / max(bound, min(concurrent, U)), measured in the same "
                       f"runs) is {geomean(ceilings):.3f}x over the same configurations")
        out.append(TargetResult(f"geomean speedup >= {MIN_GEOMEAN_SPEEDUP}x on balanced + comm-bound", g >= MIN_GEOMEAN_SPEEDUP,
                                f"{g:.3f}x", detail))
    else:
        out.append(TargetResult(f"geomean speedup >= {MIN_GEOMEAN_SPEEDUP}x on balanced + comm-bound", None, "n/a",
                                f"no measured configuration had comm/compute >= {BALANCED_MIN_RATIO}"))
    es = [r.efficiency for r in rows if r.efficiency is not None]
    if es:
        m = median(es)
        detail = f"over {len(es)} configuration(s)"
        concurrent_e = [efficiency(r.concurrent_s, r.compute_s, r.comm_s) for r in rows
                        if r.efficiency is not None and r.concurrent_s is not None]
        if len(concurrent_e) == len(es) and all(e is not None for e in concurrent_e):
            detail += (f"; the concurrent baseline (perfect overlap as this host runs it) reaches median E "
                       f"{median(concurrent_e):.2f} over the same configurations")
        ceiling_e = [efficiency(c, r.compute_s, r.comm_s) for r in rows if r.efficiency is not None
                     for c in [ceiling_s(r)] if c is not None]
        if len(ceiling_e) == len(es) and all(e is not None for e in ceiling_e):
            cm = median(ceiling_e)
            detail += f", the estimated ceiling (the bound's dependencies as well) median E {cm:.2f}"
            if cm < MIN_MEDIAN_EFFICIENCY:
                detail += (f": below {MIN_MEDIAN_EFFICIENCY}, so no schedule is expected to reach the target on this "
                           "host, and the ceiling's E is the yardstick here")
        out.append(TargetResult(f"median efficiency E >= {MIN_MEDIAN_EFFICIENCY}", m >= MIN_MEDIAN_EFFICIENCY, f"{m:.2f}",
                                detail))
    else:
        out.append(TargetResult(f"median efficiency E >= {MIN_MEDIAN_EFFICIENCY}", None, "n/a", "no efficiency measured"))
    return out


def ceiling_s(r: Record) -> float | None:
    """The estimated best step any schedule could reach on this host (module docstring), or None
    without the concurrent baseline and the bound."""
    if r.concurrent_s is None or r.lower_bound_s is None:
        return None
    return max(r.lower_bound_s, min(r.concurrent_s, r.compute_s + r.comm_s))


def ceiling_speedup(r: Record) -> float | None:
    """DDP's step over the estimated ceiling: the most a schedule could be expected to gain over DDP here."""
    c = ceiling_s(r)
    if c is None or r.speedup_vs_ddp is None or r.step_time_median_s is None:
        return None
    return r.speedup_vs_ddp * r.step_time_median_s / c


def config_label(r: Record) -> str:
    opts = "".join(f",{k}={v}" for k, v in sorted(r.model_options.items()))
    batch = f"b={r.batch_size}" if r.batch_size else ""
    return f"{r.model}({batch}{opts}) x{r.workers} @ {r.bandwidth or 'loopback'}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def _x(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


COLUMNS = ("configuration", "regime", "comm/comp", "strategy", "median ms", "p90 ms", "compute ms", "comm ms",
           "concurrent ms", "exposed ms", "speedup", "95% interval", "E", "bound ms")


def table_rows(records: list[Record]) -> list[list[str]]:
    rows = []
    for r in records:
        rows.append([config_label(r), r.regime, _x(r.comm_compute_ratio), r.strategy,
                     _ms(r.step_time_median_s) if not r.skipped else "skipped", _ms(r.step_time_p90_s),
                     _ms(r.compute_s), _ms(r.comm_s), _ms(r.concurrent_s), _ms(r.exposed_comm_s), _x(r.speedup_vs_ddp, "{:.3f}x"),
                     "-" if r.speedup_ci95 is None else f"{r.speedup_ci95[0]:.2f}-{r.speedup_ci95[1]:.2f}",
                     _x(r.efficiency), _ms(r.lower_bound_s)])
    return rows


def format_table(records: list[Record]) -> str:
    """A fixed-width terminal table, one row per configuration x strategy."""
    rows = [list(COLUMNS)] + table_rows(records)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i in (0, 1, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in records:
        if r.skipped:
            lines.append(f"skipped {r.strategy} on {config_label(r)}: {r.skipped}")
    return "\n".join(lines)


def format_targets(results: list[TargetResult]) -> str:
    word = {True: "MET", False: "NOT MET", None: "NOT EVALUATED"}
    return "\n".join(f"- {t.name}: **{word[t.met]}** ({t.value}; {t.detail})" for t in results)


def format_markdown(records: list[Record], command: str, environment: dict[str, Any], notes: str = "") -> str:
    """The markdown report (docs/benchmarks.md is one of these)."""
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" if i in (0, 1, 3) else "---:" for i in range(len(COLUMNS))) + "|\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in table_rows(records))
    env = "\n".join(f"- {k}: {v}" for k, v in environment.items())
    skipped = "".join(f"\n- skipped `{r.strategy}` on {config_label(r)}: {r.skipped}" for r in records if r.skipped)
    return (
        "# Benchmarks: Caramel vs PyTorch DDP\n\n"
        "Generated by `caramel bench`; rerun with:\n\n"
        f"```\n{command}\n```\n\n"
        "## Environment\n\n" + env + "\n\n"
        "## Results\n\n"
        "Step times are medians (p90) over steps of how far the slowest rank's clock advanced per step (the job "
        "runs at its slowest rank's pace; a step boundary is not a synchronization point, so the slowest rank's "
        "time per step index would count a delay once on each rank), strategies interleaved in rounds in one job "
        "per configuration. compute/comm are the compute-only and comm-only baselines of the same job (compute at "
        "its pace: the slowest rank's mean step per round, as its ranks never wait for one another; on CPU, "
        "the comm-only and concurrent baselines' communication threads run at the priority the engine gives its "
        "own by default, said per configuration below); "
        "concurrent is both at once, independent of each other (all communication issued at the top of the "
        "step, awaited at its end: perfect overlap as this host runs it, the cores' contention included, no "
        "dependencies); the estimated ceiling of a configuration is max(bound, min(concurrent, U)): a schedule "
        "pays for the dependencies the bound has and for the contention the concurrent baseline has, so DDP / "
        "ceiling estimates the most any schedule could gain over DDP here; "
        "exposed = max(median - compute, 0); speedup = DDP median / strategy median, with its 95% interval from "
        "the per-round paired ratios (the rounds' spread: a speedup whose interval holds 1.0 is not "
        "distinguishable from DDP in this run); E = (U - T) / (U - L) with "
        "U = compute + comm, L = max(compute, comm); bound = the simulator's lower bound for the "
        "profiled model on links of the rate the comm-only baseline achieved. The regime is measured (comm/compute < 0.75 compute-bound, "
        "<= 1.5 balanced, else comm-bound).\n\n"
        + head + body + skipped + "\n\n"
        "## Targets (issue 3)\n\n" + format_targets(check_targets(records)) + "\n\n"
        "## Where the time goes\n\n" + format_breakdown(records) + "\n"
        + (f"\n## Notes\n\n{notes.strip()}\n" if notes.strip() else "")
    )


def format_breakdown(records: list[Record]) -> str:
    """Per configuration: each strategy's step against compute, comm, the bound and the engine's own wait."""
    lines = []
    by_config: dict[str, list[Record]] = {}
    for r in records:
        by_config.setdefault(config_label(r), []).append(r)
    for label, rs in by_config.items():
        r0 = rs[0]
        lb = f", simulator lower bound {_ms(r0.lower_bound_s)} ms" if r0.lower_bound_s is not None else ""
        load = f", host load {r0.load_average:.1f}" if r0.load_average is not None else ""
        conc = ""
        if r0.concurrent_s is not None:
            ddp = next((r for r in rs if r.strategy == "ddp"), None)
            ceiling_x = ceiling_speedup(ddp) if ddp is not None else None
            ceiling_e = efficiency(ceiling_s(r0), r0.compute_s, r0.comm_s) if ceiling_x else None
            conc = (f"; both at once {_ms(r0.concurrent_s)} ms"
                    + (f"; estimated ceiling {_ms(ceiling_s(r0))} ms (E {_x(ceiling_e)}), DDP / ceiling {ceiling_x:.3f}x"
                       if ceiling_x else ""))
        load += _baseline_priority_note(r0.baseline_priority)
        lines.append(f"- {label} ({r0.network}{load}): compute {_ms(r0.compute_s)} ms, comm {_ms(r0.comm_s)} ms "
                     f"(U {_ms(r0.compute_s + r0.comm_s)}, L {_ms(max(r0.compute_s, r0.comm_s))}){lb}{conc}")
        for r in rs:
            if r.step_time_median_s is None:
                continue
            over = r.step_time_median_s - max(r.compute_s, r.comm_s)
            wait = (f"; the engine was blocked on communication {_ms(r.engine_wait_per_step_s)} ms per step"
                    if r.engine_wait_per_step_s is not None else "")
            trial = ""
            if r.overlap_trial:
                predicted = r.overlap_trial.get("predicted_step_time_s") or {}
                periods = ", ".join(f"{m} {_ms(v)} ms" + (f" (predicted {_ms(predicted[m])} ms)" if m in predicted else "")
                                    for m, v in r.overlap_trial["step_period_s"].items())
                trial = f"; overlap trial: {periods} -> {r.overlap_trial['chosen']}"
                if note := confirmation_note(r.overlap_trial):
                    trial += f" ({note})"
                if r.delegated_to_ddp:
                    trial += " (run by torch DDP from then on)"
            lines.append(f"  - {r.strategy}: {_ms(r.step_time_median_s)} ms, {_ms(over)} ms above L, "
                         f"{_ms(r.exposed_comm_s)} ms above compute{wait}{trial}{_priority_note(r.comm_priority)}")
            if r.plan and not r.delegated_to_ddp:
                lines.append(f"    plan: {_plan_line(r.plan)}")
            if r.timeline and not r.delegated_to_ddp:
                tl = r.timeline
                lines.append(f"    timeline (mean per step): compute lane {_ms(tl.get('compute_s'))} ms, of which "
                             f"{_ms(tl.get('busy_compute_s'))} ms computing and the rest blocked (alone: {_ms(r.compute_s)}); "
                             f"communication {_ms(tl.get('comm_s'))} ms (alone: {_ms(r.comm_s)}), "
                             f"{_ms(tl.get('busy_hidden_comm_s'))} ms of it behind real computation; "
                             f"blocked waiting {_ms(tl.get('wait_s'))} ms")
    return "\n".join(lines)


def _baseline_priority_note(prio: dict[str, Any] | None) -> str:
    """The priority the baselines' communication threads ran at, if they had a group of their own."""
    return ", " + _threads_at(prio, "baselines' communication threads") if prio else ""


def _priority_note(prio: dict[str, Any] | None) -> str:
    """Where a strategy's communication threads ran at a priority of their own: which, and why not real-time."""
    if not prio or prio.get("mode") == "normal":
        return ""
    return "; " + _threads_at(prio, "communication threads", count=True)


def _threads_at(prio: dict[str, Any], who: str, count: bool = False) -> str:
    """`who` at real-time priority (how many threads, with `count`), or at normal priority and why."""
    if prio.get("applied") == "realtime":
        return f"{who} at real-time priority" + (f" ({prio.get('threads')} threads)" if count else "")
    return f"{who} at normal priority ({prio.get('reason')})"


def _plan_line(plan: dict[str, Any]) -> str:
    """One line for a plan summary: buckets, order, prediction, and the link it was made for."""
    sizes = plan.get("bucket_bytes") or []
    shown = ", ".join(f"{b / 1e6:.2f}" for b in sizes[:PLAN_LINE_BUCKETS]) + (", ..." if len(sizes) > PLAN_LINE_BUCKETS else "")
    parts = [f"{plan.get('planner')} {plan.get('order') or ''}".strip(),
             f"{len(sizes)} buckets ({shown} MB), {plan.get('items')} collectives"]
    if plan.get("predicted_step_time_s") is not None:
        parts.append(f"predicted {_ms(plan['predicted_step_time_s'])} ms")
    link = []
    if plan.get("bandwidth_bps"):
        link.append(f"{plan['bandwidth_bps'] / 1e6:.0f} Mbit/s")
    if plan.get("latency_s") is not None:
        queued = plan.get("queued_latency_s")
        link.append(f"alpha {plan['latency_s'] * 1e3:.2f} ms" + (f" ({queued * 1e3:.2f} ms queued)" if queued is not None else ""))
    if plan.get("collective_cpu_s"):
        link.append(f"{plan['collective_cpu_s'] * 1e3:.2f} ms compute pause per collective")
    if link:
        parts.append("for " + ", ".join(link))
    return "; ".join(parts)


def to_json(records: list[Record], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`caramel.bench/1`: {"records": [...], "targets": [...], "meta": {...}}; each record also
    carries its configuration's estimated ceiling (`ceiling_s`, None without the concurrent
    baseline or the simulator's bound)."""
    return {
        "format": format_tag(KIND),
        "records": [dict(asdict(r), ceiling_s=ceiling_s(r)) for r in records],
        "targets": [asdict(t) for t in check_targets(records)],
        "meta": dict(meta or {}),
    }


def write_records(path, records: list[Record], meta: dict[str, Any] | None = None) -> None:
    write_json(path, to_json(records, meta))
