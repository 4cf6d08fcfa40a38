"""Scoring a plan over a spread of inputs, so that it holds up when they were measured a little off.

A profile and a link speed measured online catch the host at one moment. On the 2-core test
host the three engine instances of one bench job profiled forward + backward 25-50% apart and
measured one 1 Gbit/s link at 821-1081 Mbit/s (docs/engine.md). A plan tuned to one such
measurement can sit on a cliff: a bucket that just fits its window under one profile misses it
under the next, and the step pays a whole transfer. Over the saved inputs of that bench run,
each instance's plan simulated under the other instances' inputs was 4.2% slower on average
than the best plan for those inputs (35% at worst); chosen over this spread, 2.0% (25%)
(`experiments/plan_regret.py`, docs/engine.md).

The spread: every worker's compute time and the link's bandwidth each scaled by 1 / (1 + s), 1
and 1 + s, the nine combinations weighted equally; `s = 0` is the inputs exactly. The caramel
planner searches on the inputs as given, then scores every candidate it simulated again by its
mean step time over the spread and keeps the lowest (`caramel_planner.plan_caramel`,
`input_spread`).

Contention: each of those combinations is simulated twice, as measured and with compute
running 1 + c times slower while a collective is in flight (`caramel.sim.event_loop`, CPU
contention; `contention_spread` c). The profile is measured while the provisional plan's few
large buckets leave backward mostly free of communication; the plan then streams beside it,
and backward slows (on the 2-core test host, with the communication threads at real-time
priority, GPT-2's 47 ms backward took 60 ms beside a 34 ms transfer: about 1.5x while the
transfer ran). A plan that waits for the most urgent bucket while ready ones could use the
link looks as fast as one that fills the link when backward runs at its profiled speed, and
loses a whole transfer's worth when it does not (GPT-2 at 1 Gbit/s: 163.8 ms with the first,
152.0 with the second, each its run's plan; docs/engine.md, "Contention in the spread").
"""
from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import statistics

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import predict_step_time_s, simulate
from caramel.sim.workload import Workload

DEFAULT_INPUT_SPREAD = 0.25  # about the half-range of the instance-to-instance spread above
DEFAULT_CONTENTION_SPREAD = 0.5  # compute 1.5x slower beside a collective, as measured above
MAX_INPUT_SPREAD = 4.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One point of the spread: its cost model (holding its scaled cluster) and the compute slowdown
    while a collective is in flight."""

    comm: CommModel
    compute_slowdown: float = 1.0

    @property
    def cluster(self) -> ClusterSpec:
        return self.comm.cluster


def _check_fraction(value: float, message: str) -> float:
    """`value` as a float when it is a real number from 0 to MAX_INPUT_SPREAD, else a `CaramelError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or not 0 <= value <= MAX_INPUT_SPREAD:
        raise CaramelError(f"{message}, got {value!r}")
    return float(value)


def check_input_spread(input_spread: float) -> float:
    """`input_spread` as a float, or a `CaramelError` naming it."""
    return _check_fraction(input_spread, f"input_spread must be a number from 0 (plan for the inputs exactly) to "
                                         f"{MAX_INPUT_SPREAD:g}, as a fraction (0.25: compute and bandwidth each up to "
                                         f"25% off)")


def check_contention_spread(contention_spread: float) -> float:
    """`contention_spread` as a float, or a `CaramelError` naming it."""
    return _check_fraction(contention_spread, f"contention_spread must be a number from 0 (compute as profiled beside "
                                              f"communication) to {MAX_INPUT_SPREAD:g}, as a fraction (0.5: the spread "
                                              f"also has compute 1.5x slower while a collective is in flight)")


def contention_levels(contention_spread: float) -> tuple[float, ...]:
    """Compute slowdowns while a collective is in flight, each simulated at every spread point,
    as multiples of the cluster spec's own `compute_slowdown`."""
    return (1.0,) if contention_spread == 0 else (1.0, 1.0 + contention_spread)


def spread_factors(input_spread: float) -> list[tuple[float, float]]:
    """(compute_scale, bandwidth_scale) pairs, the inputs as given first."""
    if input_spread == 0:
        return [(1.0, 1.0)]
    levels = (1.0, 1.0 + input_spread, 1.0 / (1.0 + input_spread))
    return [(c, b) for c in levels for b in levels]


def scaled_cluster(cluster: ClusterSpec, compute_scale: float, bandwidth_scale: float) -> ClusterSpec:
    """`cluster` with every worker `compute_scale` times slower and the links `bandwidth_scale` times faster."""
    workers = [dataclasses.replace(w, speed=w.speed / compute_scale) for w in cluster.workers]
    return dataclasses.replace(cluster, workers=workers, bandwidth_bps=cluster.bandwidth_bps * bandwidth_scale,
                               meta=dict(cluster.meta))


def spread_scenarios(cluster: ClusterSpec, input_spread: float, comm: CommModel,
                     contention_spread: float = 0.0) -> list[Scenario]:
    """The spread's scenarios, each cost model holding its scaled cluster, at every contention
    level; built once per planning from the cost model of the inputs as given. A collective's time is its latency plus
    bytes times `per_byte_s`, and with every link scaled alike the bandwidth part scales inversely
    with the bandwidth: the scaled model is `comm` with `per_byte_s / bandwidth_scale` (building
    each from scratch re-runs the message-level model: 0.39 s apiece for halving-doubling on a
    256-worker torus)."""
    out = []
    for c, b in spread_factors(input_spread):
        scaled = copy.copy(comm)
        scaled.cluster = scaled_cluster(cluster, c, b)
        scaled.per_byte_s = comm.per_byte_s / b
        # the levels are relative to the contention the cluster spec already states
        out.extend(Scenario(scaled, f * cluster.compute_slowdown) for f in contention_levels(contention_spread))
    return out


def spread_step_time_s(work: Workload, scenarios: list[Scenario], overlap: str, iterations: int) -> float:
    """Mean steady-state step time of one prebuilt workload over the scenarios (the planner's fast path)."""
    return statistics.fmean(predict_step_time_s(work, s.cluster, s.comm, overlap, iterations,
                                                compute_slowdown=s.compute_slowdown) for s in scenarios)


def spread_step_time_reference_s(profile: ModelProfile, cluster: ClusterSpec, plan: Plan, overlap: str,
                                 input_spread: float, comm_mode: str = "message", iterations: int = 3,
                                 contention_spread: float = DEFAULT_CONTENTION_SPREAD) -> float:
    """The same mean from scratch, one full `simulate` per scenario: the test oracle."""
    return statistics.fmean(
        simulate(profile, scaled_cluster(cluster, c, b), plan, overlap=overlap, iterations=iterations, trace=False,
                 comm=comm_mode, compute_slowdown=f * cluster.compute_slowdown).step_time_s
        for c, b in spread_factors(check_input_spread(input_spread))
        for f in contention_levels(check_contention_spread(contention_spread)))
