"""How many microbatches: chosen by the pipeline simulator from a profile at two sizes.

More microbatches shrink the bubble, `(p-1)/(m+p-1)` of the step, but each microbatch also
pays costs that do not shrink with its size: a layer reads its whole weight again for every
microbatch (on a CPU a 33 MB fully-connected layer is memory-bound: forward at 8 samples takes
5.0 ms against 9.4 ms at 32), and every action has its launch and transfer latency. So each
layer's forward and backward time is modelled as affine in the microbatch's samples,

    t(b) = fixed + per_sample * b        (fitted per layer from profiles at two sizes)

and for each candidate m the simulator replays the schedule with per-microbatch costs
`t(batch / m)` (the partition re-planned for that m when it is "auto"); the fastest wins.
With `fixed = 0` this is the textbook answer (more is better); with a large `fixed`, fewer.
"""
from __future__ import annotations

from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.strategies.pipeline.planner import LayerCost, PartitionPlan, _plan, balanced_boundaries
from caramel.strategies.pipeline.simulate import replay, schedule_actions, stage_costs
from caramel.topology.spec import ClusterSpec

MAX_MICROBATCHES = 32


@dataclass(frozen=True)
class ScalingCost:
    """One layer's cost at any microbatch size: fixed per microbatch plus per sample."""

    fixed_forward_s: float
    per_sample_forward_s: float
    fixed_backward_s: float
    per_sample_backward_s: float
    output_bytes_per_sample: float
    param_bytes: int

    def at(self, samples: float) -> LayerCost:
        return LayerCost(self.fixed_forward_s + self.per_sample_forward_s * samples,
                         self.fixed_backward_s + self.per_sample_backward_s * samples,
                         int(self.output_bytes_per_sample * samples), self.param_bytes)


def fit_scaling(small: list[LayerCost], small_samples: int, large: list[LayerCost], large_samples: int) -> list[ScalingCost]:
    """Per layer, the line through its measured times at two microbatch sizes. Noise can tilt
    a line below zero at either end; the fixed part is kept within [0, the smaller time] and the
    per-sample part non-negative, so no size is ever predicted to cost less than nothing."""
    if len(small) != len(large) or not 0 < small_samples < large_samples:
        raise CaramelError(f"fit_scaling: need the same layers at two sizes small < large, got {len(small)} layers at "
                           f"{small_samples} and {len(large)} at {large_samples}")

    def line(t_small: float, t_large: float) -> tuple[float, float]:
        slope = max(0.0, (t_large - t_small) / (large_samples - small_samples))
        fixed = min(max(0.0, t_small - slope * small_samples), t_small)
        return fixed, slope

    out = []
    for s, g in zip(small, large):
        ff, fs = line(s.forward_s, g.forward_s)
        bf, bs = line(s.backward_s, g.backward_s)
        out.append(ScalingCost(ff, fs, bf, bs, g.output_bytes / large_samples, g.param_bytes))
    return out


def candidates(batch: int, schedule: str, stages: int, positions: int) -> list[int]:
    """Microbatch counts that split `batch` evenly and the schedule accepts (1F1B: m >= stages;
    interleaved: a multiple of the workers per pipeline), at most `MAX_MICROBATCHES`."""
    low = stages if schedule == "1f1b" else 1
    out = [m for m in range(low, min(batch, MAX_MICROBATCHES) + 1) if batch % m == 0
           and (schedule != "interleaved" or m % positions == 0)]
    if not out:
        raise CaramelError(f"pipeline: no microbatch count splits the batch of {batch} for schedule={schedule} with "
                           f"stages={stages}; pass a batch divisible by {low} or more")
    return out


@dataclass(frozen=True)
class MicrobatchChoice:
    microbatches: int
    plan: PartitionPlan  # the cut for that count and its predicted stage times
    predicted_step_s: dict[int, float]  # every candidate's simulated step


def choose_microbatches(layers: list[ScalingCost], batch: int, schedule: str, stages: int, positions: int,
                        cluster: ClusterSpec, speeds: list[float] | None = None, cuts: list[int] | None = None,
                        replicas: int = 1) -> MicrobatchChoice:
    """The candidate with the fastest simulated step (ties: fewer microbatches, fewer updates to
    stash for pipedream); `cuts` fixes the partition, else it is re-planned per candidate."""
    speeds = speeds or [1.0] * stages
    table: dict[int, tuple[float, PartitionPlan]] = {}
    for m in candidates(batch, schedule, stages, positions):
        costs = [layer.at(batch / m) for layer in layers]
        plan = balanced_boundaries(costs, speeds, cluster) if cuts is None else _plan(costs, cluster, cuts, [1] * stages, speeds)
        sim = replay(stage_costs(costs, plan.boundaries, cluster, replicas, speeds),
                     schedule_actions(schedule, stages, positions, m))
        table[m] = (sim.step_time_s, plan)
    best = min(table, key=lambda m: (table[m][0], m))
    return MicrobatchChoice(best, table[best][1], {m: t for m, (t, _) in table.items()})
