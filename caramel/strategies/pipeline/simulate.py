"""The pipeline strategy in the simulator: per-stage compute lanes, activation transfers over
the links between positions, the replicas' all-reduce at the end of the step.

The schedule is data: each position's ordered list of (stage, "F" | "B", microbatch), the same
order the runtime follows ("gpipe", "1f1b"/"pipedream": warmup forwards then one forward one
backward; "interleaved": torch's own `pipeline_order`). `replay` walks the lists: an action
starts when its position is free and its input has arrived (the previous stage's forward or the
next stage's backward, plus one link transfer when they sit on different positions). A
position's sends queue on its link, and its compute runs the cluster's `compute_slowdown` times
slower while one of its transfers is on the wire (CPU contention, `caramel.bench.contention`;
with the schedules' posting mostly only the sender's, `replay`).

    position 0 |F0|F1|F2|F3|        |B0|B1|B2|B3|      GPipe, 2 stages, 4 microbatches:
    position 1    |F0|F1|F2|F3|B0|B1|B2|B3|            bubble = (p-1)/(m+p-1) of the step

Asynchronous PipeDream drains at every `step()` in this runtime, so it replays like 1F1B.

Unequal replica counts (`replicas="2+1"`) replay one lane per rank (`replicated_actions`): the
rank holding replica j of stage s runs the virtual pipelines v = j, j + r_s, ... (v < the counts'
least common multiple L) one after another, each the schedule's own order over microbatches v,
v + L, ..., as `unequal.py` runs them; a transfer is charged when an action's input comes from
another lane, and a lane starts its next virtual pipeline once the previous one's sends landed.
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.event_loop import Busy
from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.layout import stage_speeds
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.overlap import REDUCE_MODES, replay_overlapped, replica_mode, stage_buckets
from caramel.strategies.pipeline.planner import (LayerCost, PartitionPlan, _plan, balanced_boundaries, message_cpu_s,
                                                 transfer_time_s)
from caramel.strategies.pipeline.profile_costs import (costs_from_profile, profiled_cuts, scaling_from_profile,
                                                       shares_a_weight, tied_allreduce_s, tied_weights,
                                                       with_held_bytes, with_tied)
from caramel.strategies.pipeline.sharing import lane_meta, with_sharing
from caramel.strategies.pipeline.timeline import MAX_CONTENTION_PASSES, Action, PipelineSim, StageCosts
from caramel.strategies.pipeline.transport import eager_ready_s, lane_programs, posting_for, run_programs, send_eager
from caramel.topology.spec import ClusterSpec
from caramel.trace.metrics import union_intervals


def schedule_actions(schedule: str, stages: int, positions: int, microbatches: int) -> list[list[Action]]:
    """Each position's ordered actions, as the runtime runs them."""
    m = microbatches
    if schedule == "interleaved":
        return _torch_order(stages, positions, m)
    if positions != stages:
        raise CaramelError(f"schedule={schedule} puts one stage per position; got {stages} stages on {positions}")
    if schedule == "gpipe":
        return [[(s, "F", i) for i in range(m)] + [(s, "B", i) for i in range(m)] for s in range(stages)]
    if schedule not in ("1f1b", "pipedream"):
        raise CaramelError(f"unknown pipeline schedule {schedule!r}")
    out = []
    for s in range(stages):
        w = min(m, stages - s - 1)
        acts = [(s, "F", i) for i in range(w)]
        for k in range(m - w):
            acts += [(s, "F", w + k), (s, "B", k)]
        out.append(acts + [(s, "B", k) for k in range(m - w, m)])
    return out


