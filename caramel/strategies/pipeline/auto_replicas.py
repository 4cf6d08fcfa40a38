"""`replicas="auto"`: stage boundaries and data-parallel replicas per stage, for the synchronous runtime.

PipeDream's dynamic program (`planner.pipedream_partition`) prices a stage on r replicas at its
asynchronous pace, `max(compute, allreduce) / r` per microbatch. The synchronous schedules (gpipe,
1f1b) run a stage's share of the step's M microbatches and then all-reduce its gradients once,
after the drain, so here a stage costs, per step,

    T(a..b, r, ranks) = (M / r) * compute(a..b) / speed(ranks) + allreduce(params(a..b), r)
    C(i)              = M * (activation out of layer i-1 and its gradient back, one link)

and the dynamic program takes PipeDream's recurrence over layers and workers with two changes:
every worker is used (the runtime has no idle rank: the counts sum to the world), and only
counts the runtime can run are taken: microbatch k goes to replica k mod r of each stage, so
every count divides M, their least common multiple L is at most `MAX_VIRTUAL_PIPELINES`, and
1F1B gives each virtual pipeline M / L >= stages microbatches. The state carries L so far.
Stage s's ranks are stage-major (the runtime's layout), each stage at its slowest rank's speed.

Neither the fill and drain nor how the links overlap compute is in T; so each candidate (a
stage count and a microbatch count, where they are free) has its plan replayed by the pipeline
simulator (`replay.replay`, the runtime's order; equal counts, whose replicas Caramel's engine
reduces during the drain and the next fill, by `overlap.replay_overlapped`), beside the same counts cut to balance
compute (`balanced_boundaries`, what `partition="auto"` gives given counts), and the fastest
simulated step wins.

Where ranks share a host's cores (`sharing.py`), each candidate is replayed at the speeds its
own host load settles at (`sharing.settle`), as the final prediction replays the layout picked:
a layout that keeps more ranks computing or transferring at once is priced slower before it is
picked. The program proposes at the all-at-once speeds, then again at the speeds the fastest
candidate settles at, until it proposes no layout not yet scored. Neither it nor the balanced
cut sees the load, so a search around their proposals (`layout_search.descend`: one cut with
its two stages' replicas, or the microbatch count, moved while the settled step drops) then
scores the layouts they miss. Unshared hosts score the proposals only, on purpose: their picks
stay bit for bit as before the search, though the proposals miss there too (the program leaves
out the fill, the drain and the overlap; `search=True` forces the search, docs/pipeline.md).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from caramel.errors import CaramelError
from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.layout_search import SEARCH_BUDGET, Layout, descend, feasible
from caramel.strategies.pipeline.options import MAX_VIRTUAL_PIPELINES, PipelineOptions
from caramel.strategies.pipeline.overlap import replay_overlapped
from caramel.strategies.pipeline.planner import (LayerCost, PartitionPlan, ScalingCost, balanced_boundaries,
                                                 transfer_time_s)
from caramel.strategies.pipeline.profile_costs import TiedWeight, tied_allreduce_s, with_held_bytes, with_tied
from caramel.strategies.pipeline.replay import replay, replicated_actions, schedule_actions
from caramel.strategies.pipeline.sharing import (MAX_SHARING_PASSES, Factor, candidate_result, one_factor, scaled,
                                                 settle, shares_cores)
from caramel.strategies.pipeline.simulate import stage_costs
from caramel.strategies.pipeline.transport import posting_for
from caramel.topology.spec import ClusterSpec

MAX_MICROBATCHES = 32  # as `microbatches="auto"` (microbatches.py)


def stage_step_s(layers: list[LayerCost], replicas: int, microbatches: int, cluster: ClusterSpec,
                 speed: float = 1.0) -> float:
    """A stage's part of a synchronous step: its replica's microbatches, then its all-reduce."""
    compute = sum(c.compute_s for c in layers) / speed * microbatches / replicas
    ring = ClusterSpec.uniform(replicas, cluster.bandwidth_bps, cluster.latency_s)
    return compute + ring.allreduce_time_s(sum(c.param_bytes for c in layers))


def _plan(costs: list[LayerCost], cluster: ClusterSpec, cuts: list[int], counts: list[int], microbatches: int,
          speeds: list[float]) -> PartitionPlan:
    """A plan's per-step stage and link times (`PartitionPlan.slowest_s` is then per step)."""
    edges, out, first = [0, *cuts, len(costs)], [], 0
    for (a, b), r in zip(zip(edges[:-1], edges[1:]), counts):
        out.append(stage_step_s(costs[a:b], r, microbatches, cluster, min(_speeds(speeds, first, r))))
        first += r
    links = [microbatches * transfer_time_s(costs[c - 1].output_bytes, cluster) for c in cuts]
    return PartitionPlan(list(cuts), list(counts), out, links)


