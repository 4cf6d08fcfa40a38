"""Bench arithmetic and reports: raw per-step times -> records -> table, summary, markdown, JSON.

Definitions (shared/DESIGN.md, "Metrics everyone uses here"):

- a job's step time is, per step index, how far the slowest rank's clock advanced: the job
  progresses as fast as its slowest rank, so its clock after step k is the largest of the
  ranks' cumulative times, and step k takes the difference. T = the median of those steps, p90
  their 90th percentile. Not the slowest rank's time per step index: a step boundary is not a
  synchronization point (with forward overlap a rank waits for its peers in the next forward),
  and ranks running in opposite phase would have one delay counted once on each rank;
- T_comm is the median of the comm-only baseline; T_compute is the median over rounds of the
  compute-only baseline's pace, the slowest rank's mean step in the round: its ranks never wait
  for one another, so with more workers than cores the per-step series would take most of its
  steps from whichever rank happened to run alone on a core;
- U = T_compute + T_comm (no overlap), L = max(T_compute, T_comm) (perfect overlap);
  exposed communication = max(T - T_compute, 0); efficiency E = (U - T) / (U - L);
- T_concurrent is the concurrent baseline (all of a step's communication beside all of its
  compute, independent): perfect overlap as this host runs it, contention included;
- the estimated ceiling is max(bound, min(T_concurrent, U)): the simulator's lower bound has the
  dependencies but no contention, T_concurrent the contention but no dependencies, U what no
  overlap at all costs; a schedule pays for both, so it is not expected to beat the ceiling;
- the reference of a configuration is the stronger (lower median) of the DDP variants measured
  in it (`ddp`, `ddp:comm_priority=realtime`, whose threads get the priority the engine gives
  its own, and `ddp:bucket_cap_mb=tuned,comm_priority=realtime`, whose bucket cap the job
  screened first, caramel.bench.screening): speedup = T_ref / T, with its 95% interval from the paired rounds
  (caramel.stats.paired_ratio_interval), and the share of the possible gain captured is
  (T_ref - T) / (T_ref - ceiling);
- a point's regime is the one its target comm/compute stands for (measured comm/compute for a
  pinned rate): below 0.75 compute-bound, up to 1.5 balanced, above that communication-bound.
  The summary takes the geomean speedup and the median share over balanced and comm-bound
  points, and the worst speedup over all.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from caramel.bench.matrix import REGIMES, regime_of_ratio
from caramel.bench.prediction import prediction_error
from caramel.errors import FormatError
from caramel.jsonio import write_json
from caramel.stats import geomean, median, paired_ratio_interval, percentile
from caramel.trace import metrics

FORMAT = "caramel.bench/2"
REFERENCE_KIND = "ddp"
"""strategies of this kind are the reference candidates: the stronger of them is every row's baseline"""
HEADLINE_REGIMES = ("balanced", "comm-bound")
PLAN_LINE_BUCKETS = 8  # bucket sizes a report's plan line lists before "..."


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


def regime_of(comm_s: float, compute_s: float) -> str:
    """The measured regime: comm/compute of the baselines."""
    return regime_of_ratio(comm_s / compute_s)


