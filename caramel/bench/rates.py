"""Link rates derived from what a matrix point means: its target comm/compute ratio.

At run start, every distinct workload of the matrix (model, batch, options, workers) runs a
short compute-only job under the launcher and thread settings of the bench itself, and its pace
T_compute gives the rate B at which the ring all-reduce of the gradients S takes the target
ratio of it:

    2(n-1)·α·k + 2(n-1)/n · S/B = ratio · T_compute      (k collectives, α each)

so that the regime of a point holds on a faster or a slower host, and nobody tunes rates by
hand. The measured ratio (the job's own comm-only over compute-only) is reported beside it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from caramel.bench.hetero import nominal_factor
from caramel.bench.matrix import BenchConfig, BenchSettings
from caramel.errors import CaramelError
from caramel.units import format_rate

LINK_LATENCY_S = 1e-4
"""α per ring step of one collective on the emulated links: what the comm-only baseline measured
above S/B (docs/benchmarks.md, "The matrix: defined by comm/compute, rates derived at run start")"""
CALIBRATION_RATE = "10gbit"
"""the links a calibration job runs on: it sends nothing but its own step times"""
CALIBRATION_ROUNDS = 5
RATE_DIGITS = 3
"""significant digits of a derived rate (tc takes it as text; the rounding moves the ratio < 0.5%)"""


def ring_allreduce_s(grad_bytes: float, workers: int, bandwidth_bps: float, latency_s: float = 0.0,
                     collectives: int = 1) -> float:
    """Ring all-reduce of `grad_bytes` in `collectives` collectives over links of `bandwidth_bps`."""
    if workers < 2:
        return 0.0
    return 2 * (workers - 1) * latency_s * collectives + 2 * (workers - 1) / workers * grad_bytes * 8 / bandwidth_bps


def derive_rate_bps(grad_bytes: float, workers: int, compute_s: float, ratio: float, latency_s: float = 0.0,
                    collectives: int = 1) -> float:
    """The link rate at which `ring_allreduce_s` equals `ratio` * `compute_s`."""
    if workers < 2:
        raise CaramelError(f"a comm/compute ratio needs 2 or more workers, got {workers}")
    if not (grad_bytes > 0 and compute_s > 0 and ratio > 0):
        raise CaramelError(f"cannot derive a link rate from {grad_bytes} gradient bytes, a {compute_s} s compute step "
                           f"and ratio {ratio}: all must be positive")
    budget = ratio * compute_s - 2 * (workers - 1) * latency_s * collectives
    if budget <= 0:
        raise CaramelError(f"comm/compute {ratio:g} of a {compute_s * 1e3:.2f} ms step is shorter than the links' latency "
                           f"alone ({collectives} collectives): no rate gives it")
    return 2 * (workers - 1) / workers * grad_bytes * 8 / budget


def rate_text(bps: float) -> str:
    """`bps` rounded to RATE_DIGITS significant digits, in tc syntax."""
    return format_rate(float(f"{bps:.{RATE_DIGITS}g}"))


@dataclass
class Calibration:
    """What a compute-only job measured for one workload."""

    compute_s: float
    grad_bytes: int
    collectives: int
    """the comm-only baseline's buckets (DDP's bucketing of these gradients)"""

    def rate(self, config: BenchConfig, latency_s: float = LINK_LATENCY_S) -> str:
        assert config.comm_ratio is not None
        return rate_text(derive_rate_bps(self.grad_bytes, config.workers, self.step_s(config), config.comm_ratio,
                                         latency_s, self.collectives))

    def step_s(self, config: BenchConfig) -> float:
        """The compute step the point's ratio refers to: padded to the nominal step under --jitter
        (`caramel.bench.hetero`), so that jitter changes the variance and not the regime."""
        return self.compute_s * (nominal_factor(config.jitter[1]) if config.jitter else 1.0)


def calibration_settings(settings: BenchSettings) -> BenchSettings:
    """A short compute-only measurement with the bench's own warm-up and round length."""
    return BenchSettings(rounds=CALIBRATION_ROUNDS, steps_per_round=settings.steps_per_round,
                         warmup_steps=max(settings.warmup_steps, 2), lr=settings.lr, seed=settings.seed,
                         timeout_s=settings.timeout_s)


def calibration_from_raw(raw: dict[str, Any]) -> Calibration:
    """The compute pace (as the report takes T_compute) and the gradients of a calibration job."""
    from caramel.bench.report import free_running_pace_s
    from caramel.stats import median

    spr = raw["settings"]["steps_per_round"]
    return Calibration(compute_s=median(free_running_pace_s(raw["step_times_s"]["compute"], spr)),
                       grad_bytes=int(raw["grad_bytes"]), collectives=int(raw["comm_buckets"]))


Launch = Callable[[BenchConfig], "dict[str, Any] | None"]


def derive_rates(configs: list[BenchConfig], launch: Launch, log=None) -> tuple[list[BenchConfig], list[str]]:
    """Every ratio-defined point with its rate filled in, one calibration per workload; the
    points whose calibration failed are left out and named in the failures returned."""
    log = log if log is not None else sys.stderr
    calibrations: dict[tuple, Calibration | None] = {}
    out: list[BenchConfig] = []
    failures: list[str] = []
    for config in configs:
        if not config.needs_rate:
            out.append(config)
            continue
        key = config.workload_key
        if key not in calibrations:
            print(f"caramel bench: measuring compute for {config.label} to derive its link rate", file=log, flush=True)
            raw = launch(config)
            calibrations[key] = calibration_from_raw(raw) if raw is not None else None
        cal = calibrations[key]
        if cal is None:
            failures.append(f"{config.label}: the compute-only calibration job failed; no rate derived")
            continue
        derived = config.with_rate(cal.rate(config), cal.step_s(config))
        print(f"caramel bench: {derived.label}: compute {cal.compute_s * 1e3:.1f} ms, {cal.grad_bytes / 1e6:.2f} MB of "
              f"gradients in {cal.collectives} collective(s) -> comm/compute {config.comm_ratio:g} at {derived.bandwidth}",
              file=log, flush=True)
        out.append(derived)
    return out, failures
