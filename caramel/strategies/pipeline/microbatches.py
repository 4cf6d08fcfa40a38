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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from caramel.errors import CaramelError
from caramel.strategies.pipeline.planner import PartitionPlan, ScalingCost, _plan, balanced_boundaries, fit_scaling
from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.layout import stage_speeds
from caramel.strategies.pipeline.sharing import Factor, candidate_result, scaled, settle
from caramel.strategies.pipeline.profile_costs import TiedWeight, tied_allreduce_s, with_held_bytes, with_tied
from caramel.strategies.pipeline.overlap import REDUCE_MODES, replay_overlapped, replica_mode
from caramel.strategies.pipeline.replay import replay, replicated_actions, schedule_actions
from caramel.strategies.pipeline.simulate import stage_costs
from caramel.strategies.pipeline.transport import posting_for

__all__ = ["ScalingCost", "fit_scaling", "candidates", "choose_microbatches", "MicrobatchChoice", "profiled_scaling"]
from caramel.topology.spec import ClusterSpec

MAX_MICROBATCHES = 32


def candidates(batch: int, schedule: str, stages: int, positions: int, period: int = 1) -> list[int]:
    """Microbatch counts that split `batch` evenly and the schedule accepts (1F1B: m >= stages;
    interleaved: a multiple of the workers per pipeline), at most `MAX_MICROBATCHES`. `period`
    (unequal replicas: the counts' least common multiple): m a multiple of it, and 1F1B's bound
    holds for each of the m / period microbatches of a virtual pipeline."""
    low = stages * period if schedule == "1f1b" else 1
    out = [m for m in range(low, min(batch, MAX_MICROBATCHES) + 1) if batch % m == 0 and m % period == 0
           and (schedule != "interleaved" or m % positions == 0)]
    if not out:
        raise CaramelError(f"pipeline: no microbatch count splits the batch of {batch} for schedule={schedule} with "
                           f"stages={stages}"
                           + (f", replicas repeating every {period} microbatches" if period > 1 else "")
                           + f"; pass a batch divisible by {max(low, period)} or more")
    return out