def replicated_actions(schedule: str, counts: tuple[int, ...] | list[int], microbatches: int) -> list[list[Action]]:
    """Each rank's ordered actions with `counts[s]` replicas of stage s (ranks stage-major), as
    the runtime runs them: its virtual pipelines in increasing v, each the schedule's order over
    its microbatches (global indices v, v + L, v + 2L, ...)."""
    period, stages = math.lcm(*counts), len(counts)
    if microbatches % period:
        raise CaramelError(f"replicas {'+'.join(map(str, counts))}: microbatches must be a multiple of {period}, "
                           f"got {microbatches}")
    per_virtual = schedule_actions(schedule, stages, stages, microbatches // period)
    lanes = []
    for s, r in enumerate(counts):
        for j in range(r):
            lanes.append([(s, kind, v + period * k) for v in range(j, period, r) for _, kind, k in per_virtual[s]])
    return lanes


def _torch_order(stages: int, positions: int, m: int) -> list[list[Action]]:
    """torch's interleaved 1F1B order, read from its schedule built over placeholder stages."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    fake = [SimpleNamespace(num_stages=stages, group_size=positions, group_rank=0, is_last=False, stage_index=i)
            for i in range(0, stages, positions)]
    order = ScheduleInterleaved1F1B(fake, m, loss_fn=lambda out, target: out).pipeline_order
    return [[(a.stage_index, a.computation_type.value, a.microbatch_index)
             for a in order[p] if a is not None and a.computation_type.value in ("F", "B")] for p in range(positions)]


def replay(costs: StageCosts, actions: list[list[Action]], compute_slowdown: float = 1.0,
           period: int = 0, posting: str | None = None) -> PipelineSim:
    """Walk every position's list in order; an action waits for its position and its input.

    `posting` (a schedule's name, `transport.POSTINGS`): each lane's sends and recvs as that
    schedule posts them, a transfer starting once its receiver has posted the recv, and the
    schedule's waits on its sends (`transport.py`). None: the model before that, below, where a
    transfer starts when its action ends and only the step's end waits for sends.

    A lane sends one transfer at a time, in its actions' order (a worker's sends share its
    link): a transfer starts when its action ends or the lane's previous send has landed,
    whichever is later, so microbatches that finish faster than the link carries them queue.

    `compute_slowdown` (the cluster's, measured by the bench: `caramel.bench.contention`):
    compute on a lane runs that many times slower while a transfer from or to that lane is on
    the wire (its backend's threads share the cores). A transfer's interval depends on when its
    sender finished, which depends on the slowdown: the replay is repeated, each pass slowing
    compute beside the previous pass's transfers, until the transfers stop moving (at most
    `MAX_CONTENTION_PASSES` passes). With the gpipe, 1f1b and pipedream postings a lane waits
    on each recv as soon as it posts it, so it never computes beside an incoming transfer, only
    beside its own sends (1f1b: in warmup and cooldown only, its steady phase waits each send
    before computing); that moves the step only where the receiver had posted first (the sender
    is the slower stage), else the late send still goes when the recv is posted. The
    interleaved posting computes beside recvs posted ahead.
    Where workers share a host's cores (`sharing.py`) the replay runs at slowdown 1 and every
    lane's transfers load the host instead; the returned `wire_s` (each lane's transfers on the
    wire, the last pass's) is what that load is read from.

    `period` (unequal replicas: the virtual pipelines' count L): microbatch i belongs to virtual
    pipeline i mod L. torch's schedule returns only after its sends complete, so a lane starts
    its next virtual pipeline only once the previous one's sends have landed; with any layout a
    lane's part of the step (and its all-reduce) ends when its last send has landed."""
    if compute_slowdown < 1.0:
        raise CaramelError(f"compute_slowdown must be >= 1 (1: transfers do not slow compute), got {compute_slowdown}")
    beside: list[list[tuple[float, float]]] | None = None
    for _ in range(MAX_CONTENTION_PASSES):
        sim, wires = (_replay_once(costs, actions, period, compute_slowdown, beside) if posting is None
                      else _replay_posted(costs, actions, period, posting, compute_slowdown, beside))
        if compute_slowdown == 1.0 or wires == beside:
            break
        beside = wires
    return dataclasses.replace(sim, wire_s=wires)


def _replay_once(costs: StageCosts, actions: list[list[Action]], period: int, slowdown: float,
                 beside: list[list[tuple[float, float]]] | None) -> tuple[PipelineSim, list[list[tuple[float, float]]]]:
    """One pass of `replay`: compute slowed beside `beside[p]` (disjoint, ordered intervals of
    lane p); returns the step and this pass's transfer intervals per lane."""
    n = len(costs.forward_s)
    where = {a: p for p, acts in enumerate(actions) for a in acts}  # the lane of every action
    held = [{s for s, _, _ in acts} for acts in actions]
    lanes = len(actions)
    busy_in = [Busy.over(slowdown, [a for a, _ in w], [b for _, b in w]) if beside else Busy(1.0)
               for w in (beside or [[]] * lanes)]
    wires: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]
    done: dict[Action, float] = {}
    free = [0.0] * lanes
    landed = [0.0] * lanes  # when this lane's sends so far have all arrived
    arrival: dict[Action, float] = {}  # when an action's output reached the lane that needs it
    busy = [0.0] * lanes
    spans: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]
    nxt = [0] * lanes
    remaining = sum(map(len, actions))
    while remaining:
        progressed = False
        for p, acts in enumerate(actions):
            while nxt[p] < len(acts):
                s, kind, i = acts[nxt[p]]
                ready = eager_ready_s((s, kind, i), n, done, arrival)
                if ready is None:
                    break
                if period and nxt[p] and acts[nxt[p] - 1][2] % period != i % period:
                    free[p] = max(free[p], landed[p])  # the previous virtual pipeline's schedule has returned
                dur = costs.forward_s[s] if kind == "F" else costs.backward_s[s]
                start = max(free[p], ready)
                free[p] = done[(s, kind, i)] = end = busy_in[p].advance(start, dur)
                busy[p] += end - start
                spans[p].append((start, end))
                send_eager((s, kind, i), end, n, p, where, costs.transfer_s, landed, arrival, wires)
                nxt[p] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise CaramelError("pipeline simulation: the schedule deadlocks (an action waits for one never run)")
    finish = [max(f, sent) for f, sent in zip(free, landed)]
    reduce = [max((costs.allreduce_s[s] for s in held[p]), default=0.0) if costs.allreduce_s else 0.0
              for p in range(lanes)]
    update = [sum(costs.update_s[s] for s in held[p]) if costs.update_s else 0.0 for p in range(lanes)]
    return (PipelineSim(max(f + r + u for f, r, u in zip(finish, reduce, update)), busy, finish, spans),
            [union_intervals(w) for w in wires])


def _replay_posted(costs: StageCosts, actions: list[list[Action]], period: int, posting: str, slowdown: float,
                   beside: list[list[tuple[float, float]]] | None) -> tuple[PipelineSim, list[list[tuple[float, float]]]]:
    """One pass of `replay` with the schedule's posting (`transport.run_programs`)."""
    n, lanes = len(costs.forward_s), len(actions)
    busy_in = [Busy.over(slowdown, [a for a, _ in w], [b for _, b in w]) if beside else Busy(1.0)
               for w in (beside or [[]] * lanes)]
    busy = [0.0] * lanes
    spans: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]

    def compute(p: int, a: Action, start: float) -> float:
        end = busy_in[p].advance(start, costs.forward_s[a[0]] if a[1] == "F" else costs.backward_s[a[0]])
        busy[p] += end - start
        spans[p].append((start, end))
        return end

    programs = lane_programs(posting, actions, n, (lambda i: i % period) if period else (lambda i: 0))
    finish, wires = run_programs(programs, n, costs.transfer_s, costs.latency_s, compute)
    held = [{s for s, _, _ in acts} for acts in actions]
    reduce = [max((costs.allreduce_s[s] for s in held[p]), default=0.0) if costs.allreduce_s else 0.0
              for p in range(lanes)]
    update = [sum(costs.update_s[s] for s in held[p]) if costs.update_s else 0.0 for p in range(lanes)]
    return (PipelineSim(max(f + r + u for f, r, u in zip(finish, reduce, update)), busy, finish, spans),
            [union_intervals(w) for w in wires])


def stage_costs(costs: list[LayerCost], boundaries: list[int], cluster: ClusterSpec,
                replicas: int | tuple[int, ...] | list[int] = 1, speeds: list[float] | None = None,
                optimizer_s: float = 0.0, reduce: str = "after") -> StageCosts:
    """Sum layers into stages (slowed by each stage's worker speed). `replicas`: of every stage,
    or one count per stage (each stage's all-reduce runs over its own). `optimizer_s`: the whole
    model's optimizer step, shared among the stages by their parameters' bytes. `reduce`
    ("forward", "backward": `overlap.py`) also prices each stage's all-reduce per bucket.

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
    if reduce != "after":
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
    sc = stage_costs(with_held_bytes(costs, ties, plan.boundaries), plan.boundaries, cluster,
                     counts if unequal else options.replicas, per_stage, profile.optimizer_time_s, mode)
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
