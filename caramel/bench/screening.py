"""A tuned reference: the bench screens a grid of one option's values in the job and runs the fastest.

`--strategies ddp:bucket_cap_mb=tuned` asks for the strongest DDP the bench can build here, not
torch's default. In the job, once every strategy of the job is built (so the screening runs
beside the same built runners, processes, links and thread priority as the rounds) and before the
interleaved rounds: each value of the grid (`caramel.bench.matrix.TUNABLE`) gets its own runner
on an identical model copy, `warmup_steps` unmeasured steps, then `screen_rounds` rounds of one
block of `steps_per_round` steps each, in a serpentine order (`balanced_order`). Every rank
gathers every rank's times and takes the job's step (the slowest rank's clock, `job_step_times`),
so all ranks see the same numbers and pick the same value: the lowest median, the first in grid
order on a tie. Every candidate is then closed on every rank in grid order (`Runner.close`: a
candidate's own gloo group, with its threads and connections, is destroyed) and the harness
builds the chosen value afresh for the rounds, so it starts there as every other strategy does:
untrained model, its `--jitter` draws from the first. Its screening times are not used again,
so the reference's reported step is measured afresh and not biased low by the pick (noise can
only make the pick a near-tie's other value, and the report gives the runner-up's gap and its
interval). A first value that fails to build ends the screening with its error (a refusal no
value escapes, such as real-time priority not allowed, costs one build and one message); a later
value that fails is left out and recorded.

The bucket-cap grid, torch's default (a 1 MB first bucket, then 25 MB), then 0.25, 0.5, 1, 2, 4
and 25 MB: doubling steps over the range where the measured optimum of the zoo's models lies
(ResNet-18 width 16, 2.8 MB of gradients: docs/results/ddp-bucket-caps-ratio1.md), where
neighbouring caps differed little, so a finer grid gains little; 0.25 MB is already about
11 collectives for ResNet-18 (more for GPT-2's 16.9 MB), each paying the link's fixed cost; 4 MB
lets GPT-2 start early with a few large buckets; 25 MB given explicitly is torch's cap with no
small first bucket (one bucket after backward for ResNet-18): the other end. Seven values of
`screen_rounds` x `steps_per_round` steps (4 x 8 by default: 32 each, 224 in all) cost about as
many steps as three more strategies in the default 10 rounds of 8.
"""
from __future__ import annotations

import gc
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from caramel.bench.baselines import Runner
from caramel.bench.blocks import balanced_order, measure_block
from caramel.bench.matrix import BenchSettings, Strategy, value_label
from caramel.bench.report import job_step_times
from caramel.stats import median, paired_ratio_interval


@dataclass
class Screening:
    """What the screening of one tuned strategy measured and chose (the raw JSON's `tuning`)."""

    option: str
    values: list[Any]
    """the grid values screened, in grid order (candidates that failed to build are in `skipped`)"""
    strategies: list[str]
    """each value's concrete strategy, e.g. ddp:bucket_cap_mb=0.5"""
    median_s: list[float]
    """each value's median job step over the screening"""
    rounds: int
    steps: int
    """screened steps per value"""
    chosen: Any
    chosen_strategy: str
    runner_up: Any = None
    """the runner-up's grid value (None is also torch's default cap: read `runner_up_strategy`)"""
    runner_up_strategy: str | None = None
    """the runner-up's concrete strategy (None only with one candidate)"""
    runner_up_gap: float | None = None
    """the runner-up's median over the chosen value's, minus 1 (None with one candidate)"""
    runner_up_ci95: tuple[float, float] | None = None
    """95% interval of that ratio from the paired screening rounds (None under 3 rounds)"""
    skipped: dict[str, str] = field(default_factory=dict)
    """concrete strategy -> why it could not be built"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose(medians: list[float]) -> tuple[int, int | None]:
    """Indices of the lowest median and of the runner-up (None with one); on a tie, the first in
    grid order wins, so the pick never depends on anything but the times."""
    if not medians:
        raise ValueError("no candidate to choose from")
    order = sorted(range(len(medians)), key=lambda i: (medians[i], i))
    return order[0], (order[1] if len(order) > 1 else None)


def select(option: str, values: list[Any], strategies: list[str], series: list[list[float]], rounds: int,
           steps_per_round: int, skipped: dict[str, str] | None = None) -> Screening:
    """The screening's record from each candidate's job step times (`series`, in grid order)."""
    if not (len(values) == len(strategies) == len(series)) or not values:
        raise ValueError(f"{len(values)} values, {len(strategies)} strategies and {len(series)} series to screen")
    medians = [median(s) for s in series]
    best, second = choose(medians)
    out = Screening(option=option, values=list(values), strategies=list(strategies), median_s=medians,
                    rounds=rounds, steps=len(series[best]), chosen=values[best], chosen_strategy=strategies[best],
                    skipped=dict(skipped or {}))
    if second is not None:
        out.runner_up, out.runner_up_strategy = values[second], strategies[second]
        out.runner_up_gap = medians[second] / medians[best] - 1.0
        out.runner_up_ci95 = paired_ratio_interval(series[second], series[best], steps_per_round)
    return out


def screen(runners: dict[str, Runner], settings: BenchSettings) -> dict[str, list[float]]:
    """Warm each candidate up, time `screen_rounds` serpentine rounds of one block each; on every
    rank, each candidate's job step times over all ranks (one collective after the rounds: none
    inside them, where it would queue behind the candidates' own transfers)."""
    import torch.distributed as dist

    for runner in runners.values():
        for _ in range(settings.warmup_steps):
            runner.step()
        runner.finish()
    names = list(runners)
    local: dict[str, list[float]] = {n: [] for n in names}
    for r in range(settings.screen_rounds):
        for name in balanced_order(names, r):
            dist.barrier()
            local[name] += measure_block(runners[name], settings.steps_per_round)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return {n: job_step_times([g[n] for g in gathered], settings.steps_per_round) for n in names}


