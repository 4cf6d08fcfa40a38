"""Validation of the simulator against real runs: data structures and metrics.

A validation run (to come: it needs the runtime, the emulated cluster and the bench) makes a
prediction for every configuration *before* running it, without refitting anything afterwards,
then runs it and records every measured step time. This module holds what is recorded and how
it is scored, so that the runner only has to fill `ValidationRecord`s:

- per configuration: signed relative error of the prediction against the measured median,
  and the run-to-run spread (coefficient of variation of the measured steps, and the spread
  of repeated medians when repeats exist) to show beside it on a noisy machine;
- over all configurations: median and 90th-percentile absolute error (targets 3% and 7%);
- ranking: within each setting (model, workers, bandwidth, latency), every pair of strategies is
  ordered the same by prediction and by measurement (target: at least 90% of pairs); pairs
  whose measured medians are closer than the run-to-run spread are reported as ties.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from caramel.errors import FormatError
from caramel.jsonio import check_format, format_tag, read_json, require, write_json
from caramel.stats import percentile

KIND = "validation"
TARGET_MEDIAN_ABS_ERROR = 0.03
TARGET_P90_ABS_ERROR = 0.07
TARGET_RANKING_AGREEMENT = 0.90


@dataclass
class ValidationConfig:
    """One real configuration: what runs, on which (emulated) cluster."""

    model: str
    workers: int
    bandwidth_bps: float
    latency_s: float
    planner: str  # "fifo", "fusion", "caramel", or "ddp" for torch's own DDP
    overlap: str
    options: dict[str, Any] = field(default_factory=dict)  # planner options, e.g. bucket_cap_mb

    def setting(self) -> tuple:
        """What strategies are ranked within: everything but the strategy."""
        return (self.model, self.workers, self.bandwidth_bps, self.latency_s)

    def strategy(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.planner}/{self.overlap}" + (f"[{opts}]" if opts else "")


@dataclass
class ValidationRecord:
    config: ValidationConfig
    predicted_step_time_s: float
    measured_step_times_s: list[float]  # steady-state steps, after warm-up, all repeats together
    repeat_medians_s: list[float] = field(default_factory=list)

    @property
    def measured_median_s(self) -> float:
        return statistics.median(self.measured_step_times_s)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured, signed."""
        m = self.measured_median_s
        return (self.predicted_step_time_s - m) / m

    @property
    def spread(self) -> float:
        """Run-to-run spread: relative spread of repeat medians if repeated, else the steps' CV."""
        if len(self.repeat_medians_s) >= 2:
            return (max(self.repeat_medians_s) - min(self.repeat_medians_s)) / statistics.median(self.repeat_medians_s)
        if len(self.measured_step_times_s) >= 2:
            return statistics.stdev(self.measured_step_times_s) / statistics.mean(self.measured_step_times_s)
        return 0.0


def ranking_pairs(records: list[ValidationRecord]) -> dict[str, int]:
    """Pairs of strategies within a setting: agreeing, disagreeing, and measured ties."""
    by_setting: dict[tuple, list[ValidationRecord]] = {}
    for r in records:
        by_setting.setdefault(r.config.setting(), []).append(r)
    out = {"agree": 0, "disagree": 0, "measured_ties": 0}
    for group in by_setting.values():
        for a, b in combinations(group, 2):
            gap = abs(a.measured_median_s - b.measured_median_s) / min(a.measured_median_s, b.measured_median_s)
            if gap <= max(a.spread, b.spread):
                out["measured_ties"] += 1
                continue
            same = (a.predicted_step_time_s < b.predicted_step_time_s) == (a.measured_median_s < b.measured_median_s)
            out["agree" if same else "disagree"] += 1
    return out


def score_line(s: dict[str, Any]) -> str:
    """One line for a `score`: median and p90 |error|, ranking agreement and its pairs."""
    r = s["ranking"]
    agree = "n/a" if r["agreement"] is None else f"{r['agreement'] * 100:.0f}%"
    return (f"median |error| {s['median_abs_error'] * 100:.1f}%, p90 {s['p90_abs_error'] * 100:.1f}%, "
            f"ranking agreement {agree} ({r['agree']} of {r['agree'] + r['disagree']} pairs; {r['measured_ties']} measured ties)")


def score(records: list[ValidationRecord]) -> dict[str, Any]:
    """Median and p90 absolute error, ranking agreement, and whether each target is met."""
    if not records:
        raise FormatError("validation: no records to score")
    errs = [abs(r.error) for r in records]
    pairs = ranking_pairs(records)
    ranked = pairs["agree"] + pairs["disagree"]
    agreement = pairs["agree"] / ranked if ranked else None
    med, p90 = statistics.median(errs), percentile(errs, 90)
    return {
        "configurations": len(records),
        "median_abs_error": med,
        "p90_abs_error": p90,
        "median_spread": statistics.median(r.spread for r in records),
        "ranking": dict(pairs, agreement=agreement),
        "targets_met": {
            "median_abs_error": med <= TARGET_MEDIAN_ABS_ERROR,
            "p90_abs_error": p90 <= TARGET_P90_ABS_ERROR,
            "ranking": agreement is not None and agreement >= TARGET_RANKING_AGREEMENT,
        },
    }


@dataclass
class ValidationReport:
    records: list[ValidationRecord]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": format_tag(KIND), "meta": self.meta, "score": score(self.records) if self.records else None,
                "records": [asdict(r) for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<validation>") -> "ValidationReport":
        check_format(data, KIND, source)
        records = []
        for i, raw in enumerate(require(data, "records", list, source)):
            try:
                cfg = ValidationConfig(**raw["config"])
                rec = ValidationRecord(cfg, float(raw["predicted_step_time_s"]), [float(x) for x in raw["measured_step_times_s"]],
                                       [float(x) for x in raw.get("repeat_medians_s", [])])
            except (KeyError, TypeError, ValueError) as e:
                raise FormatError(f"{source}: records[{i}] is malformed ({e})") from None
            if not rec.measured_step_times_s or min(rec.measured_step_times_s) <= 0:
                raise FormatError(f"{source}: records[{i}].measured_step_times_s must list positive step times")
            records.append(rec)
        return cls(records, dict(data.get("meta", {})))

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "ValidationReport":
        return cls.from_dict(read_json(path, KIND), str(path))

    def markdown(self) -> str:
        """The table for docs/simulator.md: one row per configuration, then the score."""
        lines = ["| model | workers | bandwidth | strategy | predicted ms | measured ms | error | spread |",
                 "|---|---:|---:|---|---:|---:|---:|---:|"]
        for r in self.records:
            c = r.config
            lines.append(f"| {c.model} | {c.workers} | {c.bandwidth_bps / 1e6:g} Mbit/s | {c.strategy()} | "
                         f"{r.predicted_step_time_s * 1e3:.1f} | {r.measured_median_s * 1e3:.1f} | "
                         f"{r.error * 100:+.1f}% | {r.spread * 100:.1f}% |")
        s = score(self.records)
        lines.append("")
        lines.append(f"{s['configurations']} configurations: {score_line(s)}; "
                     f"median run-to-run spread {s['median_spread'] * 100:.1f}%")
        return "\n".join(lines)
