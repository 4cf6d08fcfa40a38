"""Bench reports: a raw job's per-step times -> records -> per-strategy summary -> JSON.

The definitions and their arithmetic (step time, T_compute, U and L, the ceiling, the
reference, the regimes) are in `caramel.bench.step_metrics`; the row is
`caramel.bench.record.Record`, the markdown tables `caramel.bench.tables`. Their names are
importable from here as well.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from caramel.bench.prediction import prediction_error
from caramel.bench.record import Record, ceiling_s, ceiling_speedup, config_label
from caramel.bench.step_metrics import (REFERENCE_KIND, efficiency, estimated_ceiling_s, free_running_pace_s,
                                        job_step_times, reference_of, regime_of, round_means, share_captured)
from caramel.errors import FormatError
from caramel.jsonio import write_json
from caramel.stats import geomean, median, paired_ratio_interval, paired_rounds_interval, percentile
from caramel.trace import metrics

__all__ = ["FORMAT", "HEADLINE_REGIMES", "PLAN_LINE_BUCKETS", "REFERENCE_KIND", "BenchResults", "Record",
           "StrategySummary", "ceiling_s", "ceiling_speedup", "config_label", "efficiency", "estimated_ceiling_s",
           "free_running_pace_s", "from_json", "job_step_times", "read_records", "reference_of", "regime_of",
           "round_means", "share_captured", "summarize", "summarize_strategies", "to_json", "write_records"]

FORMAT = "caramel.bench/3"
READS_FORMATS = ("caramel.bench/2", FORMAT)  # /3 added record keys (docs/benchmarks.md); /2 files load as they are
HEADLINE_REGIMES = ("balanced", "comm-bound")
PLAN_LINE_BUCKETS = 8  # bucket sizes a report's plan line lists before "..."


def summarize(raw: dict[str, Any]) -> list[Record]:
    """Records for every strategy of one raw job (the arithmetic: `caramel.bench.step_metrics`)."""
    cfg, meta = raw["config"], raw.get("meta", {})
    spr = raw.get("settings", {}).get("steps_per_round")
    series = {name: job_step_times(rt, spr) for name, rt in raw["step_times_s"].items()}
    compute_s = median(round_means(series["compute"], spr))  # its pace (free_running_pace_s)
    comm_s = median(series["comm"])
    concurrent_s = median(series["concurrent"]) if series.get("concurrent") else None
    kinds = {s["name"]: s["kind"] for s in raw["strategies"]}
    medians = {s["name"]: median(series[s["name"]]) for s in raw["strategies"] if s["name"] in series}
    # a block that times its drain on its last step (asp) has the compute step as its median by
    # construction: its T is the block mean, total block time / steps (`caramel.bench.blocks`)
    timed_drain = {n for n, b in (raw.get("blocks") or {}).items() if b.get("drain_timed")}
    ref = reference_of(medians, kinds)
    ref_s = medians[ref] if ref else None
    ratio = comm_s / compute_s
    lower_bound = raw.get("lower_bound_s")
    ceiling = estimated_ceiling_s(lower_bound, concurrent_s, compute_s, comm_s)
    target = cfg.get("comm_ratio")
    common = dict(model=cfg["model"], workers=cfg["workers"], nproc_per_node=cfg.get("nproc_per_node", 1),
                  bandwidth=cfg.get("bandwidth"), compute_s=compute_s,
                  comm_s=comm_s, comm_compute_ratio=ratio, regime=regime_of(comm_s, compute_s),
                  intended_regime=cfg.get("regime", "custom"), batch_size=cfg.get("batch_size"),
                  model_options=dict(cfg.get("model_options", {})), slow_worker=meta.get("slow_worker"),
                  slow_link=cfg.get("slow_link"), jitter=cfg.get("jitter"), network=meta.get("network", "unknown"),
                  grad_bytes=meta.get("grad_bytes"), lower_bound_s=lower_bound, concurrent_s=concurrent_s,
                  reference=ref, reference_step_s=ref_s, target_ratio=target,
                  rate_source=(None if cfg.get("bandwidth") is None else
                               "derived" if target is not None and cfg.get("calibrated_compute_s") is not None else "pinned"),
                  calibrated_compute_s=cfg.get("calibrated_compute_s"),
                  load_average=(meta.get("load_average") or [None])[0],
                  baseline_priority=raw.get("stats", {}).get("comm", {}).get("comm_priority"),
                  link_fit={k: v for k, v in (raw.get("link_fit") or {}).items() if k != "probe"} or None,
                  compute_slowdown=raw.get("compute_slowdown"), prediction_inputs={k: v for k, v in (raw.get("prediction_inputs") or {}).items() if k != "profile"} or None)
    records = []
    for s in raw["strategies"]:
        name = s["name"]
        if name not in series:
            records.append(Record(strategy=name, step_time_median_s=None, step_time_p90_s=None, step_time_mean_s=None,
                                  exposed_comm_s=None, speedup=None, efficiency=None, steps=0,
                                  skipped=raw.get("skipped", {}).get(name, "not measured"), **common))
            continue
        xs = series[name]
        basis = "mean" if name in timed_drain else "median"
        t = sum(xs) / len(xs) if basis == "mean" else medians[name]
        st = raw.get("stats", {}).get(name, {})
        wait = st["total_wait_s"] / st["step"] if st.get("step") and "total_wait_s" in st else None
        pred = raw.get("predicted", {}).get(name, {})
        # whole rounds only, as paired_ratio_interval takes them (a partial last round is no pair)
        rounds = ([median(xs[i * spr:(i + 1) * spr]) for i in range(len(xs) // spr)] if basis == "median"
                  else round_means(xs[:len(xs) // spr * spr], spr)) if spr else None
        if not (ref and spr and name != ref):
            ci = None
        elif basis == "median":
            ci = paired_ratio_interval(series[ref], xs, spr)
        else:  # the paired rounds of the reference's medians over this row's means
            ref_rounds = [median(series[ref][i * spr:(i + 1) * spr]) for i in range(len(series[ref]) // spr)]
            ci = paired_rounds_interval(ref_rounds, rounds or [], ref_s / t) if ref_s else None
        records.append(Record(
            strategy=name, step_time_median_s=medians[name], step_basis=basis, step_time_p90_s=percentile(xs, 90),
            step_time_mean_s=sum(xs) / len(xs),
            exposed_comm_s=metrics.exposed_comm_s(t, compute_s), speedup=(ref_s / t) if ref_s else None,
            share_captured=share_captured(ref_s, t, ceiling),
            efficiency=efficiency(t, compute_s, comm_s), steps=len(xs), engine_wait_per_step_s=wait, speedup_ci95=ci,
            round_medians_s=rounds,
            overlap_trial=st.get("overlap_trial"), delegated_to_ddp=bool(st.get("delegated_to_ddp")),
            plan=st.get("plan"), comm_priority=st.get("comm_priority"), timeline=raw.get("timeline", {}).get(name),
            ps=_ps_summary(st), share_counts=st.get("share_counts"), pipeline=_pipeline_summary(s["kind"], st, pred.get("plan"),
                                                                (raw.get("pipeline_plan_mismatch") or {}).get(name)),
            dropout_fractions=st.get("dropout_fractions"), dropout_changes=st.get("dropout_changes"), tuning=(raw.get("tuning") or {}).get(name),
            samples_per_s=(meta["local_batch"] * cfg["workers"] / t) if meta.get("local_batch") and t else None,
            prediction_cluster=pred.get("cluster"), predicted_step_s=pred.get("step_time_s"),
            prediction_error=prediction_error(pred.get("step_time_s"), t), prediction_exact=pred.get("exact"),
            prediction_note=pred.get("error") or pred.get("note"), prediction_ignores=pred.get("ignores") or None,
            predicted_rate_only_s=raw.get("predicted_rate_only", {}).get(name, {}).get("step_time_s"),
            wire_bytes_per_sample=_wire_per_sample((raw.get("wire_tx") or {}).get(name), meta.get("local_batch"),
                                                   cfg["workers"]), **common))
    return records


def _wire_per_sample(wire: dict[str, int] | None, local_batch: int | None, workers: int) -> float | None:
    """The job's transmitted bytes over the samples its steps trained (every strategy trains the
    global batch, local x workers, per step)."""
    if not wire or not wire.get("steps") or not local_batch:
        return None
    return wire["bytes"] / (wire["steps"] * local_batch * workers)


PIPELINE_STATS = ("boundaries", "microbatches", "replicas", "stages", "bubble_fraction", "bubble_fraction_per_stage",
                  "bubble_fraction_ideal", "busy_s_per_stage", "predicted_busy_s_per_stage",
                  "predicted_slowest_stage_s", "bubble_steps", "planned_at", "replica_candidates_s")


def _pipeline_summary(kind: str, st: dict[str, Any], predicted_plan: dict[str, Any] | None = None,
                      mismatch: str | None = None) -> dict[str, Any] | None:
    """The cut, bubble and busy times a pipeline run's stats carry (None for other strategies),
    beside the prediction's own plan (`predicted_plan`: its cut, counts, microbatches) and what
    differs between the two (`plan_mismatch`, None when they agree)."""
    if kind != "pipeline" or not st:
        return None
    return {**{k: st.get(k) for k in PIPELINE_STATS}, "predicted_plan": predicted_plan, "plan_mismatch": mismatch}


def _ps_summary(st: dict[str, Any]) -> dict[str, Any] | None:
    """The few numbers of a ps run's stats a report row carries (None for other strategies)."""
    if st.get("strategy") != "ps":
        return None
    predicted = st.get("predicted") or {}
    return {"E_median": st.get("E_median"), "S": st.get("S"),
            "beyond_U_over_L_median": st.get("beyond_U_over_L_median"), "max_staleness": max(st.get("staleness") or [0]),
            "order": st.get("order"), "predicted_E": (predicted.get(st.get("order")) or {}).get("E"),
            "shard_imbalance": predicted.get("shard_imbalance")}


