"""Tables for a simulator validation report: both predictions side by side, and two runs compared.

`markdown_table` is what docs/simulator.md publishes: per configuration the plain simulator's
prediction, the prediction with the interference term (`caramel.sim.interference`), the measured
median, both errors and the run-to-run spread. `compare_runs` puts two complete runs of the same
matrix side by side: how far apart their measured medians are (the spread between whole runs,
profile and calibration included) against the prediction errors, and how one run's measured
medians would score as the predictions of the other (`measured_as_prediction`): the host's noise
floor in the targets' own terms, how close two measurements of the same matrix come to each other.
`consensus_floor` does the same with many runs: each run scored with the median of all the other
runs' measured medians as its predictions, what a predictor that knew each configuration's usual
step time would score on that run (`floor_table` puts it beside the simulator's headline).
"""
from __future__ import annotations

import statistics
from typing import Any

from caramel.errors import CaramelError
from caramel.stats import percentile
from experiments.validation.compare import ValidationRecord, ValidationReport, score, score_line
from caramel.units import format_rate


def interference_records(report: ValidationReport) -> list[ValidationRecord]:
    """The same measurements scored against the predictions with the interference term."""
    return _records_predicted_by(report, "predicted_interference_step_time_s")


# Other predictions of the same plans, each with one input changed, scored on the same
# measurements (what that input changes): detail key -> what the line says. Since run z the
# headline replays the profile at the plain step's length; runs u-y replayed the profile as is
# and carry the plain step's prediction as an alternative.
ALTERNATIVES = {
    "predicted_lone_latency_step_time_s": "every collective paying the lone latency (no queued model; the same plans)",
    "predicted_profile_compute_step_time_s": "compute at the profile's own length (the same plans)",
    "predicted_muted_compute_step_time_s": "compute at each configuration's muted step (the same plans)",
    "predicted_plain_compute_step_time_s": "compute at the plain step timed beside the muted ones (the same plans)",
}


def alternative_records(report: ValidationReport, key: str) -> list[ValidationRecord] | None:
    """The same measurements scored against the alternative predictions under detail `key`
    (`ALTERNATIVES`); None for reports from before it, or when no prediction differs from the
    interference prediction (a calibration without that part)."""
    assert key in ALTERNATIVES, key
    details = _details(report)
    if not details or any(key not in d for d in details):
        return None
    if all(d[key] == d.get("predicted_interference_step_time_s") for d in details):
        return None
    return _records_predicted_by(report, key)


def lone_latency_records(report: ValidationReport) -> list[ValidationRecord] | None:
    """`alternative_records` with every collective paying the lone latency (no queued model)."""
    return alternative_records(report, "predicted_lone_latency_step_time_s")


def _details(report: ValidationReport) -> list[dict]:
    """Every configuration's prediction details, in the order of the report's records."""
    return [d for job in report.meta.get("jobs", []) for d in job["details"]]


def _records_predicted_by(report: ValidationReport, key: str) -> list[ValidationRecord]:
    details = _details(report)
    assert len(details) == len(report.records), "report meta does not match its records"
    return [ValidationRecord(r.config, d.get(key, r.predicted_step_time_s), r.measured_step_times_s, r.repeat_medians_s)
            for r, d in zip(report.records, details)]


def _summary(label: str, records: list[ValidationRecord]) -> str:
    return f"{label}: {score_line(score(records))}"