@dataclass
class Record:
    """One configuration x strategy: the row of every report."""

    model: str
    workers: int
    bandwidth: str | None
    """the link rate the job ran at (derived from target_ratio, or pinned); None: unshaped loopback"""
    strategy: str
    step_time_median_s: float | None
    step_time_p90_s: float | None
    step_time_mean_s: float | None
    compute_s: float
    comm_s: float
    exposed_comm_s: float | None
    reference: str | None
    """the stronger DDP variant of this configuration (lower median), that `speedup` is against"""
    reference_step_s: float | None
    speedup: float | None
    """T_reference / T, same job, interleaved"""
    efficiency: float | None
    comm_compute_ratio: float
    """measured: the comm-only over the compute-only baseline of the same job"""
    regime: str
    """measured: compute-bound, balanced or comm-bound"""
    intended_regime: str
    """the point's regime, from its target ratio (custom for a pinned rate)"""
    batch_size: int | None
    model_options: dict[str, Any]
    network: str
    steps: int
    grad_bytes: int | None
    target_ratio: float | None = None
    """the comm/compute the point is defined by (None: a pinned rate or loopback)"""
    rate_source: str | None = None
    """derived (from target_ratio at run start), pinned (given), or None (loopback)"""
    calibrated_compute_s: float | None = None
    """the compute step measured at run start that the rate was derived from"""
    lower_bound_s: float | None = None
    concurrent_s: float | None = None
    """the concurrent baseline's median: perfect overlap as this host runs it"""
    share_captured: float | None = None
    """(T_reference - T) / (T_reference - ceiling); None without a ceiling, or when the reference is at it"""
    speedup_ci95: tuple[float, float] | None = None
    """95% interval of speedup from the per-round paired ratios (None: fewer than 3 rounds, or the reference row)"""
    round_medians_s: list[float] | None = None
    """per round, the median job step: any two rows of a configuration pair by round (`caramel.stats.paired_rounds_interval`)"""
    engine_wait_per_step_s: float | None = None
    """caramel strategies: the engine's own time blocked on communication per step (rank 0, all steps)"""
    load_average: float | None = None
    """the host's 1-minute load average when the configuration's rounds ended"""
    overlap_trial: dict[str, Any] | None = None
    """caramel with overlap="auto": the trial's step period per candidate schedule (slowest rank) and the one chosen"""
    delegated_to_ddp: bool = False
    """caramel: the trial kept DDP's schedule and torch DDP ran it from then on (the engine's timeline stops there)"""
    plan: dict[str, Any] | None = None
    """caramel: the plan the engine ran last (`Engine.stats_dict()["plan"]`)"""
    comm_priority: dict[str, Any] | None = None
    """the CPU priority its communication threads ran at (`CommPriority.to_dict()`); None: the job's own group"""
    baseline_priority: dict[str, Any] | None = None
    """the priority the comm-only and concurrent baselines' communication threads ran at"""
    timeline: dict[str, float] | None = None
    """with --trace: mean per-step compute_s, comm_s, hidden_comm_s, exposed_comm_s, wait_s from the timeline"""
    skipped: str | None = None
    samples_per_s: float | None = None
    """the global batch (local batch x workers, the same for every strategy) over the median step"""
    share_counts: list[int] | None = None
    """caramel with balance="batch": the per-rank shares of the global batch in force at the end"""
    dropout_fractions: list[float] | None = None
    """caramel with balance="dropout": each rank's fraction of units dropped at the end"""
    slow_worker: dict[str, Any] | None = None
    """--slow-worker: the slowed rank, its factor and the calibrated delay (`caramel.bench.straggler`)"""
    predicted_step_s: float | None = None
    """the strategy's simulator model on the profile and achieved link rate (`caramel.bench.prediction`)"""
    prediction_error: float | None = None
    """predicted / measured median - 1"""
    prediction_exact: bool | None = None
    """whether the strategy trains DDP's parameters (only those are recommended)"""
    prediction_note: str | None = None
    """why there is no prediction"""
    predicted_rate_only_s: float | None = None
    """the same model from the link rate alone: no probed fixed costs per collective (the spec's
    defaults), no CPU contention"""
    link_fit: dict[str, Any] | None = None
    """the fixed costs per collective the job's probe fitted (`caramel.bench.prediction.link_costs`)"""
    compute_slowdown: float | None = None
    """how much slower compute ran beside the collectives in the concurrent baseline, slowest rank
    (`caramel.bench.contention`); the predictions' ClusterSpec carries it"""
    ps: dict[str, Any] | None = None
    """ps: TicTac's measured E (median) and S, the most staleness a step saw, the shards' byte
    imbalance (max/mean) and the plan's predicted E of its order (`PsRun.stats_dict()`, rank 0)"""
    tuning: dict[str, Any] | None = None
    """a strategy with a tuned option (`ddp:bucket_cap_mb=tuned`): its screening in the job, every
    value's median, the one chosen and the runner-up's gap (`caramel.bench.screening.Screening`)"""
    wire_bytes_per_sample: float | None = None
    """bytes all workers transmitted per training sample, measured on their interfaces (`caramel.bench.wire`;
    None on shared loopback)"""
    pipeline: dict[str, Any] | None = None
    """pipeline: the cut it ran (`boundaries`), its microbatches, the measured bubble (mean and per
    stage or, with unequal replicas, per rank), each rank's measured compute per step
    (`busy_s_per_stage`, median) and the partitioner's (`predicted_busy_s_per_stage`), from
    `PipelineRunner.stats()` (rank 0)"""

    @property
    def kind(self) -> str:
        return self.strategy.partition(":")[0]

    @property
    def point_regime(self) -> str:
        """The regime the summary counts the row in: the point's own, else the measured one."""
        return self.intended_regime if self.intended_regime in REGIMES else self.regime


