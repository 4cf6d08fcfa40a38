"""What one bench rank measures: fresh copies of the workload, the emulated handicaps, and the
baselines and strategies built on them (`caramel.bench.harness` runs them).

Every runner trains its own identical copy of the model (same seed), so no strategy inherits
another's trained weights; a strategy that fails to build on any rank is skipped on all of
them, so the ranks never disagree on what runs.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from caramel.bench.baselines import CommOnly, ComputeOnly, Concurrent, Runner
from caramel.bench.hetero import JitterSchedule, jitter_down, nominal_factor
from caramel.bench.matrix import BenchConfig, BenchSettings, Strategy
from caramel.bench.screening import Candidates, build_candidates, resolve_tuned
from caramel.bench.strategies import StrategyContext, StrategyUnavailable, baseline_group, build_strategy
from caramel.errors import CaramelError
from caramel.models.zoo import ModelBatch, get_model
from caramel.profile.slowdown import per_sample_compute_s, slow_down
from caramel.stats import median


def log_rank0(rank: int, msg: str) -> None:
    """A progress line on stderr, from rank 0 only."""
    if rank == 0:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_workload(config: BenchConfig, seed: int, device: torch.device) -> ModelBatch:
    """A fresh copy of the configuration's model and batch; identical on every rank for one seed."""
    factory = get_model(config.model)
    kwargs: dict[str, Any] = dict(config.model_options)
    if config.batch_size is not None:
        kwargs["batch_size"] = config.batch_size
    try:
        w = factory(seed=seed, **kwargs)
    except TypeError as e:
        raise CaramelError(f"model {config.model!r} does not accept options {sorted(kwargs)}: {e}") from None
    w.model.to(device)
    w.inputs, w.targets = w.inputs.to(device), w.targets.to(device)
    return w


def _agree(error: str | None) -> str | None:
    """All ranks learn whether any rank failed, so they all skip the same runners (no hang)."""
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    bad: dict[str, list[int]] = {}
    for r, e in enumerate(errors):
        if e:
            bad.setdefault(e, []).append(r)
    if not bad:
        return None
    if len(bad) == 1 and len(next(iter(bad.values()))) == len(errors):
        return next(iter(bad))
    return "; ".join(f"rank {','.join(map(str, ranks))}: {e}" for e, ranks in bad.items())