@dataclass
class StrategySummary:
    """One non-DDP strategy over the whole run, against each configuration's reference."""

    strategy: str
    rows: int
    """configurations where it and a reference were measured"""
    headline_rows: int
    """of those, balanced and comm-bound points"""
    geomean_speedup: float | None
    """over the balanced and comm-bound points"""
    ceiling_geomean_speedup: float | None
    """T_reference / ceiling over the same points (None unless every one has a ceiling)"""
    median_share_captured: float | None
    """over the balanced and comm-bound points that have a share"""
    share_rows: int
    worst_speedup: float | None
    """the lowest speedup over every point"""
    worst_ci95: tuple[float, float] | None
    worst_configuration: str | None


def summarize_strategies(records: list[Record]) -> list[StrategySummary]:
    """Per non-DDP strategy, in the order first seen: geomean speedup and median share captured
    over the balanced and comm-bound points, and the worst row."""
    names = list(dict.fromkeys(r.strategy for r in records if r.kind != REFERENCE_KIND))
    out = []
    for name in names:
        rows = [r for r in records if r.strategy == name and r.speedup is not None]
        head = [r for r in rows if r.point_regime in HEADLINE_REGIMES]
        shares = [r.share_captured for r in head if r.share_captured is not None]
        ceilings = [ceiling_speedup(r) for r in head]
        worst = min(rows, key=lambda r: r.speedup) if rows else None
        out.append(StrategySummary(
            strategy=name, rows=len(rows), headline_rows=len(head),
            geomean_speedup=geomean(r.speedup for r in head) if head else None,
            ceiling_geomean_speedup=geomean(ceilings) if head and all(c is not None for c in ceilings) else None,
            median_share_captured=median(shares) if shares else None, share_rows=len(shares),
            worst_speedup=worst.speedup if worst else None, worst_ci95=worst.speedup_ci95 if worst else None,
            worst_configuration=config_label(worst) if worst else None))
    return out