@dataclass
class Candidates:
    """The built runners of one tuned strategy's grid, waiting for the screening."""

    strategy: Strategy
    runners: dict[str, Runner]
    """concrete strategy name -> runner, in grid order"""
    values: dict[str, Any]
    """concrete strategy name -> grid value"""
    failed: dict[str, str]
    """concrete strategy name -> why it could not be built"""


def build_candidates(strategy: Strategy, build: Callable[[Strategy], tuple[Runner | None, str | None]]
                     ) -> tuple[Candidates | None, str | None]:
    """Every grid value of `strategy` built by `build` (a runner, or the error all ranks agree
    on), in grid order. The first value's failure stops there with one error, nothing else
    built; a later value's failure is recorded and the rest go on."""
    out = Candidates(strategy, {}, {}, {})
    for value, concrete in strategy.candidates():
        runner, error = build(concrete)
        if error or runner is None:
            if not out.runners:
                return None, f"its first value {concrete.name} could not be built, so no other was tried: " + (
                    error or "not built")
            out.failed[concrete.name] = error or "not built"
        else:
            out.runners[concrete.name], out.values[concrete.name] = runner, value
    return out, None


def screen_candidates(candidates: Candidates, settings: BenchSettings, rank: int) -> Screening:
    """Screen the built candidates (all ranks at once) and return the record of the choice."""
    strategy, names = candidates.strategy, list(candidates.runners)
    (option,) = strategy.tuned
    if rank == 0:
        print(f"[bench] {strategy.name}: screening {len(names)} values, {settings.screen_rounds} rounds x "
              f"{settings.steps_per_round} steps each", file=sys.stderr, flush=True)
    series = screen(candidates.runners, settings)
    result = select(option, [candidates.values[n] for n in names], names, [series[n] for n in names],
                    settings.screen_rounds, settings.steps_per_round, candidates.failed)
    if rank == 0:
        print(f"[bench] {strategy.name}: screened " + ", ".join(
            f"{value_label(v)} {1e3 * t:.1f} ms" for v, t in zip(result.values, result.median_s))
              + f" -> {option}={value_label(result.chosen)}" + (
                  f" (runner-up {value_label(result.runner_up)} {result.runner_up_gap:+.1%})"
                  if result.runner_up_gap is not None else ""), file=sys.stderr, flush=True)
    return result


def release(candidates: Candidates) -> None:
    """Close every candidate, in grid order (the same order on every rank: closing destroys a
    candidate's own process group). Only after the screening's gather: no rank closes a group a
    peer still has a transfer on. The caller runs gc.collect() once afterwards."""
    for runner in candidates.runners.values():
        runner.close()
    candidates.runners.clear()


def resolve_tuned(built: dict[str, Any], build: Callable[[Strategy], tuple[Runner | None, str | None]],
                  settings: BenchSettings, rank: int
                  ) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, float]]:
    """Once every strategy is built (`built`: name -> runner, or a tuned one's `Candidates`):
    screen each tuned strategy, close all its candidates, gc once, and build each choice afresh
    in its place in `built` (removed if it fails to build again). Returns the screening records
    (`Screening.to_dict()`), the errors, and the seconds each took."""
    screened = {n: c for n, c in built.items() if isinstance(c, Candidates)}
    tuning: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name, candidates in screened.items():  # beside every runner the rounds will run
        t0 = time.perf_counter()
        tuning[name] = screen_candidates(candidates, settings, rank).to_dict()
        release(candidates)
        seconds[name] = time.perf_counter() - t0
    if screened:
        gc.collect()  # what of the candidates sits in reference cycles is freed now, not at a collection mid-round
    for name, candidates in screened.items():  # untrained, its --jitter draws from the first, as every other
        t0 = time.perf_counter()
        runner, error = build(chosen(candidates.strategy, tuning[name]))
        if error or runner is None:
            failed[name] = f"the chosen {tuning[name]['chosen_strategy']} could not be built again: {error}"
            del built[name]
        else:
            built[name] = runner
            seconds[name] += time.perf_counter() - t0
    return tuning, failed, seconds


def chosen(strategy: Strategy, record: dict[str, Any]) -> Strategy:
    """The concrete strategy the screening `record` (`Screening.to_dict()`) chose for `strategy`."""
    return next(c for _, c in strategy.candidates() if c.name == record["chosen_strategy"])


def as_screened(names: list[str], tuning: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each strategy's name as the simulator knows it: a tuned one's chosen concrete strategy."""
    return {n: tuning[n]["chosen_strategy"] if n in tuning else n for n in names}


def predictions_by_name(predictions: dict[str, Any], concrete: dict[str, str]) -> dict[str, Any]:
    """`job_predictions` made for the concrete names, keyed back by the bench's names (a tuned
    strategy gets its chosen value's prediction)."""
    out = dict(predictions)
    for key in ("predicted", "predicted_rate_only"):
        made = predictions.get(key) or {}
        out[key] = {n: made[c] for n, c in concrete.items() if c in made}
    return out