def build_runners(config: BenchConfig, settings: BenchSettings, strategies: list[Strategy],
                  ctx: StrategyContext, delay_per_sample_s: float = 0.0, jitter: dict[str, Any] | None = None,
                  plan_inputs: tuple[Any, int, dict[str, Any] | None] | None = None
                  ) -> tuple[dict[str, Runner], dict[str, str], dict[str, float], dict[str, dict[str, Any]]]:
    """Baselines and strategies, each strategy on its own identical model copy (the concurrent
    baseline reuses the compute-only baseline's model and the comm-only baseline's buffers: only
    their timing is used); a strategy that fails to build on any rank is skipped on all of them
    (with the reason) so the others still run. A strategy with a tuned option has every value
    built with the others, screened once all are built, every candidate closed, and the chosen
    value built afresh (`caramel.bench.screening`); the last item is each one's screening record
    (`Screening.to_dict()`). `plan_inputs` (the job's profile, gradient bytes and link probe; a
    job with a pipeline): the baselines run their rounds first, and `ctx` gets the ClusterSpec and
    profile the pipelines plan from (`caramel.bench.pipeline_plan`)."""
    def handicap(model: torch.nn.Module) -> JitterSchedule | None:
        if delay_per_sample_s:  # this rank is the emulated slow worker: every model it trains is slowed
            slow_down(model, delay_per_sample_s)
        if not jitter:
            return None
        # --jitter: every model replays the same seeded draws (caramel.bench.hetero)
        schedule = JitterSchedule(jitter["fraction"], jitter["seed"], jittered=jitter["rank"] == ctx.rank)
        jitter_down(model, jitter["compute_per_sample_s"], schedule)
        return schedule

    probe = make_workload(config, settings.seed, ctx.device)
    schedule = handicap(probe.model)
    compute = ComputeOnly(probe.model, bench_sgd(probe.model, settings), probe.inputs, probe.targets, probe.loss_fn, ctx.device)
    compute.jitter = schedule  # its measured steps' own pauses (the predictions' unpadded compute)
    group, prio = baseline_group(ctx)
    comm = CommOnly(probe.model, ctx.device, process_group=group, priority=prio)
    runners: dict[str, Runner] = {"compute": compute, "comm": comm, "concurrent": Concurrent(compute, comm)}
    if plan_inputs is not None:
        from caramel.bench.pipeline_plan import cluster_summary, measure_plan_cluster

        profile, grad_bytes, probed = plan_inputs
        ctx.pipeline_profile = profile
        ctx.pipeline_cluster = measure_plan_cluster(runners, settings.steps_per_round, settings.rounds,
                                                    settings.warmup_steps, profile, ctx.world_size, grad_bytes, probed)
        log_rank0(ctx.rank, f"pipelines plan at {cluster_summary(ctx.pipeline_cluster)}")
    skipped: dict[str, str] = {}
    build_s: dict[str, float] = {}

    def build(strategy: Strategy) -> tuple[Runner | None, str | None]:
        """One strategy on a fresh model copy; the error every rank agrees on, if any rank failed."""
        w = make_workload(config, settings.seed, ctx.device)
        handicap(w.model)
        error, runner = None, None
        try:
            runner = build_strategy(strategy, w.model, bench_sgd(w.model, settings), w.inputs, w.targets, w.loss_fn, ctx)
        except StrategyUnavailable as e:
            error = str(e)
        except Exception as e:  # reported, not fatal: the other strategies still get measured
            error = f"{type(e).__name__}: {e}"
        return runner, _agree(error)

    built: dict[str, Runner | Candidates] = {}
    for strategy in strategies:
        t_build = time.perf_counter()
        runner, error = build_candidates(strategy, build) if strategy.tuned else build(strategy)
        if error:
            skipped[strategy.name] = error
            log_rank0(ctx.rank, f"skipping {strategy.name}: {error}")
        else:
            built[strategy.name] = runner
            build_s[strategy.name] = time.perf_counter() - t_build
    tuning, failed, tune_s = resolve_tuned(built, build, settings, ctx.rank)
    for name, error in failed.items():
        skipped[name] = error
        log_rank0(ctx.rank, f"skipping {name}: {error}")
    for name, seconds in tune_s.items():
        build_s[name] += seconds
    runners.update(built)
    return runners, skipped, build_s, tuning


def slow_worker_of(config: BenchConfig, settings: BenchSettings, rank: int, world: int,
                 device: torch.device) -> dict[str, Any] | None:
    """The emulated slow worker's delay (`caramel.bench.straggler`), the same dict on every rank."""
    if not config.slow_worker:
        return None
    slow_rank, factor = config.slow_worker
    w = make_workload(config, settings.seed, device)
    mine = per_sample_compute_s(w.model, w.inputs, w.targets, w.loss_fn)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    per_sample = gathered[slow_rank]
    log_rank0(rank, f"slow worker: rank {slow_rank} sleeps {factor - 1:g} x {1e3 * per_sample:.2f} ms per sample "
               "after each training forward (a calibrated delay, not a CPU quota)")
    return {"rank": slow_rank, "factor": factor, "method": "calibrated delay",
            "compute_per_sample_s": per_sample, "delay_per_sample_s": (factor - 1.0) * per_sample}


def jitter_of(config: BenchConfig, settings: BenchSettings, world: int, device: torch.device) -> dict[str, Any] | None:
    """--jitter's schedule and the compute it scales (the ranks' median per-sample compute), the
    same dict on every rank."""
    if not config.jitter:
        return None
    rank, fraction, seed = config.jitter
    w = make_workload(config, settings.seed, device)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, per_sample_compute_s(w.model, w.inputs, w.targets, w.loss_fn))
    per_sample = median(gathered)
    log_rank0(dist.get_rank(), f"jitter: every rank padded to {nominal_factor(fraction):.2f} x {1e3 * per_sample:.2f} ms per "
                          f"sample, rank {rank}'s step scaled by a draw from [{1 - fraction:g}, {1 + fraction:g}] (seed {seed})")
    return {"rank": rank, "fraction": fraction, "seed": seed, "method": "calibrated sleep, padded to a nominal step",
            "compute_per_sample_s": per_sample, "nominal_factor": nominal_factor(fraction)}


def bench_sgd(model: torch.nn.Module, settings: BenchSettings) -> torch.optim.Optimizer:
    """The optimizer every runner trains with (the same on every model copy)."""
    return torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=0.9)
