"""Heterogeneous workers in the bench: one slow link, and one worker's compute jitter.

Wang et al.'s question (docs/gossip.md) is when decentralized training beats all-reduce: links
of uneven cost and step times that vary. Two bench options emulate them, beside `--slow-worker`
(`caramel.bench.straggler`):

- `--slow-link RANK:FACTOR`: that worker's veth is shaped at the others' rate / FACTOR (both
  directions) in the emulated cluster; the other links keep the configuration's rate.
- `--jitter RANK:FRACTION[:SEED]`: that worker's step time is scaled, per training forward,
  by a draw from [1 - FRACTION, 1 + FRACTION] (seeded; the simulator's `compute_jitter`). Real
  compute cannot be made faster, so every worker is padded by a calibrated sleep to a nominal
  step of compute / (1 - FRACTION) and the jittered worker's sleep brings it to nominal x draw:
  its mean equals the others' and only its variance differs, which is the case the question
  is about (a worker that is slower on average is `--slow-worker`). Every model copy replays
  the same draws from the seed, so every strategy sees the same schedule.

`versus_best_allreduce` compares each gossip strategy of a job with the faster of its
all-reduce strategies (DDP variants, caramel), with a paired-rounds interval.
"""
from __future__ import annotations

import math
import random
import time
from typing import Any

import torch
import torch.nn as nn

from caramel.errors import CaramelError

ALLREDUCE_KINDS = ("ddp", "caramel")
"""strategies whose step ends in an all-reduce of the gradients (compared with gossip)"""


def _rank_in(rank: Any, workers: int, flag: str) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < workers:
        raise CaramelError(f"{flag} rank must be between 0 and {workers - 1}, got {rank!r}")
    return rank


def check_slow_link(value: Any, workers: int) -> list:
    """`[rank, factor]` from a list or `RANK:FACTOR` text; factor >= 1 divides that worker's link rate."""
    if isinstance(value, str):
        text = value
        rank, sep, factor = text.partition(":")
        try:
            value = [int(rank), float(factor)] if sep and ":" not in factor else None
        except ValueError:
            value = None
        if value is None:
            raise CaramelError(f"--slow-link {text!r}: expected RANK:FACTOR, e.g. 2:4 (rank 2's link at a quarter "
                               "of the others' rate)")
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise CaramelError(f"--slow-link expects [rank, factor], got {value!r}")
    rank, factor = value
    rank = _rank_in(rank, workers, "--slow-link")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
        raise CaramelError(f"--slow-link factor must be a number >= 1 (the link's rate is divided by it), got {factor!r}")
    return [rank, float(factor)]


