"""The pipeline strategy in the simulator: the registry's entry (`simulate_pipeline`), each
stage's costs from the profile (`stage_costs`), the choosers it runs first (`replicas="auto"`,
`microbatches="auto"`), and the host-sharing passes around the replay (`sharing.py`).

The schedules as data and their replay (each position's ordered actions walked over the stage
costs, transfers over the links, the replicas' all-reduce at the end of the step) are in
`replay.py`; the replicas' reduction overlapped with the drain and the next fill in
`overlap.py`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.layout import stage_speeds
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.overlap import REDUCE_MODES, replay_overlapped, replica_mode, stage_buckets
from caramel.strategies.pipeline.planner import (LayerCost, PartitionPlan, _plan, balanced_boundaries, message_cpu_s,
                                                 transfer_time_s)
from caramel.strategies.pipeline.profile_costs import (costs_from_profile, profiled_cuts, scaling_from_profile,
                                                       shares_a_weight, tied_allreduce_s, tied_weights,
                                                       with_held_bytes, with_tied)
from caramel.strategies.pipeline.replay import replay, replicated_actions, schedule_actions
from caramel.strategies.pipeline.sharing import lane_meta, with_sharing
from caramel.strategies.pipeline.timeline import StageCosts
from caramel.strategies.pipeline.transport import posting_for
from caramel.topology.spec import ClusterSpec

if TYPE_CHECKING:  # imported lazily at run time: only the spec's reduce_buckets="planner" needs it
    from caramel.strategies.pipeline.planner_buckets import PlannedReduce


def stage_costs(costs: list[LayerCost], boundaries: list[int], cluster: ClusterSpec,
                replicas: int | tuple[int, ...] | list[int] = 1, speeds: list[float] | None = None,
                optimizer_s: float = 0.0, reduce: str = "after",
                planned: list[PlannedReduce] | None = None) -> StageCosts:
    """Sum layers into stages (slowed by each stage's worker speed). `replicas`: of every stage,
    or one count per stage (each stage's all-reduce runs over its own). `optimizer_s`: the whole
    model's optimizer step, shared among the stages by their parameters' bytes. `reduce`
    ("forward", "backward": `overlap.py`) also prices each stage's all-reduce per bucket: one per
    layer, or with `reduce="forward"` and `planned` (one `planner_buckets.PlannedReduce` per
    stage) the collectives of Caramel's planner's plan for the stage.

    Each forward and backward also carries the CPU of its messages on that rank (`message_cpu_s`,
    from the spec's measured `collective_cpu_s`): the recv of its input from the neighbouring
    stage and the send of its output to the other, where there is one (every neighbouring stage
    is on another rank). It is wall time at the all-at-once load, as measured, so not divided by
    the stage's speed."""
    if reduce not in REDUCE_MODES:
        raise CaramelError(f"stage_costs: reduce must be one of {REDUCE_MODES}, got {reduce!r}")
    edges = [0, *boundaries, len(costs)]
    speeds = speeds or [1.0] * (len(edges) - 1)
    groups = [costs[a:b] for a, b in zip(edges[:-1], edges[1:])]
    stage_bytes = [sum(c.param_bytes for c in g) for g in groups]
    total_bytes = sum(stage_bytes)
    counts = [replicas] * len(groups) if isinstance(replicas, int) else list(replicas)
    rings = [ClusterSpec.uniform(r, cluster.bandwidth_bps, cluster.latency_s) for r in counts]
    update_s = [optimizer_s * nbytes / total_bytes / sp if total_bytes else 0.0 for nbytes, sp in zip(stage_bytes, speeds)]
    buckets = []
    if reduce == "forward" and planned is not None:
        from caramel.strategies.pipeline.overlap import bucket_cpu_s
        from caramel.strategies.pipeline.planner_buckets import planned_buckets

        buckets = [planned_buckets(pl, sp, r, cluster, u, bucket_cpu_s(cluster, r))
                   for pl, sp, r, u in zip(planned, speeds, counts, update_s)]
    elif reduce != "after":
        buckets = [stage_buckets([c.forward_s / sp for c in g], [c.backward_s / sp for c in g],
                                 [c.param_bytes for c in g], r, cluster, u, reduce)
                   for g, sp, r, u in zip(groups, speeds, counts, update_s)]
    ends = [(s > 0) + (s < len(groups) - 1) for s in range(len(groups))]  # messages per forward, per backward
    msg_s = message_cpu_s(cluster)
    return StageCosts([sum(c.forward_s for c in g) / sp + e * msg_s for g, sp, e in zip(groups, speeds, ends)],
                      [sum(c.backward_s for c in g) / sp + e * msg_s for g, sp, e in zip(groups, speeds, ends)],
                      [transfer_time_s(costs[b - 1].output_bytes, cluster) / 2 for b in boundaries],
                      [ring.allreduce_time_s(nbytes) for ring, nbytes in zip(rings, stage_bytes)],
                      update_s, buckets, cluster.latency_s)


def simulate_pipeline(profile: ModelProfile, cluster: ClusterSpec, options: PipelineOptions,
                      iterations: int = 4, reduce: str | None = None, transport: str = "rendezvous") -> SimResult:
    """The registry's simulator entry: one pipeline of `options.stages` over the first workers
    (times `replicas`), partition from the options or PipeDream's balance on the profile. Each
    pipeline's step takes one profile batch per position, so a step trains as many samples as
    data parallelism over the same workers does (as the bench runs it). `reduce`: how the
    replicas' all-reduce is priced (`overlap.REDUCE_MODES`; None: as the runtime runs it,
    `reduce_mode`; "after": the drain-then-reduce reference). `transport`: "rendezvous", each
    transfer as the schedule posts it and gloo starts it (`transport.py`), or "eager", a
    transfer starting when its action ends (the model before; a reference only), for the
    choosers of `replicas="auto"` and `microbatches="auto"` too.

    Workers sharing a host's cores (`cluster.ranks_per_host`, `alone_speedup`) are simulated at
    the speeds a pipeline's own busy time gives them (`sharing.py`: the simulation repeated
    until they settle; `meta["sharing"]`). The choosers run first, on the spec as given, and
    score each candidate so too (`sharing.settle`); the layout they pick is then simulated so."""
    if reduce is not None and reduce not in REDUCE_MODES:
        raise CaramelError(f"pipeline simulation: reduce must be one of {REDUCE_MODES} or None, got {reduce!r}")
    posting_for(transport, options.schedule, "pipeline simulation")
    replica_note = auto_note = counts_s = None  # counts_s: the count chooser's score of every count
    if options.auto_replicas:  # the runtime's choice, from the same costs (`auto_replicas.py`)
        options, replica_note = _auto_replicas(profile, cluster, options, reduce, transport)
    if options.microbatches == "auto":
        options, auto_note, counts_s = _auto_microbatches(profile, cluster, options, _positions(options, cluster),
                                                          transport, reduce)
    sim = with_sharing(lambda c: _simulate_once(profile, c, options, iterations, reduce, transport), cluster)
    sim.meta.update({"microbatches_auto": auto_note, "replicas_auto": replica_note, "microbatch_predictions_s": counts_s})
    return sim


def _positions(options: PipelineOptions, cluster: ClusterSpec) -> int:
    return options.stages if options.schedule != "interleaved" else cluster.world_size // options.replicas


def _simulate_once(profile: ModelProfile, cluster: ClusterSpec, options: PipelineOptions,
                   iterations: int, reduce: str | None, transport: str) -> SimResult:
    """`simulate_pipeline` of a layout whose counts are given (no "auto" replicas or
    microbatches; the cut may be "auto") at the cluster's speeds as given."""
    unequal = options.unequal_replicas
    positions = _positions(options, cluster)
    # equal replicas: each pipeline takes one batch per position; unequal: the one global batch, one per worker
    names, costs = costs_from_profile(profile, options.microbatches, batches=options.workers(positions)
                                      if unequal else positions)
    # each stage at its slowest worker's speed (the job's ranks, laid out as the runtime does)
    per_stage = stage_speeds([w.speed for w in cluster.workers], options.replica_counts(), positions)
    counts = options.replica_counts() if unequal else (1,) * options.stages
    # round-robin: each replica of stage s runs 1/r_s of the microbatches, as a worker r_s times as fast would
    plan_speeds = [sp * r for sp, r in zip(per_stage, counts)]
    cuts = options.boundaries()
    if cuts is None:
        plan: PartitionPlan = balanced_boundaries(costs, plan_speeds, cluster)
    else:
        plan = _plan(costs, cluster, profiled_cuts(names, cuts), [1] * options.stages, plan_speeds)
    if unequal:
        plan = dataclasses.replace(plan, replicas=list(counts))
    ties = tied_weights(profile, names)
    tied_s = tied_allreduce_s(ties, plan.boundaries, len(names), positions, cluster)
    mode = reduce or reduce_mode(options, any(tied_s))
    if mode != "after" and (unequal or options.schedule not in ("gpipe", "1f1b") or options.replicas == 1):
        raise CaramelError(f"pipeline simulation: reduce={mode!r} replays equal replicas of gpipe or 1f1b only "
                           f"(replicas >= 2); this layout (replicas={options.replicas}, schedule={options.schedule}) reduces "
                           f"after the drain (reduce='after' or None)")
    if any(tied_s) and not unequal and options.replicas > 1 and options.replica_reduce == "caramel":
        raise CaramelError("pipeline: replica_reduce='caramel' defers each update past the step and cannot sum "
                           "a tied weight split across stages; use replica_reduce='ddp' (or 'auto')")
    held = with_held_bytes(costs, ties, plan.boundaries)
    planned = (_planned(profile, names, held, plan.boundaries, options, positions)
               if mode == "forward" and cluster.reduce_buckets == "planner" else None)
    sc = stage_costs(held, plan.boundaries, cluster, counts if unequal else options.replicas, per_stage,
                     profile.optimizer_time_s, mode, planned)
    sc = with_tied(sc, tied_s, mode)
    actions = (replicated_actions(options.schedule, counts, options.microbatches) if unequal
               else schedule_actions(options.schedule, options.stages, positions, options.microbatches))
    posting = options.schedule if transport == "rendezvous" else None
    if mode == "after":
        sim = replay(sc, actions, cluster.compute_slowdown, math.lcm(*counts) if unequal else 0, posting)
    else:
        sim = replay_overlapped(sc, actions, mode, cluster.compute_slowdown, posting=posting)
    compute = max(sim.busy_s)
    comm = sum(sc.allreduce_s) + sum(sc.transfer_s) * 2 * options.microbatches
    return SimResult(step_time_s=sim.step_time_s, compute_time_s=compute, comm_time_s=comm,
                     exposed_comm_s=sim.step_time_s - compute, wait_time_s=sim.step_time_s - sum(sim.busy_s) / len(sim.busy_s),
                     link_utilization=min(1.0, sum(sc.transfer_s) * 2 * options.microbatches / sim.step_time_s),
                     comm_busy_fraction=min(1.0, comm / sim.step_time_s), iteration_times_s=[sim.step_time_s] * iterations,
                     critical_path={"slowest_stage": plan.slowest_stage, "stage_times_s": plan.stage_times_s},
                     planner=f"pipeline:{options.schedule}", overlap="none",  # replicas: meta["replica_reduce_model"]
                     world_size=options.workers(positions), num_items=options.microbatches,
                     meta={"boundaries": [names[b] for b in plan.boundaries], "bubble_fraction": sim.bubble_fraction,
                           "compute_slowdown": cluster.compute_slowdown, **lane_meta(sim, options.replicas),
                           "predicted_slowest_stage_s": max(plan.stage_times_s) * options.microbatches,
                           "microbatches": options.microbatches, "stages": options.stages,
                           "replica_reduce_model": mode, "transport": transport})


def _planned(profile: ModelProfile, names: list[str], costs: list[LayerCost], boundaries: list[int],
             options: PipelineOptions, positions: int) -> list[PlannedReduce]:
    """Each stage's plan from Caramel's planner, as the runtime's engine makes it from one
    microbatch of the stage (`planner_buckets.py`; the spec's `reduce_buckets="planner"`)."""
    from caramel.strategies.pipeline.planner_buckets import plan_reduce, stage_profile

    edges = [0, *boundaries, len(costs)]
    total = sum(c.param_bytes for c in costs)
    samples = profile.batch_size * positions / options.microbatches
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        share = sum(c.param_bytes for c in costs[a:b]) / total if total else 0.0
        out.append(plan_reduce(stage_profile(profile, names, costs, a, b, samples, profile.optimizer_time_s * share),
                               options.replicas))
    return out


def reduce_mode(options: PipelineOptions, tied_split: bool = False) -> str:
    """How the runtime reduces this layout's replicas, as `overlap.py` replays it: "forward"
    (Caramel's engine), "backward" (DDP), or "after" (no replicas; unequal counts' plain
    all-reduce; interleaved, whose lanes hold several stages, kept at the drain). With
    `replica_reduce="auto"` a tied weight split across stages makes the runtime reduce with DDP
    (`runtime.Pipeline._build`); an explicit "caramel" is refused there (`simulate_pipeline`)."""
    return replica_mode(options.schedule, options.replica_counts() if options.unequal_replicas else options.replicas,
                        options.replica_reducer(), tied_split)


def _auto_replicas(profile: ModelProfile, cluster: ClusterSpec, options: PipelineOptions, reduce: str | None = None,
                   transport: str = "rendezvous") -> tuple[PipelineOptions, dict]:
    """replicas="auto" resolved as the runtime resolves it, on the batch the bench gives it (one
    profile batch per worker): the counts, stages, microbatches (per pipeline for equal counts)
    and the cut, as explicit options. `reduce="after"` prices every candidate after the drain
    (the chooser before the overlapped reduction)."""
    from caramel.strategies.pipeline.auto_replicas import choose_replicas

    names, layers = scaling_from_profile(profile)
    choice = choose_replicas(layers, profile.batch_size * cluster.world_size, options.schedule, cluster,
                             None if options.stages == "auto" else options.stages,
                             None if options.microbatches == "auto" else options.microbatches,
                             profile.optimizer_time_s, shares_a_weight(profile),
                             ties=tied_weights(profile, names), reducer=options.replica_reducer(),
                             reduce="after" if reduce == "after" else None, transport=transport)
    counts, m = choice.counts, choice.microbatches
    equal = len(set(counts)) == 1
    concrete = dataclasses.replace(options, stages=len(counts), replicas=counts[0] if equal else "+".join(map(str, counts)),
                                   microbatches=m // counts[0] if equal else m,
                                   partition="+".join(names[c] for c in choice.plan.boundaries))
    return concrete, {"counts": counts, "microbatches": m, "predicted_slowest_stage_s": choice.plan.slowest_s,
                      "candidates_s": choice.candidates_s}


def _auto_microbatches(profile: ModelProfile, cluster: ClusterSpec, options: PipelineOptions, positions: int,
                       transport: str = "rendezvous", reduce: str | None = None
                       ) -> tuple[PipelineOptions, str, dict[int, float]]:
    """microbatches="auto" from the profile: with module times at two batch sizes each layer has
    a fixed cost per microbatch, as in the runtime's choice; with one size only per-sample costs
    and the links' latency per transfer decide, which favours more microbatches. An explicit
    `reduce` prices every count in that mode, as the final replay then runs the pick."""

    from caramel.strategies.pipeline.microbatches import choose_microbatches

    batch = profile.batch_size * (options.workers(positions) if options.unequal_replicas else positions)
    names, layers = scaling_from_profile(profile)
    cuts = options.boundaries()
    fixed = None
    if cuts is not None:  # the same mapping of layer indices to profiled layers as simulate_pipeline's
        fixed = profiled_cuts(names, cuts)
    choice = choose_microbatches(layers, batch, options.schedule, options.stages, positions, cluster,
                                 stage_speeds([w.speed for w in cluster.workers], options.replica_counts(), positions),
                                 fixed,
                                 options.replica_counts() if options.unequal_replicas else options.replicas,
                                 transport, profile.optimizer_time_s, tied_weights(profile, names),
                                 options.replica_reducer(), reduce)
    return (dataclasses.replace(options, microbatches=choice.microbatches),
            "chosen by simulation from the profile "
            + ("at two batch sizes" if profile.small_batch_size else "at one batch size (no per-microbatch fixed cost)")
            + f": {choice.microbatches}", choice.predicted_step_s)
