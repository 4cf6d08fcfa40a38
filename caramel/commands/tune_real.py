"""`caramel tune --measure real`: every candidate measured as real training steps in one bench job.

Each candidate is a `caramel` strategy option set (`caramel:planner=fifo,bucket_cap_mb=1,...`).
They all run in one bench job (`caramel.bench`: one process group, every strategy interleaved
in rounds, medians per strategy) on the emulated cluster or loopback, so drift and host load
hit every candidate alike; `ddp` runs beside them as the reference a user would compare with.
The search methods then read their measurements from that table (`caramel.tune.ledger`),
charged in the real steps each candidate cost. The tuner's cheap model is the simulator on a
profile of the same model taken here, in this process, before the job (its steps are charged to
the tuner), and a cluster of the job's workers and link rate.

This lives in the command layer: `caramel.tune` may not run the engine or the bench.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from caramel.bench.cli import single_config
from caramel.bench.harness import make_calibration_job, make_job, make_workload
from caramel.bench.jobs import LOOPBACK, choose_network, launch_job
from caramel.bench.matrix import BenchConfig, BenchSettings, Strategy
from caramel.bench.rates import CALIBRATION_RATE, LINK_LATENCY_S, calibration_settings, derive_rates
from caramel.bench.report import summarize
from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec
from caramel.tune.ledger import Measured, MeasuredTable
from caramel.tune.space import Config, Space

REFERENCE = "ddp"  # measured beside the candidates, never a candidate
UNSHAPED_BPS = 10e9  # what the cheap model assumes of unshaped loopback links
PROFILE_WARMUP, PROFILE_STEPS = 1, 3


def add_real_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("--measure real: the bench configuration the candidates run in")
    g.add_argument("--model", help="zoo model name or path/to/file.py:factory (default resnet18 with width=16)")
    g.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra zoo factory argument, e.g. width=16 (repeatable)")
    g.add_argument("--batch-size", type=int, help="per-worker batch size (default 8 for the default model)")
    g.add_argument("--ratio", type=float, metavar="R",
                   help="target comm/compute: the link rate is derived at run start, as `caramel bench --ratio` does")
    g.add_argument("--network", choices=("auto", "cluster", "loopback"), default="auto",
                   help="cluster: shaped links (root); loopback: unshaped local workers; auto: cluster when possible")
    g.add_argument("--rounds", type=int, default=8, help="interleaving rounds of the sweep job (default 8)")
    g.add_argument("--steps", type=int, default=6, help="measured steps per candidate per round (default 6)")
    g.add_argument("--warmup", type=int, default=2, help="unmeasured warm-up steps per candidate (default 2)")
    g.add_argument("--timeout", type=float, default=900.0, help="wall-clock limit of the sweep job, seconds (default 900)")


@dataclass
class RealSweep:
    """The measured table and what the cheap model needs."""

    table: MeasuredTable
    profile: ModelProfile
    profile_steps: int  # single-process compute steps the profile cost (charged to the tuner)
    cluster: ClusterSpec
    config: BenchConfig
    network: str
    reference_s: float | None  # ddp's median in the same job
    strategies: dict[str, str]  # candidate key (as text) -> strategy name
    records: list[dict[str, Any]]


def candidate_strategy(planner: str, config: Config) -> Strategy:
    """The caramel strategy a candidate stands for; a knob the strategy does not take is an error here."""
    options = {"planner": planner, **config}
    strategy = Strategy("caramel", tuple(sorted(options.items())))
    try:
        strategy.spec()
    except CaramelError as e:
        raise CaramelError(f"--knob: candidate {config} is not a caramel strategy option set: {e}") from None
    return strategy


def _settings(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(rounds=args.rounds, steps_per_round=args.steps, warmup_steps=args.warmup,
                         timeout_s=min(args.timeout, 300.0))


def _profile(config: BenchConfig, seed: int) -> tuple[ModelProfile, int]:
    """The model profiled here on one thread, as each worker computes (the cheap model's input)."""
    import torch

    from caramel.profile.profiler import SPLIT_STEPS, profile_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = make_workload(config, seed, torch.device("cpu"))
        profile = profile_model(w.model, w.inputs, w.targets, w.loss_fn, steps=PROFILE_STEPS, warmup=PROFILE_WARMUP)
    finally:
        torch.set_num_threads(threads)
    return profile, PROFILE_WARMUP + PROFILE_STEPS + SPLIT_STEPS


def run_sweep(args: argparse.Namespace, space: Space, planner: str, log=None) -> RealSweep:
    """Measure every candidate of `space` in one interleaved bench job (module docstring)."""
    log = log if log is not None else sys.stderr
    candidates = space.candidates()
    strategies = [candidate_strategy(planner, c) for c in candidates]
    config, settings = single_config(args), _settings(args)
    strict = args.network == "cluster"
    network = choose_network(args.network, config.bandwidth or (CALIBRATION_RATE if config.needs_rate else None))
    cal = calibration_settings(settings)

    def calibrate(c: BenchConfig):
        rate = CALIBRATION_RATE if network == "cluster" else None
        return launch_job(make_calibration_job(c, cal, network), c.workers, rate, network, timeout_s=args.timeout,
                          log=log, strict=strict).raw

    derived, failures = derive_rates([config], calibrate, log=log)
    if failures:
        raise CaramelError("; ".join(failures))
    config = derived[0]
    profile, profile_steps = _profile(config, settings.seed)
    bps = config.bandwidth_bps if network == "cluster" and config.bandwidth_bps else UNSHAPED_BPS
    cluster = ClusterSpec.uniform(config.workers, bps, latency_s=LINK_LATENCY_S)
    print(f"caramel tune: measuring {len(candidates)} candidates and {REFERENCE} in one job on {config.label} "
          f"({network}; {settings.rounds} rounds x {settings.steps_per_round} steps)", file=log, flush=True)
    job = make_job(config, settings, [Strategy(REFERENCE)] + strategies, network)
    result = launch_job(job, config.workers, config.bandwidth, network, timeout_s=args.timeout, log=log, strict=strict)
    if result.raw is None:
        raise CaramelError(f"the sweep job on {config.label} failed with exit code {result.returncode}: "
                           f"{result.log_tail[-400:]}")
    records = {r.strategy: r for r in summarize(result.raw)}
    table: dict[tuple, Measured] = {}
    names: dict[str, str] = {}
    for cand, strategy in zip(candidates, strategies):
        rec = records.get(strategy.name)
        if rec is None or rec.skipped or rec.step_time_median_s is None:
            why = rec.skipped if rec is not None else "no record"
            raise CaramelError(f"candidate {strategy.name} was not measured: {why}")
        steps = result.raw["stats"].get(strategy.name, {}).get("step")
        if not isinstance(steps, int):
            raise CaramelError(f"candidate {strategy.name}: the engine reported no step count")
        table[space.key(cand)] = Measured(rec.step_time_median_s, steps)
        names[repr(space.key(cand))] = strategy.name
    ref = records.get(REFERENCE)
    return RealSweep(MeasuredTable(space, table), profile, profile_steps, cluster, config,
                     result.network if result.network != LOOPBACK else "loopback",
                     ref.step_time_median_s if ref is not None else None, names,
                     [_record_summary(r) for r in records.values()])


def _record_summary(r) -> dict[str, Any]:
    return {"strategy": r.strategy, "step_time_median_s": r.step_time_median_s, "step_time_p90_s": r.step_time_p90_s,
            "steps": r.steps, "compute_s": r.compute_s, "comm_s": r.comm_s, "comm_compute_ratio": r.comm_compute_ratio,
            "bandwidth": r.bandwidth, "network": r.network, "skipped": r.skipped}
