"""A tuned reference: the bench screens a grid of one option's values in the job and runs the fastest.

`--strategies ddp:bucket_cap_mb=tuned` asks for the strongest DDP the bench can build here, not
torch's default. In the job, before the interleaved rounds, on the same processes, links and
thread priority as everything else: each value of the grid (`caramel.bench.matrix.TUNABLE`) gets
its own runner on an identical model copy, `warmup_steps` unmeasured steps, then
`screen_rounds` rounds of one block of `steps_per_round` steps each, the order rotating per
round as in the measured rounds. Every rank gathers every rank's times and takes the job's step
(the slowest rank's clock, `job_step_times`), so all ranks see the same numbers and pick the same
value: the lowest median, the first in grid order on a tie. The winner's runner then takes its
turn in the interleaved rounds under the tuned name; its screening times are not used again, so
the reference's reported step is measured afresh and not biased low by the pick (noise can only
make the pick a near-tie's other value, and the report gives the runner-up's gap and its interval).

The bucket-cap grid, torch's default (a 1 MB first bucket, then 25 MB), then 0.25, 0.5, 1, 2, 4
and 25 MB: doubling steps over the range where the measured optimum of the zoo's models lies
(0.5-1 MB for ResNet-18 width 16, 2.8 MB of gradients, docs/results/ddp-bucket-caps-ratio1.md),
where neighbours differed by at most 6%, so a finer grid gains little; 0.25 MB is already about
11 collectives for ResNet-18 (more for GPT-2's 16.9 MB), each paying the link's fixed cost; 4 MB
lets GPT-2 start early with a few large buckets; 25 MB given explicitly is torch's cap with no
small first bucket (one bucket after backward for ResNet-18): the other end. Seven values of
`screen_rounds` x `steps_per_round` steps (4 x 8 by default: 32 each, 224 in all) cost about as
many steps as three more strategies in the default 10 rounds of 8.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from caramel.bench.baselines import Runner
from caramel.bench.blocks import measure_block, round_order
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
        out.runner_up = values[second]
        out.runner_up_gap = medians[second] / medians[best] - 1.0
        out.runner_up_ci95 = paired_ratio_interval(series[second], series[best], steps_per_round)
    return out


def screen(runners: dict[str, Runner], settings: BenchSettings) -> dict[str, list[float]]:
    """Warm each candidate up, time `screen_rounds` rotating rounds of one block each; on every
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
        for name in round_order(names, r):
            dist.barrier()
            local[name] += measure_block(runners[name], settings.steps_per_round)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return {n: job_step_times([g[n] for g in gathered], settings.steps_per_round) for n in names}


def screen_strategy(strategy: Strategy, runners: dict[str, Runner], values: dict[str, Any],
                    settings: BenchSettings, skipped: dict[str, str], rank: int) -> tuple[Runner, Screening]:
    """Screen the built candidates of `strategy` (concrete name -> runner, in grid order; `values`:
    concrete name -> grid value) and return the winner's runner with the record."""
    series = screen(runners, settings)
    names = list(runners)
    (option,) = strategy.tuned
    result = select(option, [values[n] for n in names], names, [series[n] for n in names], settings.screen_rounds,
                    settings.steps_per_round, skipped)
    if rank == 0:
        print(f"[bench] {strategy.name}: screened " + ", ".join(
            f"{value_label(v)} {1e3 * t:.1f} ms" for v, t in zip(result.values, result.median_s))
              + f" -> {option}={value_label(result.chosen)}" + (
                  f" (runner-up {value_label(result.runner_up)} {result.runner_up_gap:+.1%})"
                  if result.runner_up_gap is not None else ""), file=sys.stderr, flush=True)
    return runners[result.chosen_strategy], result


def tuned_runner(strategy: Strategy, build: Callable[[Strategy], tuple[Runner | None, str | None]],
                 settings: BenchSettings, rank: int, tuning: dict[str, dict[str, Any]]) -> tuple[Runner | None, str | None]:
    """A strategy with a tuned option in the harness: every grid value built by `build` (a
    runner, or the error all ranks agree on; values that fail are left out and recorded),
    screened, the fastest's runner returned; the record goes to `tuning`. An error only when no
    value could be built."""
    built: dict[str, Runner] = {}
    values: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for value, concrete in strategy.candidates():
        runner, error = build(concrete)
        if error or runner is None:
            failed[concrete.name] = error or "not built"
        else:
            built[concrete.name], values[concrete.name] = runner, value
    if not built:
        return None, "no value of the grid could be built: " + "; ".join(f"{n}: {e}" for n, e in failed.items())
    if rank == 0:
        print(f"[bench] {strategy.name}: screening {len(built)} values, {settings.screen_rounds} rounds x "
              f"{settings.steps_per_round} steps each", file=sys.stderr, flush=True)
    runner, result = screen_strategy(strategy, built, values, settings, failed, rank)
    tuning[strategy.name] = result.to_dict()
    return runner, None


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