def profiled_scaling(model: Any, inputs: Any, targets: Any, loss_fn: Callable, cands: list[int]) -> list[ScalingCost]:
    """Each layer's fitted cost line, from profiles of a copy of `model` (an `nn.Sequential`) at
    the smallest and the largest candidate microbatch. One size (a single candidate, or both
    sizes equal): per-sample lines with no fixed cost, as `scaling_from_profile` reads a profile
    at one batch size (`fit_scaling` needs two sizes)."""
    import copy

    from caramel.profile.profiler import profile_model
    from caramel.strategies.pipeline.planner import layer_costs_from_profile

    probe = copy.deepcopy(model)
    sizes = sorted({inputs.shape[0] // cands[-1], inputs.shape[0] // cands[0]})
    costs = []
    for n in sizes:
        prof = profile_model(probe, inputs[:n], targets[:n], loss_fn, steps=5, name="pipeline")
        costs.append(layer_costs_from_profile(prof, probe, inputs[:n]))
    if len(sizes) == 1:
        (n,), (at,) = sizes, costs
        return [ScalingCost(0.0, c.forward_s / n, 0.0, c.backward_s / n, c.output_bytes / n, c.param_bytes) for c in at]
    return fit_scaling(costs[0], sizes[0], costs[1], sizes[1])


@dataclass(frozen=True)
class MicrobatchChoice:
    microbatches: int
    plan: PartitionPlan  # the cut for that count and its predicted stage times
    predicted_step_s: dict[int, float]  # every candidate's simulated step


def choose_microbatches(layers: list[ScalingCost], batch: int, schedule: str, stages: int, positions: int,
                        cluster: ClusterSpec, speeds: list[float] | None = None, cuts: list[int] | None = None,
                        replicas: int | tuple[int, ...] = 1, transport: str = "rendezvous", optimizer_s: float = 0.0,
                        ties: list[TiedWeight] | None = None, reducer: str = "caramel",
                        reduce: str | None = None) -> MicrobatchChoice:
    """The candidate with the fastest simulated step (ties: fewer microbatches, fewer updates to
    stash for pipedream); `cuts` fixes the partition, else it is re-planned per candidate (at
    the speeds it is replayed at). Where `cluster`'s ranks share a host's cores, each candidate
    is replayed at the speeds its own host load settles at (`sharing.settle`), as the final
    prediction replays the count picked; `speeds` (per stage) are then scaled alike.
    `replicas`: of every stage, or one count per stage (unequal: round-robin, `unequal.py`).
    `transport`: as `simulate.simulate_pipeline`'s ("eager": a reference only). Each candidate
    is priced as `simulate_pipeline` prices that layout: the optimizer step (`optimizer_s`, the
    whole model's), the tied weights (`ties`) and, with equal replicas of gpipe or 1f1b, their
    reduction overlapped as the runtime runs it (`reducer`: the options' `replica_reducer()`;
    `overlap.replica_mode`), or as an explicit `reduce` (`overlap.REDUCE_MODES`: the mode
    `simulate_pipeline(reduce=...)` then replays the pick with, "after" its drain reference)."""
    if reduce is not None and reduce not in REDUCE_MODES:
        raise CaramelError(f"microbatches=auto: reduce must be one of {REDUCE_MODES} or None (as the runtime reduces), "
                           f"got {reduce!r}")
    if reduce not in (None, "after") and replica_mode(schedule, replicas, reducer) == "after":
        raise CaramelError(f"microbatches=auto: reduce={reduce!r} replays equal replicas of gpipe or 1f1b only "
                           f"(replicas >= 2); this layout (replicas={replicas}, schedule={schedule}) reduces after the drain")
    posting = posting_for(transport, schedule, "microbatches=auto")
    ties = ties or []
    speeds = speeds or [1.0] * stages
    unequal = not isinstance(replicas, int)
    counts = tuple(replicas) if unequal else (1,) * stages

    def score(m: int, factor: Factor | None) -> SimResult:
        """Candidate m replayed with every worker `factor` times its speed (`sharing.settle`;
        per worker under the "stage" model: each stage scaled by its ranks' slowest factor)."""
        at = cluster if factor is None else scaled(cluster, factor)
        if factor is None or isinstance(factor, (int, float)):
            sp = speeds if factor is None else [v * factor for v in speeds]
        else:
            sp = [v * f for v, f in zip(speeds, stage_speeds(list(factor), counts if unequal else (replicas,) * stages,
                                                             positions))]
        plan_speeds = [v * r for v, r in zip(sp, counts)]  # a stage on r replicas runs 1/r of the microbatches
        costs = [layer.at(batch / m) for layer in layers]
        plan = (balanced_boundaries(costs, plan_speeds, at) if cuts is None
                else _plan(costs, at, cuts, [1] * stages, plan_speeds))
        plan = dataclasses.replace(plan, replicas=list(counts)) if unequal else plan
        actions = (replicated_actions(schedule, counts, m) if unequal
                   else schedule_actions(schedule, stages, positions, m))
        tied_s = tied_allreduce_s(ties, plan.boundaries, len(costs), positions, at)
        mode = reduce or replica_mode(schedule, replicas, reducer, any(tied_s))
        sc = with_tied(stage_costs(with_held_bytes(costs, ties, plan.boundaries), plan.boundaries, at, replicas, sp,
                                   optimizer_s, mode), tied_s, mode)
        sim = (replay(sc, actions, at.compute_slowdown, math.lcm(*counts) if unequal else 0, posting)
               if mode == "after" else replay_overlapped(sc, actions, mode, at.compute_slowdown, posting=posting))
        return candidate_result(sim, "+".join(map(str, counts)) if unequal else replicas, plan=plan)

    table: dict[int, tuple[float, PartitionPlan]] = {}
    for m in candidates(batch, schedule, stages, positions, math.lcm(*counts)):
        sim = settle(lambda f, m=m: score(m, f), cluster)
        table[m] = (sim.step_time_s, sim.meta["plan"])
    best = min(table, key=lambda m: (table[m][0], m))
    return MicrobatchChoice(best, table[best][1], {m: t for m, (t, _) in table.items()})