def to_json(records: list[Record], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`caramel.bench/3`: {"format", "records": [...], "summary": [...], "meta": {...}}; each record
    also carries its configuration's estimated ceiling (`ceiling_s`, None without one)."""
    return {
        "format": FORMAT,
        "records": [dict(asdict(r), ceiling_s=ceiling_s(r)) for r in records],
        "summary": [asdict(s) for s in summarize_strategies(records)],
        "meta": dict(meta or {}),
    }


def write_records(path, records: list[Record], meta: dict[str, Any] | None = None) -> None:
    write_json(path, to_json(records, meta))


@dataclass
class BenchResults:
    """A bench JSON file read back."""

    records: list[Record]
    summary: list[StrategySummary]
    meta: dict[str, Any]


_DERIVED_KEYS = ("ceiling_s",)


def from_json(data: Any, source: str = "<data>") -> BenchResults:
    """Records, summary and meta of a `caramel.bench/2` or `/3` document; a FormatError names the versions expected."""
    tag = data.get("format") if isinstance(data, dict) else None
    if tag not in READS_FORMATS:
        raise FormatError(f"{source}: format {tag!r} is not a bench result this version reads (expected one of {', '.join(map(repr, READS_FORMATS))}"
                          + ("; caramel.bench/1 files come from the link-rate matrix and its targets, before the "
                             "stronger-DDP reference" if tag == "caramel.bench/1" else "") + ")")
    names = {f.name for f in fields(Record)}
    try:
        records = []
        for d in data["records"]:
            d = {k: v for k, v in d.items() if k not in _DERIVED_KEYS}
            unknown = sorted(set(d) - names)
            if unknown:
                raise FormatError(f"{source}: unknown record keys {unknown}")
            if d.get("speedup_ci95") is not None:
                d["speedup_ci95"] = tuple(d["speedup_ci95"])
            records.append(Record(**d))
        summary = [StrategySummary(**dict(s, worst_ci95=tuple(s["worst_ci95"]) if s.get("worst_ci95") else None))
                   for s in data.get("summary", [])]
    except (KeyError, TypeError) as e:
        raise FormatError(f"{source}: not a complete {FORMAT} document ({type(e).__name__}: {e})") from None
    return BenchResults(records, summary, dict(data.get("meta", {})))


def read_records(path: str | Path) -> BenchResults:
    """Read a bench JSON file written by `write_records` (`caramel.bench/2` or `/3`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file (expected a {FORMAT} JSON file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e}); expected a {FORMAT} file") from None
    return from_json(data, str(path))