def _speeds(speeds: list[float], first: int, r: int) -> list[float]:
    return [speeds[g] if g < len(speeds) else 1.0 for g in range(first, first + r)]


class _Program:
    """The dynamic program for one microbatch count, shared by every stage count asked of it
    (its table does not depend on the target); stage costs from prefix sums, O(1) each."""

    def __init__(self, costs: list[LayerCost], cluster: ClusterSpec, microbatches: int, schedule: str,
                 speeds: list[float], equal_counts: bool = False):
        self.costs, self.cluster, self.m, self.schedule = costs, cluster, microbatches, schedule
        self.equal_counts = equal_counts  # only equal counts (a weight tied across layers: `tied.py`)
        self.speeds = [speeds[g] if g < len(speeds) else 1.0 for g in range(cluster.world_size)]
        self.compute = list(itertools.accumulate((c.compute_s for c in costs), initial=0.0))
        self.params = list(itertools.accumulate((c.param_bytes for c in costs), initial=0))
        self.divisors = [r for r in range(1, cluster.world_size + 1) if microbatches % r == 0]
        self.rings = {r: ClusterSpec.uniform(r, cluster.bandwidth_bps, cluster.latency_s) for r in self.divisors}
        self.links = [0.0] + [microbatches * transfer_time_s(c.output_bytes, cluster) for c in costs]
        self.best = lru_cache(maxsize=None)(self._best)

    def _stage(self, a: int, b: int, r: int, first: int) -> float:
        """`stage_step_s` of layers [a, b) on workers [first, first + r)."""
        speed = min(self.speeds[first:first + r])
        return ((self.compute[b] - self.compute[a]) / speed * self.m / r
                + self.rings[r].allreduce_time_s(self.params[b] - self.params[a]))

    def _best(self, j: int, w: int, s: int, period: int) -> tuple[float, tuple[tuple[int, int], ...]]:
        """Layers [0, j) on workers [0, w) in exactly s stages whose counts' lcm is `period`:
        (slowest, ((first layer, replicas), ...))."""
        if s == 1:
            if w != period or w not in self.rings:
                return math.inf, ()
            return self._stage(0, j, w, 0), ((0, w),)
        top: tuple[float, tuple[tuple[int, int], ...]] = (math.inf, ())
        for i in range(s - 1, j):
            for r in self.divisors:
                if r > w - (s - 1):
                    break
                tail = max(self.links[i], self._stage(i, j, r, w - r))
                if tail >= top[0]:
                    continue
                # past the virtual pipelines' limit only equal counts run (`feasible`)
                only_equal = self.equal_counts or period > MAX_VIRTUAL_PIPELINES
                if only_equal and r != period:
                    continue
                for head_period in range(1, period + 1):
                    if period % head_period or math.lcm(head_period, r) != period:
                        continue
                    if only_equal and head_period != period:
                        continue
                    head, plan = self.best(i, w - r, s - 1, head_period)
                    t = max(head, tail)
                    if t < top[0]:
                        top = (t, plan + ((i, r),))
        return top

    def plan(self, stages: int) -> PartitionPlan | None:
        """Exactly `stages` stages on every worker, the slowest stage or link least."""
        n, w = len(self.costs), self.cluster.world_size
        if stages > min(n, w):
            return None
        # counts whose lcm is p; past the virtual pipelines' limit, only equal counts w / stages
        periods = [p for p in range(1, MAX_VIRTUAL_PIPELINES + 1)] + (
            [w // stages] if w % stages == 0 and w // stages > MAX_VIRTUAL_PIPELINES else [])
        if self.equal_counts:
            periods = [w // stages] if w % stages == 0 else []
        periods = [p for p in periods if self.m % p == 0 and (self.schedule != "1f1b" or self.m // p >= stages)]
        _, best = min((self.best(n, w, stages, p) for p in periods), key=lambda x: x[0], default=(math.inf, ()))
        if not best:
            return None
        return _plan(self.costs, self.cluster, [i for i, _ in best[1:]], [r for _, r in best], self.m, self.speeds)


def replica_partition(costs: list[LayerCost], cluster: ClusterSpec, stages: int, microbatches: int,
                      schedule: str = "gpipe", speeds: list[float] | None = None) -> PartitionPlan | None:
    """The dynamic program above: exactly `stages` stages on all `cluster.world_size` workers,
    the slowest stage or link per step least; None when no feasible counts exist."""
    return _Program(costs, cluster, microbatches, schedule, speeds or [w.speed for w in cluster.workers]).plan(stages)


def brute_force_replica_partition(costs: list[LayerCost], cluster: ClusterSpec, stages: int, microbatches: int,
                                  schedule: str = "gpipe", speeds: list[float] | None = None) -> PartitionPlan | None:
    """Every cut into `stages` and every feasible count vector summing to the world (small
    inputs only): the test oracle."""
    speeds = speeds or [w.speed for w in cluster.workers]
    w = cluster.world_size
    plans = [_plan(costs, cluster, list(cuts), list(counts), microbatches, speeds)
             for cuts in itertools.combinations(range(1, len(costs)), stages - 1)
             for counts in itertools.product(range(1, w + 1), repeat=stages)
             if sum(counts) == w and feasible(counts, microbatches, schedule)]
    return min(plans, key=lambda p: p.slowest_s, default=None)


def _proposals(costs_at: dict[int, list[LayerCost]], cluster: ClusterSpec, stage_options: list[int], schedule: str,
               equal_counts: bool) -> list[Layout]:
    """For each stage count and microbatch count, the dynamic program's cut and counts at
    `cluster`'s speeds, and the compute-balanced cut for those counts (what partition="auto"
    gives them): the program's link term charges every transfer unoverlapped, so where the two
    differ the simulator, which overlaps them as the runtime does, decides."""
    speeds = [wk.speed for wk in cluster.workers]
    out: list[Layout] = []
    programs = {m: _Program(costs, cluster, m, schedule, speeds, equal_counts) for m, costs in costs_at.items()}
    for s in stage_options:
        for m, costs in costs_at.items():
            plan = programs[m].plan(s)
            if plan is None:
                continue
            counts = tuple(plan.replicas)
            firsts = list(itertools.accumulate([0, *counts[:-1]]))
            per_stage = [min(_speeds(speeds, f, r)) for f, r in zip(firsts, counts)]
            balanced = balanced_boundaries(costs, [sp * r for sp, r in zip(per_stage, counts)], cluster).boundaries
            out += [Layout(cuts, counts, m) for cuts in dict.fromkeys((tuple(plan.boundaries), tuple(balanced)))]
    return out


def _score(lay: Layout, costs: list[LayerCost], cluster: ClusterSpec, factor: Factor | None, schedule: str,
           optimizer_s: float, ties: list[TiedWeight], reducer: str, reduce: str | None,
           posting: str | None) -> SimResult:
    """One candidate's step, replayed as `simulate_pipeline` replays that layout, with every
    worker `factor` times its speed (one factor, or one per worker) and no sharing left to
    model (`sharing.settle`; None: the spec as given). Equal counts r > 1 run as r pipelines whose replicas reduce with Caramel's
    engine (DDP where asked, or where the cut splits a tied weight), overlapped as `overlap.py`
    replays it."""
    at = cluster if factor is None else scaled(cluster, factor)
    speeds, cuts, counts, m, s = [wk.speed for wk in at.workers], list(lay.cuts), lay.counts, lay.microbatches, len(lay.counts)
    firsts = list(itertools.accumulate([0, *counts[:-1]]))
    per_stage = [min(_speeds(speeds, f, r)) for f, r in zip(firsts, counts)]
    tied_s = tied_allreduce_s(ties, cuts, len(costs), s, at)
    mode = ("after" if reduce == "after" or len(set(counts)) > 1 or counts[0] == 1
            else "backward" if reducer == "ddp" or any(tied_s) else "forward")
    sc = stage_costs(with_held_bytes(costs, ties, cuts), cuts, at, counts, per_stage, optimizer_s, mode)
    sc = with_tied(sc, tied_s, mode)
    if mode == "after":
        sim = replay(sc, replicated_actions(schedule, counts, m), at.compute_slowdown, math.lcm(*counts), posting)
    else:
        sim = replay_overlapped(sc, schedule_actions(schedule, s, s, m // counts[0]), mode, at.compute_slowdown,
                                posting=posting)
    return candidate_result(sim, counts[0] if len(set(counts)) == 1 else "+".join(map(str, counts)))


@dataclass(frozen=True)
class ReplicaChoice:
    """What `replicas="auto"` runs: the cut and counts (`plan`, per-step times), the step's
    microbatches in all (a pipeline of equal counts r runs microbatches / r each), and every
    candidate's simulated step, keyed "stages x microbatches"; what the choice cost: the layouts
    settled in all, of them the search's, and the search's stages x microbatches
    (`layout_search.search_cost`)."""

    plan: PartitionPlan
    microbatches: int
    predicted_step_s: float
    candidates_s: dict[str, float]
    settled: int = 0
    searched: int = 0
    search_spent: int = 0

    @property
    def counts(self) -> list[int]:
        return list(self.plan.replicas)

    @property
    def stages(self) -> int:
        return len(self.plan.replicas)


def choose_replicas(layers: list[ScalingCost], batch: int, schedule: str, cluster: ClusterSpec,
                    stages: int | None = None, microbatches: int | None = None,
                    optimizer_s: float = 0.0, equal_counts: bool = False, ties: list[TiedWeight] | None = None,
                    reducer: str = "caramel", reduce: str | None = None,
                    transport: str = "rendezvous", search: bool | None = None,
                    search_budget: int = SEARCH_BUDGET) -> ReplicaChoice:
    """For each stage count (`stages`, or 2 up to the world and the layers) and microbatch count
    (`microbatches`, or every count <= 32 dividing `batch`), the dynamic program's plan; the
    simulated fastest of them (ties: fewer stages, fewer microbatches). `equal_counts`: only
    equal counts, the runtime's one layout for a weight tied across stages (`tied.py`); `ties`:
    those weights, priced as `simulate_pipeline` prices them (every holding stage reduces their
    bytes, a cut that splits one sums them over positions and reduces with DDP). `reducer`: the
    options' `replica_reducer()` ("caramel" or "ddp"). `reduce="after"` prices every candidate's
    reduction after the drain, as the chooser did before `overlap.py` (a reference only).
    `transport`: "rendezvous" (each schedule's sends and recvs as it posts them, `transport.py`)
    or "eager" (a transfer starts when its action ends; a reference only). `search`: the search
    around the proposals (`layout_search.descend`) on a shared host only (None), everywhere
    (True; a reference only: unshared picks then move, `experiments/pipeline_proposer_search.py
    --unshared`) or nowhere (False), within `search_budget` stages x microbatches."""
    posting = posting_for(transport, schedule, "replicas=auto")
    if reduce not in (None, "after"):
        raise CaramelError(f"replicas=auto: reduce must be None (as the runtime reduces) or 'after', got {reduce!r}")
    if reducer not in ("caramel", "ddp"):
        raise CaramelError(f"replicas=auto: reducer must be 'caramel' or 'ddp', got {reducer!r}")
    ties = ties or []
    equal_counts = equal_counts or bool(ties)
    if schedule not in ("gpipe", "1f1b"):
        raise CaramelError(f"replicas=auto chooses counts for schedule gpipe or 1f1b, not {schedule!r}")
    w = cluster.world_size
    if w < 2:
        raise CaramelError(f"replicas=auto: a pipeline of 2 or more stages needs 2 or more workers; the group has {w}")
    if len(layers) < 2:
        raise CaramelError(f"replicas=auto: a pipeline of 2 or more stages needs 2 or more layers; the model has "
                           f"{len(layers)}")
    if stages is not None and stages > min(w, len(layers)):
        raise CaramelError(f"replicas=auto: stages={stages} needs {stages} workers and {stages} layers; the group has "
                           f"{w} workers, the model {len(layers)} layers: give stages <= {min(w, len(layers))}")
    stage_options = [stages] if stages is not None else list(range(2, min(w, len(layers)) + 1))
    counts_m = [microbatches] if microbatches is not None else [m for m in range(1, min(batch, MAX_MICROBATCHES) + 1)
                                                                if batch % m == 0]
    speeds = [wk.speed for wk in cluster.workers]
    costs_at = {m: [layer.at(batch / m) for layer in layers] for m in counts_m if batch % m == 0}
    layouts: dict[Layout, SimResult] = {}  # every candidate scored, in the order proposed
    at = cluster
    for _ in range(MAX_SHARING_PASSES):
        new = [lay for lay in _proposals(costs_at, at, stage_options, schedule, equal_counts) if lay not in layouts]
        for lay in new:
            layouts[lay] = settle(lambda f, lay=lay: _score(lay, costs_at[lay.microbatches], cluster, f, schedule,
                                                            optimizer_s, ties, reducer, reduce, posting), cluster)
        if not new or not shares_cores(cluster) or not layouts:
            break
        # the program's cuts and counts at the speeds the fastest so far settles at, till it proposes
        # no new one; one factor for all (`one_factor`): per-worker ones belong to that layout's stages
        fastest = min(layouts.values(), key=lambda r: r.step_time_s)
        at = scaled(cluster, one_factor(fastest))
    searched = search_spent = 0
    if search or (search is None and shares_cores(cluster)):
        # the program cannot see the host's load: from each stage and microbatch count's fastest,
        # one cut (with its two stages' replicas) moved while the settled step drops
        searched, search_spent = descend(
            layouts, len(layers), schedule, equal_counts,
            lambda lay: settle(lambda f: _score(lay, costs_at[lay.microbatches], cluster, f, schedule, optimizer_s,
                                                ties, reducer, reduce, posting), cluster), search_budget)
    table: dict[tuple[int, int], tuple[float, PartitionPlan]] = {}
    for lay, sim in layouts.items():
        key, step = (len(lay.counts), lay.microbatches), sim.step_time_s
        if key not in table or step < table[key][0]:
            table[key] = (step, _plan(costs_at[lay.microbatches], cluster, list(lay.cuts), list(lay.counts),
                                      lay.microbatches, speeds))
    if not table:
        raise CaramelError(f"replicas=auto: no replica counts for "
                           f"{'stages=' + str(stages) if stages else 'any stage count'} on {w} workers run "
                           f"{'microbatches=' + str(microbatches) if microbatches else 'any microbatch count of the batch of ' + str(batch)} "
                           f"with schedule={schedule} (each count must divide the microbatches, their least common "
                           f"multiple <= {MAX_VIRTUAL_PIPELINES} unless they are equal"
                           f"{'; a weight tied across layers takes equal counts only' if equal_counts else ''}{', and 1f1b needs microbatches / lcm >= stages' if schedule == '1f1b' else ''}); "
                           f"give another microbatch count or stages")
    key = min(table, key=lambda k: (table[k][0], k))
    step, plan = table[key]
    return ReplicaChoice(plan, key[1], step,
                         {f"{s}x{m}": t for (s, m), (t, _) in sorted(table.items())},
                         len(layouts), searched, search_spent)


def agree_on_replicas(model: Any, options: PipelineOptions, inputs: Any, targets: Any, loss_fn: Callable,
                      cluster: ClusterSpec | None, profile: Any, process_group: Any = None
                      ) -> tuple[ReplicaChoice, list[str]]:
    """The runtime's side (every rank of `process_group` calls it): the group's first rank takes
    `profile` or profiles a copy of `model` at the largest candidate microbatch with the
    smallest timed too (a fixed cost per microbatch plus one per sample), chooses on the
    profile's layers, and sends the choice and the names of the layers that begin stages 1..;
    a choice that cannot be made is one error on every rank."""
    import copy

    import torch.distributed as dist

    from caramel.strategies.pipeline.profile_costs import scaling_from_profile, shares_a_weight, tied_weights

    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    box: list[Any] = [None]
    if dist.get_rank() == ranks[0]:
        try:
            batch = inputs.shape[0]
            if profile is None:
                from caramel.profile.profiler import profile_model

                counts = ([options.microbatches] if isinstance(options.microbatches, int)
                          else [m for m in range(1, min(batch, MAX_MICROBATCHES) + 1) if batch % m == 0])
                large, small = batch // min(counts), batch // max(counts)
                profile = profile_model(copy.deepcopy(model), inputs[:large], targets[:large], loss_fn, steps=5,
                                        name="pipeline", small_batch_size=small if small < large else None)
            names, layers = scaling_from_profile(profile)
            cluster = cluster or ClusterSpec.uniform(len(ranks), 1e9)
            if cluster.world_size != len(ranks):
                raise CaramelError(f"pipeline: replicas=auto: the cluster spec has {cluster.world_size} workers, the "
                                   f"group {len(ranks)}")
            choice = choose_replicas(layers, batch, options.schedule, cluster,
                                     None if options.stages == "auto" else options.stages,
                                     None if options.microbatches == "auto" else options.microbatches,
                                     profile.optimizer_time_s or 0.0, shares_a_weight(profile),
                                     ties=tied_weights(profile, names), reducer=options.replica_reducer())
            box[0] = (choice, [names[c] for c in choice.plan.boundaries])
        except CaramelError as e:
            box[0] = str(e)
        except Exception as e:  # noqa: BLE001 - any failure here must reach every rank, or they wait forever
            box[0] = f"pipeline: replicas=auto: planning failed on rank {ranks[0]}: {type(e).__name__}: {e}"
    dist.broadcast_object_list(box, src=ranks[0], group=process_group)
    if isinstance(box[0], str):
        raise CaramelError(box[0])
    return box[0]
