"""Bench reports as people read them: the terminal table, the markdown page, the per-strategy summary.

`caramel.bench.report` holds the records and their arithmetic; this module only formats them.
"""
from __future__ import annotations

from typing import Any

from caramel.bench.matrix import value_label
from caramel.bench.report import (PLAN_LINE_BUCKETS, Record, StrategySummary, ceiling_s, ceiling_speedup, config_label,
                                  efficiency, summarize_strategies)
from caramel.bench.prediction import ACCURACY_TARGET, RECOMMENDATION_TOLERANCE, records_accuracy, recommendation_checks
from caramel.strategies.caramel.trial import confirmation_note


def format_summary(summaries: list[StrategySummary]) -> str:
    """One line per strategy: measured facts, no verdicts."""
    if not summaries:
        return "- no strategy other than DDP was measured"
    lines = []
    for s in summaries:
        if not s.rows:
            lines.append(f"- `{s.strategy}`: no configuration measured it together with a DDP reference")
            continue
        parts = []
        if s.geomean_speedup is not None:
            ceil = f" (estimated ceiling {s.ceiling_geomean_speedup:.3f}x)" if s.ceiling_geomean_speedup else ""
            parts.append(f"geomean speedup {s.geomean_speedup:.3f}x over {s.headline_rows} balanced and comm-bound "
                         f"point(s){ceil}")
        else:
            parts.append("no balanced or comm-bound point")
        if s.median_share_captured is not None:
            parts.append(f"median share of the possible gain captured {s.median_share_captured:.0%} "
                         f"({s.share_rows} point(s))")
        ci = f" ({s.worst_ci95[0]:.3f}-{s.worst_ci95[1]:.3f})" if s.worst_ci95 else ""
        parts.append(f"worst {s.worst_speedup:.3f}x{ci} on {s.worst_configuration}")
        lines.append(f"- `{s.strategy}`: " + "; ".join(parts))
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def _x(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


COLUMNS = ("configuration", "point", "target", "comm/comp", "rate", "strategy", "median ms", "p90 ms", "compute ms",
           "comm ms", "concurrent ms", "exposed ms", "reference", "speedup", "95% interval", "share", "E", "bound ms",
           "wire kB/sample")
_LEFT = (0, 1, 5, 12)


def _basis_note(r: Record) -> str:
    return " (block mean: its drain is timed)" if r.step_basis == "mean" else ""


def _step_cell(r: Record) -> str:
    """The "median ms" column: the median, or the block mean marked as such (`Record.step_basis`)."""
    if r.skipped:
        return "skipped"
    return f"{_ms(r.step_s)} (block mean)" if r.step_basis == "mean" else _ms(r.step_s)


def table_rows(records: list[Record]) -> list[list[str]]:
    rows = []
    for r in records:
        rate = f"{r.bandwidth} ({r.rate_source})" if r.bandwidth else "loopback"
        rows.append([config_label(r), r.point_regime, _x(r.target_ratio, "{:g}"), _x(r.comm_compute_ratio), rate,
                     r.strategy, _step_cell(r), _ms(r.step_time_p90_s),
                     _ms(r.compute_s), _ms(r.comm_s), _ms(r.concurrent_s), _ms(r.exposed_comm_s), r.reference or "-",
                     _x(r.speedup, "{:.3f}x"),
                     "-" if r.speedup_ci95 is None else f"{r.speedup_ci95[0]:.2f}-{r.speedup_ci95[1]:.2f}",
                     _x(r.share_captured, "{:.0%}"), _x(r.efficiency), _ms(r.lower_bound_s),
                     _x(None if r.wire_bytes_per_sample is None else r.wire_bytes_per_sample / 1e3, "{:.1f}")])
    return rows


def format_table(records: list[Record]) -> str:
    """A fixed-width terminal table, one row per configuration x strategy."""
    rows = [list(COLUMNS)] + table_rows(records)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i in _LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in records:
        if r.skipped:
            lines.append(f"skipped {r.strategy} on {config_label(r)}: {r.skipped}")
    return "\n".join(lines)


def format_markdown(records: list[Record], command: str, environment: dict[str, Any], notes: str = "") -> str:
    """The markdown report (docs/results/bench.md is one of these; docs/benchmarks.md defines its terms)."""
    head = ("| " + " | ".join(COLUMNS) + " |\n|"
            + "|".join("---" if i in _LEFT else "---:" for i in range(len(COLUMNS))) + "|\n")
    body = "".join("| " + " | ".join(row) + " |\n" for row in table_rows(records))
    env = "\n".join(f"- {k}: {v}" for k, v in environment.items())
    tuning = format_tuning(records)
    skipped = "".join(f"\n- skipped `{r.strategy}` on {config_label(r)}: {r.skipped}" for r in records if r.skipped)
    return (
        "# Bench: Caramel against the stronger DDP\n\n"
        "Generated by `caramel bench` (definitions: docs/benchmarks.md); rerun with:\n\n"
        f"```\n{command}\n```\n\n"
        "## Environment\n\n" + env + "\n\n"
        "## Points\n\n" + format_points(records) + "\n\n"
        + (("## Tuned references\n\nA strategy with a `KEY=tuned` option had that option screened in its job before "
            "the rounds, once every strategy was built, on the same processes, links and thread priority: each "
            "value's median job step over the screening (its blocks alternating with the other values' only), the "
            "lowest chosen, its runner-up's gap with the paired-rounds interval, and the chosen value built afresh "
            "and measured in the interleaved rounds (`caramel.bench.screening`).\n\n"
            + tuning + "\n\n") if tuning else "")
        + "## Summary\n\n" + format_summary(summarize_strategies(records)) + "\n\n"
        "## Results\n\n"
        "Medians (p90) of the job's step (how far the slowest rank's clock advanced), strategies interleaved in "
        "rounds in one job per configuration. point: the regime the point stands for; target: its comm/compute; "
        "comm/comp: measured in the job (comm-only over compute-only baseline); rate: the links' rate, derived "
        "from the target at run start or pinned; concurrent: both baselines at once, independent (perfect overlap "
        "as this host runs it); reference: the stronger DDP variant of the configuration; speedup: reference "
        "median / strategy median, with its 95% interval from the paired rounds; share: (reference - T) / "
        "(reference - ceiling), the ceiling being max(bound, min(concurrent, compute + comm)); "
        "E = (U - T) / (U - L); bound: the simulator's lower bound on links of the rate the comm-only baseline "
        "achieved; wire: kB all workers transmitted per training sample, read from their network "
        "namespaces' interface counters (headers included; not measured on shared loopback).\n\n"
        + head + body + skipped + "\n\n"
        "## Where the time goes\n\n" + format_breakdown(records) + "\n\n"
        "## The simulator against the measurement\n\n" + format_predictions(records) + "\n"
        + (f"\n## Notes\n\n{notes.strip()}\n" if notes.strip() else "")
    )


def format_points(records: list[Record]) -> str:
    """Per configuration: the target, the compute time the rate was derived from, the rate, what was measured."""
    lines = []
    seen: set[str] = set()
    for r in records:
        label = config_label(r)
        if label in seen:
            continue
        seen.add(label)
        if r.rate_source == "derived":
            how = (f"target comm/compute {r.target_ratio:g} ({r.intended_regime}): compute {_ms(r.calibrated_compute_s)} ms "
                   f"at run start -> {r.bandwidth}")
        elif r.rate_source == "pinned":
            how = f"rate pinned at {r.bandwidth}"
        else:
            how = "unshaped loopback"
        ref = next((x for x in records if config_label(x) == label and x.strategy == r.reference), None)
        chosen = (f" ({ref.tuning['option']}={value_label(ref.tuning['chosen'])} chosen)"
                  if ref is not None and ref.tuning else "")
        lines.append(f"- {label}: {how}; measured compute {_ms(r.compute_s)} ms, comm {_ms(r.comm_s)} ms, "
                     f"comm/compute {r.comm_compute_ratio:.2f} ({r.regime}); reference {r.reference or '-'}{chosen}")
    return "\n".join(lines)


def format_tuning(records: list[Record]) -> str:
    """Per configuration and tuned strategy: every screened value's median, the one chosen, the
    runner-up's gap with its interval, and the chosen value's median in the rounds ('' if none)."""
    lines = []
    for r in records:
        t = r.tuning
        if not t:
            continue
        best = t["values"].index(t["chosen"])
        values = ", ".join((f"**{value_label(v)} {_ms(m)}**" if i == best else f"{value_label(v)} {_ms(m)}")
                           for i, (v, m) in enumerate(zip(t["values"], t["median_s"])))
        per_value = t["steps"] // max(t["rounds"], 1)
        line = (f"- {config_label(r)}, `{r.strategy}`: {t['option']} screened in {t['rounds']} rounds x {per_value} "
                f"steps ({t['steps']} steps per value), median ms: {values} -> {value_label(t['chosen'])} "
                f"(`{t['chosen_strategy']}`)")
        if t.get("runner_up_gap") is not None:
            ci = t.get("runner_up_ci95")
            line += (f"; runner-up {value_label(t['runner_up'])} {t['runner_up_gap']:+.1%}"
                     + (f" (runner-up / chosen {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""))
        if r.step_s is not None:
            line += f"; in the rounds {_ms(r.step_s)} ms"
        if t.get("skipped"):
            line += "; not built: " + "; ".join(f"{n} ({e})" for n, e in t["skipped"].items())
        lines.append(line)
    return "\n".join(lines)


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
            ceiling_x = ceiling_speedup(r0)
            ceiling_e = efficiency(ceiling_s(r0), r0.compute_s, r0.comm_s) if ceiling_x else None
            conc = (f"; both at once {_ms(r0.concurrent_s)} ms"
                    + (f"; estimated ceiling {_ms(ceiling_s(r0))} ms (E {_x(ceiling_e)}), {r0.reference} / ceiling "
                       f"{ceiling_x:.3f}x" if ceiling_x else ""))
        load += _baseline_priority_note(r0.baseline_priority)
        lines.append(f"- {label} ({r0.network}{load}): compute {_ms(r0.compute_s)} ms, comm {_ms(r0.comm_s)} ms "
                     f"(U {_ms(r0.compute_s + r0.comm_s)}, L {_ms(max(r0.compute_s, r0.comm_s))}){lb}{conc}")
        for r in rs:
            if r.step_s is None:
                continue
            over = r.step_s - max(r.compute_s, r.comm_s)
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
            lines.append(f"  - {r.strategy}: {_ms(r.step_s)} ms{_basis_note(r)}, {_ms(over)} ms above L, "
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
                if tl.get("deferred_s"):
                    lines.append(f"    deferred weight gradients {_ms(tl['deferred_s'])} ms per step; the first-needed "
                                 f"bucket ready {_ms(tl.get('first_bucket_lead_s'))} ms before backward ends")
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
    if plan.get("deferred_modules"):
        parts.append(f"weight gradients of {len(plan['deferred_modules'])} layers deferred")
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


def format_uneven(records: list[Record]) -> str:
    """Samples per second per strategy, with the shares `balance="batch"` (the drops of
    `balance="dropout"`) ended on and the
    emulated slow worker, for configurations with a slow worker or balanced shares ('' if none)."""
    lines = []
    for label in dict.fromkeys(config_label(r) for r in records):
        rows = [r for r in records if config_label(r) == label and r.samples_per_s is not None]
        if not rows or not any(r.slow_worker or r.share_counts for r in rows):
            continue
        slow = rows[0].slow_worker
        how = (f"; rank {slow['rank']} {slow['factor']:g}x slower ({slow['method']}: "
               f"{1e3 * slow['delay_per_sample_s']:.2f} ms per sample)") if slow else ""
        parts = [f"{r.strategy} {r.samples_per_s:.1f}" + (f" (shares {r.share_counts})" if r.share_counts else "")
                 + (f" (drops {r.dropout_fractions})" if r.dropout_fractions else "") for r in rows]
        lines.append(f"samples/s on {label}{how}: " + ", ".join(parts))
    return "\n".join(lines)


def _busy_line(r: Record) -> str | None:
    """A pipeline row's compute per step by position as its prediction simulated it, counted as
    the runtime's stage timer counts it (the waits inside its timed calls included), beside the
    timer's measurement (rank 0's pipeline); per stage, or per rank for unequal replica counts.
    None where either is missing, or where the runtime ran another layout than the predicted one
    (`plan_mismatch`): the simulated figure would belong to a layout that did not run."""
    pipe = r.pipeline or {}
    plan = pipe.get("predicted_plan") or {}
    timed, measured = plan.get("timed_busy_s_per_lane"), pipe.get("busy_s_per_stage")
    if not timed or not measured or pipe.get("plan_mismatch"):
        return None
    unit = "stage" if len(measured) == (pipe.get("stages") or len(measured)) else "rank"
    compute = plan.get("busy_s_per_lane")
    computing = f" (computing {[round(1e3 * t, 1) for t in compute]})" if compute else ""
    return (f"{r.strategy}: busy ms per {unit} simulated {[round(1e3 * t, 1) for t in timed]}{computing}, "
            f"measured {[round(1e3 * t, 1) for t in measured]}")


def format_predictions(records: list[Record]) -> str:
    """Per configuration each strategy's predicted step beside its measured median, the
    recommendation check, and the accuracy per strategy kind ('' without predictions)."""
    if not any(r.predicted_step_s is not None or r.prediction_note for r in records):
        return "- no predictions (one worker, or no profile)"
    lines = ["Each strategy's simulator model on the profile taken after the rounds, the link rate the "
             "comm-only baseline achieved and the fixed costs per collective a probe of the same links fitted "
             "after the rounds; the strategies' own measured steps are not used (`caramel.bench.prediction`).", ""]
    for label in dict.fromkeys(config_label(r) for r in records):
        parts = []
        for r in (r for r in records if config_label(r) == label):
            if r.predicted_step_s is None:
                parts.append(f"{r.strategy} not modelled ({r.prediction_note or 'no prediction'})")
            else:
                err = f" ({r.prediction_error:+.0%})" if r.prediction_error is not None else ""
                ignores = f" [prediction ignores {', '.join(r.prediction_ignores)}]" if r.prediction_ignores else ""
                parts.append(f"{r.strategy} {_ms(r.predicted_step_s)} ms vs {_ms(r.step_s)} ms{_basis_note(r)}{err}{ignores}")
        rows = [r for r in records if config_label(r) == label]
        f = rows[0].compute_slowdown if rows else None
        slowed = f" (compute {f:.2f}x slower beside transfers)" if f is not None and f > 1 else ""
        lines.append(f"- {label}{slowed}: " + "; ".join(parts))
        lines += [f"  - {line}" for line in (_busy_line(r) for r in rows) if line]
    marked = sum(bool(r.prediction_ignores) and r.prediction_error is not None for r in records)
    left = f"; {marked} row(s) whose simulator ignores the configuration's heterogeneity left out" if marked else ""
    checks = recommendation_checks(records, config_label)
    if checks:
        hits = sum(c.hit for c in checks)
        lines += ["", f"Recommendation (the fastest predicted of the strategies that train DDP's parameters{left}) "
                      f"was the measured fastest or within {RECOMMENDATION_TOLERANCE:.0%} of it on {hits} of "
                      f"{len(checks)} configuration(s):"]
        lines += [f"- {c.configuration}: recommended {c.recommended} ({_ms(c.recommended_step_s)} ms), measured "
                  f"fastest {c.fastest} ({_ms(c.fastest_step_s)} ms): " + ("hit" if c.hit else f"miss, {c.slowdown:+.0%}")
                  for c in checks]
    acc = records_accuracy(records)
    if not acc and marked:
        lines += ["", f"No accuracy or recommendation check: every one of the {marked} predicted row(s) comes from a "
                      "simulator that ignores the configuration's heterogeneity."]
    if acc:
        lines += ["", f"Accuracy per strategy kind (|predicted / measured - 1|; target {ACCURACY_TARGET:.0%}{left}):"]
        lines += [f"- {k}: median {a['median_abs_error']:.0%}, largest {a['max_abs_error']:.0%}, "
                  f"{a['within_target']:.0%} of {a['rows']} row(s) within the target" for k, a in acc.items()]
    bare = records_accuracy(records, "predicted_rate_only_s")
    if bare and any(r.predicted_rate_only_s != r.predicted_step_s for r in records):
        lines += ["", "The same from the link rate alone (no probed fixed costs per collective, no CPU contention):"]
        lines += [f"- {k}: median {a['median_abs_error']:.0%}, largest {a['max_abs_error']:.0%}" for k, a in bare.items()]
    return "\n".join(lines)