def reference_of(medians: dict[str, float], kinds: dict[str, str]) -> str | None:
    """The stronger DDP variant: the lowest median among measured strategies of REFERENCE_KIND
    (the first listed on a tie); None when no DDP variant was measured."""
    candidates = [n for n in medians if kinds.get(n) == REFERENCE_KIND]
    return min(candidates, key=lambda n: medians[n]) if candidates else None


def share_captured(reference_s: float | None, step_s: float | None, ceiling: float | None) -> float | None:
    """(T_ref - T) / (T_ref - ceiling): 1 at the ceiling, 0 at the reference, negative when slower;
    None without a ceiling or when the reference is already at (or below) it."""
    if reference_s is None or step_s is None or ceiling is None or reference_s - ceiling <= 0:
        return None
    return (reference_s - step_s) / (reference_s - ceiling)


def estimated_ceiling_s(lower_bound: float | None, concurrent: float | None, compute: float, comm: float) -> float | None:
    """max(bound, min(T_concurrent, U)) (module docstring), or None without both inputs."""
    if concurrent is None or lower_bound is None:
        return None
    return max(lower_bound, min(concurrent, compute + comm))


def summarize(raw: dict[str, Any]) -> list[Record]:
    """Records for every strategy of one raw job (see module docstring for the arithmetic)."""
    cfg, meta = raw["config"], raw.get("meta", {})
    spr = raw.get("settings", {}).get("steps_per_round")
    series = {name: job_step_times(rt, spr) for name, rt in raw["step_times_s"].items()}
    compute_s = median(round_means(series["compute"], spr))  # its pace (free_running_pace_s)
    comm_s = median(series["comm"])
    concurrent_s = median(series["concurrent"]) if series.get("concurrent") else None
    kinds = {s["name"]: s["kind"] for s in raw["strategies"]}
    medians = {s["name"]: median(series[s["name"]]) for s in raw["strategies"] if s["name"] in series}
    ref = reference_of(medians, kinds)
    ref_s = medians[ref] if ref else None
    ratio = comm_s / compute_s
    lower_bound = raw.get("lower_bound_s")
    ceiling = estimated_ceiling_s(lower_bound, concurrent_s, compute_s, comm_s)
    target = cfg.get("comm_ratio")
    common = dict(model=cfg["model"], workers=cfg["workers"], bandwidth=cfg.get("bandwidth"), compute_s=compute_s,
                  comm_s=comm_s, comm_compute_ratio=ratio, regime=regime_of(comm_s, compute_s),
                  intended_regime=cfg.get("regime", "custom"), batch_size=cfg.get("batch_size"),
                  model_options=dict(cfg.get("model_options", {})), network=meta.get("network", "unknown"),
                  grad_bytes=meta.get("grad_bytes"), lower_bound_s=lower_bound, concurrent_s=concurrent_s,
                  reference=ref, reference_step_s=ref_s, target_ratio=target,
                  rate_source=(None if cfg.get("bandwidth") is None else
                               "derived" if target is not None and cfg.get("calibrated_compute_s") is not None else "pinned"),
                  calibrated_compute_s=cfg.get("calibrated_compute_s"),
                  load_average=(meta.get("load_average") or [None])[0],
                  baseline_priority=raw.get("stats", {}).get("comm", {}).get("comm_priority"),
                  link_fit={k: v for k, v in (raw.get("link_fit") or {}).items() if k != "probe"} or None,
                  compute_slowdown=raw.get("compute_slowdown"))
    records = []
    for s in raw["strategies"]:
        name = s["name"]
        if name not in series:
            records.append(Record(strategy=name, step_time_median_s=None, step_time_p90_s=None, step_time_mean_s=None,
                                  exposed_comm_s=None, speedup=None, efficiency=None, steps=0,
                                  skipped=raw.get("skipped", {}).get(name, "not measured"), **common))
            continue
        xs = series[name]
        t = medians[name]
        st = raw.get("stats", {}).get(name, {})
        wait = st["total_wait_s"] / st["step"] if st.get("step") and "total_wait_s" in st else None
        pred = raw.get("predicted", {}).get(name, {})
        ci = paired_ratio_interval(series[ref], xs, spr) if ref and spr and name != ref else None
        records.append(Record(
            strategy=name, step_time_median_s=t, step_time_p90_s=percentile(xs, 90), step_time_mean_s=sum(xs) / len(xs),
            exposed_comm_s=metrics.exposed_comm_s(t, compute_s), speedup=(ref_s / t) if ref_s else None,
            share_captured=share_captured(ref_s, t, ceiling),
            efficiency=efficiency(t, compute_s, comm_s), steps=len(xs), engine_wait_per_step_s=wait, speedup_ci95=ci,
            # whole rounds only, as paired_ratio_interval takes them (a partial last round is no pair)
            round_medians_s=[median(xs[i * spr:(i + 1) * spr]) for i in range(len(xs) // spr)] if spr else None,
            overlap_trial=st.get("overlap_trial"), delegated_to_ddp=bool(st.get("delegated_to_ddp")),
            plan=st.get("plan"), comm_priority=st.get("comm_priority"), timeline=raw.get("timeline", {}).get(name),
            ps=_ps_summary(st), share_counts=st.get("share_counts"), pipeline=_pipeline_summary(s["kind"], st, pred.get("plan"),
                                                                (raw.get("pipeline_plan_mismatch") or {}).get(name)),
            dropout_fractions=st.get("dropout_fractions"), tuning=(raw.get("tuning") or {}).get(name),
            samples_per_s=(meta["local_batch"] * cfg["workers"] / t) if meta.get("local_batch") and t else None,
            slow_worker=meta.get("slow_worker"), predicted_step_s=pred.get("step_time_s"),
            prediction_error=prediction_error(pred.get("step_time_s"), t), prediction_exact=pred.get("exact"),
            prediction_note=pred.get("error"),
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
    return {"E_median": st.get("E_median"), "S": st.get("S"), "max_staleness": max(st.get("staleness") or [0]),
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


def ceiling_s(r: Record) -> float | None:
    """The estimated best step any schedule could reach on this host (module docstring), or None
    without the concurrent baseline and the bound."""
    return estimated_ceiling_s(r.lower_bound_s, r.concurrent_s, r.compute_s, r.comm_s)


def ceiling_speedup(r: Record) -> float | None:
    """The reference's step over the estimated ceiling: the most a schedule could be expected to gain here."""
    c = ceiling_s(r)
    if c is None or r.reference_step_s is None:
        return None
    return r.reference_step_s / c


def config_label(r: Record) -> str:
    opts = "".join(f",{k}={v}" for k, v in sorted(r.model_options.items()))
    batch = f"b={r.batch_size}" if r.batch_size else ""
    link = r.bandwidth or (f"comm/compute {r.target_ratio:g}" if r.target_ratio is not None else "loopback")
    return f"{r.model}({batch}{opts}) x{r.workers} @ {link}"


def to_json(records: list[Record], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`caramel.bench/2`: {"format", "records": [...], "summary": [...], "meta": {...}}; each record
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
    """Records, summary and meta of a `caramel.bench/2` document; a FormatError names the version expected."""
    tag = data.get("format") if isinstance(data, dict) else None
    if tag != FORMAT:
        raise FormatError(f"{source}: format {tag!r} is not a bench result this version reads (expected {FORMAT!r}"
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
    """Read a bench JSON file written by `write_records` (`caramel.bench/2` only)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file (expected a {FORMAT} JSON file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e}); expected a {FORMAT} file") from None
    return from_json(data, str(path))