def check_jitter(value: Any, workers: int) -> list:
    """`[rank, fraction, seed]` from a list or `RANK:FRACTION[:SEED]` text (seed 0 when left out)."""
    if isinstance(value, str):
        text = value
        parts = text.split(":")
        try:
            value = [int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) == 3 else 0] if len(parts) in (2, 3) else None
        except ValueError:
            value = None
        if value is None:
            raise CaramelError(f"--jitter {text!r}: expected RANK:FRACTION[:SEED], e.g. 1:0.5:0 (rank 1's step time varies by "
                               "up to +/-50%, seed 0)")
    if not (isinstance(value, (list, tuple)) and len(value) in (2, 3)):
        raise CaramelError(f"--jitter expects [rank, fraction, seed], got {value!r}")
    rank, fraction, seed = (list(value) + [0])[:3]
    rank = _rank_in(rank, workers, "--jitter")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise CaramelError(f"--jitter fraction must be in (0, 1) (0.5: +/-50%), got {fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CaramelError(f"--jitter seed must be an integer >= 0, got {seed!r}")
    return [rank, float(fraction), seed]


def link_rates_bps(bandwidth_bps: float, workers: int, slow_link: list | None) -> list[float]:
    """Each worker's link rate: the configuration's, the slow link's divided by its factor."""
    rates = [float(bandwidth_bps)] * workers
    if slow_link:
        rates[slow_link[0]] = bandwidth_bps / slow_link[1]
    return rates


def nominal_factor(fraction: float) -> float:
    """A padded worker's nominal step over its compute: the lowest draw, 1 - fraction, still
    needs a sleep of zero or more."""
    return 1.0 / (1.0 - fraction)


class JitterSchedule:
    """The per-step factors of one worker: uniform in [1 - fraction, 1 + fraction], from `seed`
    (`random.Random`, as the simulator draws `compute_jitter`), or 1.0 for a worker not jittered."""

    def __init__(self, fraction: float, seed: int, jittered: bool = True):
        self.fraction = fraction
        self.jittered = jittered
        self._rng = random.Random(seed)
        self.slept_s: list[float] = []
        """every sleep `jitter_down` took from this schedule, in order (the compute-only baseline's
        measured steps take theirs out: `caramel.bench.baselines.ComputeOnly`)"""
        self.slept_at_s: list[tuple[float, float]] = []
        """each of those sleeps' (start, end) on `time.perf_counter`: the concurrent baseline takes
        them out of its compute and its overlap (`caramel.bench.contention.span_padding`)"""

    def next(self) -> float:
        return 1.0 + self._rng.uniform(-self.fraction, self.fraction) if self.jittered else 1.0

    def sleep_factor(self) -> float:
        """The next step's sleep, in units of the worker's compute: nominal x draw - 1 (>= 0)."""
        return max(nominal_factor(self.fraction) * self.next() - 1.0, 0.0)


def jitter_down(model: nn.Module, per_sample_s: float, schedule: JitterSchedule) -> None:
    """After every training forward of `model`, sleep the schedule's next factor times the
    calibrated compute of its input's samples (evaluation forwards are not touched)."""
    def hook(_m, args, _out):
        if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            pause_s = schedule.sleep_factor() * per_sample_s * int(args[0].shape[0])
            schedule.slept_s.append(pause_s)
            start = time.perf_counter()
            time.sleep(pause_s)
            schedule.slept_at_s.append((start, time.perf_counter()))
    model.register_forward_hook(hook)


def versus_best_allreduce(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per gossip strategy of one raw job: its throughput over the faster all-reduce strategy's
    (median step ratio, 95% interval from the paired rounds)."""
    from caramel.bench.report import job_step_times
    from caramel.stats import median, paired_ratio_interval

    spr = raw.get("settings", {}).get("steps_per_round")
    kinds = {s["name"]: s["kind"] for s in raw.get("strategies", [])}
    series = {n: job_step_times(rt, spr) for n, rt in raw["step_times_s"].items() if n in kinds}
    allreduce = [n for n in series if kinds[n] in ALLREDUCE_KINDS]
    if not allreduce:
        return []
    best = min(allreduce, key=lambda n: median(series[n]))
    out = []
    for name in (n for n in series if kinds[n] == "gossip"):
        ci = paired_ratio_interval(series[best], series[name], spr) if spr else None
        out.append({"gossip": name, "best_allreduce": best, "best_allreduce_step_s": median(series[best]),
                    "gossip_step_s": median(series[name]), "throughput_ratio": median(series[best]) / median(series[name]),
                    "ci95": list(ci) if ci else None})
    return out


def format_versus(rows: list[dict[str, Any]]) -> str:
    """One line per gossip strategy and configuration ('' without any)."""
    lines = []
    for v in rows:
        ci = f" (95% {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})" if v.get("ci95") else ""
        lines.append(f"{v['gossip']} on {v['config']}: {v['throughput_ratio']:.2f}x{ci} the throughput of "
                     f"{v['best_allreduce']}, the faster all-reduce ({1e3 * v['gossip_step_s']:.1f} ms against "
                     f"{1e3 * v['best_allreduce_step_s']:.1f} ms per step)")
    return "\n".join(lines)


def describe(uneven: dict[str, Any]) -> str:
    """`{"slow_link": ..., "jitter": ...}` of one configuration in words (the report's header)."""
    parts = []
    if uneven.get("slow_link"):
        rank, factor = uneven["slow_link"]
        parts.append(f"worker {rank}'s link at 1/{factor:g} of the others' rate")
    if uneven.get("jitter"):
        rank, fraction, seed = uneven["jitter"]
        parts.append(f"worker {rank}'s step scaled per step by a draw from [{1 - fraction:g}, {1 + fraction:g}] "
                     f"(seed {seed}), every worker padded to {nominal_factor(fraction):.2f}x its compute")
    return ", ".join(parts) or "none"