def markdown_table(report: ValidationReport) -> str:
    """One row per configuration with both predictions (plain simulator, + interference term)."""
    both = interference_records(report)
    lines = ["| model | workers | bandwidth | strategy | predicted ms | + interference ms | measured ms | "
             "error | error + interference | spread |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r, ri in zip(report.records, both):
        c = r.config
        lines.append(f"| {c.model} | {c.workers} | {format_rate(c.bandwidth_bps)} | {c.strategy()} | "
                     f"{r.predicted_step_time_s * 1e3:.1f} | {ri.predicted_step_time_s * 1e3:.1f} | "
                     f"{r.measured_median_s * 1e3:.1f} | {r.error * 100:+.1f}% | {ri.error * 100:+.1f}% | "
                     f"{r.spread * 100:.1f}% |")
    spreads = [r.spread for r in report.records]
    lines += ["", f"{len(report.records)} configurations; median run-to-run spread {statistics.median(spreads) * 100:.1f}%, "
                  f"p90 {percentile(spreads, 90) * 100:.1f}%.",
              "", "- " + _summary("simulator", report.records), "- " + _summary("simulator + interference term", both)]
    for key, label in ALTERNATIVES.items():
        alt = alternative_records(report, key)
        if alt is not None:
            lines.append("- " + _summary(f"simulator + interference term, {label}", alt))
    return "\n".join(lines)


def _run_key(r: ValidationRecord) -> tuple:
    """What matches a configuration across runs: setting and strategy, not the latency (each run calibrates afresh)."""
    return r.config.setting()[:3], r.config.strategy()


def compare_runs(a: ValidationReport, b: ValidationReport) -> dict[str, Any]:
    """Run-to-run differences between two reports of the same matrix (configurations matched by setting and strategy)."""
    other = {_run_key(r): r for r in b.records}
    rows = []
    for r in a.records:
        o = other.get(_run_key(r))
        if o is None:
            continue
        m1, m2 = r.measured_median_s, o.measured_median_s
        rows.append({"model": r.config.model, "workers": r.config.workers, "bandwidth_bps": r.config.bandwidth_bps,
                     "strategy": r.config.strategy(), "measured_s": [m1, m2], "predicted_s": [r.predicted_step_time_s, o.predicted_step_time_s],
                     "measured_diff": abs(m1 - m2) / statistics.fmean([m1, m2]),
                     "predicted_diff": abs(r.predicted_step_time_s - o.predicted_step_time_s) / statistics.fmean([r.predicted_step_time_s, o.predicted_step_time_s]),
                     "errors": [r.error, o.error]})
    if not rows:
        raise CaramelError("the two validation reports have no configuration in common")
    diffs = [x["measured_diff"] for x in rows]
    return {"configurations": len(rows), "median_measured_diff": statistics.median(diffs), "p90_measured_diff": percentile(diffs, 90),
            "median_predicted_diff": statistics.median(x["predicted_diff"] for x in rows), "rows": rows,
            "a_measured_predicts_b": measured_as_prediction(a, b), "b_measured_predicts_a": measured_as_prediction(b, a)}


def measured_as_prediction(a: ValidationReport, b: ValidationReport) -> dict[str, Any]:
    """`score` of run b's measurements (configurations both runs have) with run a's measured
    medians in place of the predictions: what a predictor that knew another whole run's
    measurements exactly would score on b, with b's own spreads deciding its measured ties.

    For configurations whose plan depends on the calibration (the caramel planner) the two runs
    may have run different plans; the others ran the same one."""
    return _score_against(b, {_run_key(r): r.measured_median_s for r in a.records},
                          "the two validation reports have no configuration in common")


def _score_against(scored: ValidationReport, predictions: dict[tuple, float], none_known: str) -> dict[str, Any]:
    """`score` of `scored`'s measurements against `predictions` by `_run_key` (configurations
    without one left out; `none_known` is the error when that leaves none)."""
    records = [ValidationRecord(r.config, predictions[_run_key(r)], r.measured_step_times_s, r.repeat_medians_s)
               for r in scored.records if _run_key(r) in predictions]
    if not records:
        raise CaramelError(none_known)
    return score(records)


def compare_table(cmp: dict[str, Any]) -> str:
    """Markdown for `compare_runs`."""
    lines = ["| model | workers | bandwidth | strategy | measured ms (run 1, run 2) | run-to-run | predicted ms (run 1, run 2) | errors |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for x in cmp["rows"]:
        lines.append(f"| {x['model']} | {x['workers']} | {format_rate(x['bandwidth_bps'])} | {x['strategy']} | "
                     f"{x['measured_s'][0] * 1e3:.1f}, {x['measured_s'][1] * 1e3:.1f} | {x['measured_diff'] * 100:.1f}% | "
                     f"{x['predicted_s'][0] * 1e3:.1f}, {x['predicted_s'][1] * 1e3:.1f} | "
                     f"{x['errors'][0] * 100:+.1f}%, {x['errors'][1] * 100:+.1f}% |")
    lines += ["", f"{cmp['configurations']} configurations in both runs: measured medians differ by "
                  f"{cmp['median_measured_diff'] * 100:.1f}% (median), {cmp['p90_measured_diff'] * 100:.1f}% (p90) between runs; "
                  f"predictions by {cmp['median_predicted_diff'] * 100:.1f}% (median; each run profiles and calibrates afresh)."]
    for name, first, second in (("a_measured_predicts_b", 1, 2), ("b_measured_predicts_a", 2, 1)):
        lines.append(f"- run {first}'s measured medians as the predictions of run {second}: {score_line(cmp[name])}")
    return "\n".join(lines)



MIN_CONSENSUS_RUNS = 3


def consensus_as_prediction(scored: ValidationReport, others: list[ValidationReport]) -> dict[str, Any]:
    """`score` of `scored`'s measurements with, for each configuration, the median of the other
    runs' measured medians as the prediction (configurations at least `MIN_CONSENSUS_RUNS`
    others measured): the expected step time of a configuration on this host, as well as many
    runs can tell it, without the scored run's own noise in the prediction. A predictor cannot
    be expected to do much better on that run; a floor to compare with, not a bound (a
    calibration made just before the run could follow the host's drift, which this cannot)."""
    known: dict[tuple, list[float]] = {}
    for other in others:
        for r in other.records:
            known.setdefault(_run_key(r), []).append(r.measured_median_s)
    consensus = {k: statistics.median(v) for k, v in known.items() if len(v) >= MIN_CONSENSUS_RUNS}
    return _score_against(scored, consensus,
                          f"no configuration of the scored run was measured by at least {MIN_CONSENSUS_RUNS} other runs")


def consensus_floor(reports: dict[str, ValidationReport]) -> dict[str, dict[str, Any]]:
    """Per run (by name): the simulator's headline score (with the interference term) and the
    score of the other runs' consensus (`consensus_as_prediction`) on the same measurements."""
    if len(reports) < MIN_CONSENSUS_RUNS + 1:
        raise CaramelError(f"a consensus floor needs at least {MIN_CONSENSUS_RUNS + 1} runs, got {len(reports)}")
    return {name: {"simulator": score(interference_records(rep)),
                   "consensus": consensus_as_prediction(rep, [o for n, o in reports.items() if n != name])}
            for name, rep in reports.items()}


def _short(s: dict[str, Any]) -> str:
    agree = s["ranking"]["agreement"]
    met = " (all three met)" if all(s["targets_met"].values()) else ""
    return (f"{s['median_abs_error'] * 100:.1f}% / {s['p90_abs_error'] * 100:.1f}% / "
            f"{'n/a' if agree is None else f'{agree * 100:.0f}%'}{met}")


def floor_table(floor: dict[str, dict[str, Any]]) -> str:
    """Markdown for `consensus_floor`."""
    lines = ["| run | simulator (median / p90 / ranking) | the other runs' consensus as the prediction | configurations |",
             "|---|---|---|---:|"]
    for name, x in floor.items():
        lines.append(f"| {name} | {_short(x['simulator'])} | {_short(x['consensus'])} | {x['consensus']['configurations']} |")
    n = len(floor)
    sim_all = sum(all(x["simulator"]["targets_met"].values()) for x in floor.values())
    con_all = sum(all(x["consensus"]["targets_met"].values()) for x in floor.values())
    per_target = ", ".join(f"{k.replace('_', ' ')} {sum(x['simulator']['targets_met'][k] for x in floor.values())} "
                           f"against {sum(x['consensus']['targets_met'][k] for x in floor.values())}"
                           for k in ("median_abs_error", "p90_abs_error", "ranking"))
    lines += ["", f"All three targets met in {sim_all} of {n} runs by the simulator, in {con_all} of {n} by the "
                  f"other runs' consensus; each target alone ({per_target})."]
    return "\n".join(lines)
