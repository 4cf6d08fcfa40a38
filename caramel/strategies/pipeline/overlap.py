"""The replicas' reduction overlapped with the pipeline, in a simplified model of the runtime's:
several steps replayed back to back, each stage's buckets reduced while its neighbours still
compute. Simplified: the buckets and their order are this module's (below), not the engine's
plan, and the runtime's small per-step collectives are left out (see the end).

An equal hybrid (r pipelines of one stage per position) averages each stage's gradients over its
replica group once per step, bucket by bucket, the last layers' first (backward makes their
gradients first). When each bucket starts and what waits for it depends on the reduction:

- `"forward"` (`replica_reduce="caramel"`, `replica_reduce.py`): the buckets' all-reduces start
  in the stage's last backward of the step, as soon as their gradients are ready, one at a time
  on the lane's link; the step returns at once (the update is lazy), and the next step's first
  forward of the stage waits, layer by layer, for the bucket holding that layer's parameters and
  applies its update there (its share of the optimizer step). So the last stage's reduction
  runs while the earlier stages drain and refill; the first stage's is exposed but for what the
  rest of its last backward hides.
- `"backward"` (`replica_reduce="ddp"`): DDP starts its buckets in the same last backward, but
  that backward returns only once every bucket is reduced (DDP's reducer waits before autograd
  returns), so its gradient send, the rest of the lane's step and the optimizer step wait.
- `"after"` (the plain all-reduce of unequal counts, and the reference the two above replaced):
  the whole stage reduced after its drain, then its optimizer step (`replay.replay`).

A bucket is a layer of the profile that holds parameters (`ReduceBuckets`; DDP: torch's buckets,
a first one of `DDP_FIRST_BUCKET_BYTES`, then `DDP_BUCKET_BYTES`), priced by the simulator's
collective model over the stage's r replicas (`caramel.sim.collectives.CommModel`: a collective
queued behind another pays the queued latency). While a bucket is on the wire the lane's compute
runs the cluster's `compute_slowdown` slower, as beside a transfer. The replicas of a stage run
the same timeline (each stage at its slowest rank's speed), so one lane per position stands for
them all. The step is the steady period of the lanes' step ends (`STEPS` steps replayed, the
first, whose forward has no update to wait for, left out).

Not modelled:
- an activation sent while a bucket is on the same link shares its bandwidth (both go at full
  rate here);
- Caramel's engine plans each stage's buckets with its own planner (`replica_reduce.py`, the
  default `caramel` plan): it groups and may chunk parameters and issues them in `ready`,
  `need` or `hybrid:k` order. Here the buckets are one per top-level layer, always issued in
  ready order (last layer first, each as soon as its gradients are ready); under a `need`
  order the engine issues nothing before the first layer's bucket is ready, so this model can
  hide more of the reduction than the engine does. The spec's `reduce_buckets="planner"`
  replaces these buckets with the planner's own (`planner_buckets.py`; off by default);
- the runtime's per-step small collectives (`runtime.Pipeline._share_loss`: the loss broadcast
  along the pipeline and all-reduced over the replicas; the replicas' buffer broadcasts, once
  per step for Caramel's engine, before every microbatch's forward for DDP) and the Python
  between steps: here the next step's first forward starts as soon as the lane is free. On
  run J (docs/results/pipeline_overlap/) the stage-0 ranks idle a median 8-12 ms between the
  last backward and the next forward, 5-7% of the step, which this model leaves out (the
  collectives themselves would price at some 2-3 ms there; the profile has no buffer sizes).
"""
from __future__ import annotations

import dataclasses
import itertools

from caramel.errors import CaramelError
from caramel.sim.collectives import CommModel
from caramel.sim.event_loop import Busy
from caramel.strategies.pipeline.timeline import (MAX_CONTENTION_PASSES, Action, PipelineSim, ReduceBuckets,
                                                  StageCosts)
from caramel.strategies.pipeline.transport import eager_ready_s, lane_programs, run_programs, send_eager
from caramel.topology.spec import ClusterSpec
from caramel.trace.metrics import union_intervals

REDUCE_MODES = ("after", "backward", "forward")
STEPS = 5  # replayed back to back; the period is measured over all but the first
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch's first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`)
DDP_BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb


def stage_buckets(forward_s: list[float], backward_s: list[float], param_bytes: list[int], replicas: int,
                  cluster: ClusterSpec, update_s: float, mode: str) -> ReduceBuckets:
    """The buckets of one stage whose layers (in forward order) cost `forward_s`, `backward_s`
    (per microbatch, at the stage's speed) and hold `param_bytes`; `update_s` is the stage's
    optimizer step, shared among its buckets by bytes."""
    if mode not in ("forward", "backward"):
        raise CaramelError(f"stage_buckets: mode must be 'forward' (Caramel's engine) or 'backward' (DDP), got {mode!r}")
    ring = ClusterSpec.uniform(replicas, cluster.bandwidth_bps, cluster.latency_s,
                               queued_latency_s=cluster.queued_latency_s)
    comm = CommModel(ring, mode="closed")
    n, total = len(forward_s), sum(param_bytes)
    groups: list[list[int]] = []  # layer indices of each bucket, in issue order
    if mode == "backward":  # torch's buckets over the parameters in reverse order
        for k in reversed(range(n)):
            if not param_bytes[k]:
                continue
            cap = DDP_FIRST_BUCKET_BYTES if len(groups) <= 1 else DDP_BUCKET_BYTES
            if not groups or sum(param_bytes[j] for j in groups[-1]) >= cap:
                groups.append([])
            groups[-1].append(k)
    else:  # one bucket per layer that holds parameters
        groups = [[k] for k in reversed(range(n)) if param_bytes[k]]
    before_fwd = list(itertools.accumulate(forward_s, initial=0.0))
    after_bwd = list(itertools.accumulate(reversed(backward_s), initial=0.0))  # backward of the last j layers
    nbytes = [sum(param_bytes[k] for k in g) for g in groups]
    first_transfer = [comm.transfer_s(b) for b in nbytes]
    return ReduceBuckets([comm.time_s(b) for b in nbytes],
                         [after_bwd[n - min(g)] for g in groups],
                         [before_fwd[min(g)] for g in groups],
                         [update_s * b / total if total else 0.0 for b in nbytes],
                         [comm.time_s(b, after_transfer_s=t) for b, t in zip(nbytes, [0.0, *first_transfer[:-1]])],
                         len(groups) * bucket_cpu_s(cluster, replicas))


def bucket_cpu_s(cluster: ClusterSpec, replicas: int) -> float:
    """The CPU one bucket's all-reduce over `replicas` ranks costs each of them, where the spec
    charges it (`reduce_cpu="messages"`, else 0): a ring sends 2(r - 1) messages and receives as
    many, each end the CPU the simulator charges an activation's send or recv
    (`planner.message_cpu_s`: `collective_cpu_s / (4 (n - 1))` over the job's n ranks), so
    `collective_cpu_s (r - 1) / (n - 1)`. Wall time at the all-at-once load, as measured."""
    n = cluster.world_size
    if cluster.reduce_cpu != "messages" or replicas < 2 or n < 2:
        return 0.0
    return cluster.collective_cpu_s * (replicas - 1) / (n - 1)


def replay_overlapped(costs: StageCosts, actions: list[list[Action]], mode: str, compute_slowdown: float = 1.0,
                      steps: int = STEPS, posting: str | None = None) -> PipelineSim:
    """`replay.replay` for an equal layout whose replicas reduce in `mode` ("forward" or
    "backward"): `STEPS` steps of `actions` (one stage per lane, the schedule's order), each
    stage's reduction from `costs.buckets`; compute slowed beside transfers and buckets on its
    lane's wire, repeated until those intervals settle (as `replay`). Returns the steady step.
    `posting`: the schedule whose sends and recvs are replayed as it posts them
    (`transport.py`; None: a transfer starts when its action ends, as `replay`'s)."""
    if mode not in ("forward", "backward"):
        raise CaramelError(f"overlapped reduction: mode must be 'forward' or 'backward', got {mode!r}")
    if compute_slowdown < 1.0:
        raise CaramelError(f"compute_slowdown must be >= 1 (1: transfers do not slow compute), got {compute_slowdown}")
    if any(len({s for s, _, _ in acts}) != 1 for acts in actions) or len(costs.buckets) != len(costs.forward_s):
        raise CaramelError("overlapped reduction: one stage per lane and one ReduceBuckets per stage")
    beside = None
    for _ in range(MAX_CONTENTION_PASSES):
        sim, wires = (_once(costs, actions, mode, steps, compute_slowdown, beside) if posting is None
                      else _once_posted(costs, actions, mode, steps, posting, compute_slowdown, beside))
        if compute_slowdown == 1.0 or wires == beside:
            break
        beside = wires
    return dataclasses.replace(sim, wire_s=wires)


def _once(costs: StageCosts, actions: list[list[Action]], mode: str, steps: int, slowdown: float,
          beside: list[list[tuple[float, float]]] | None) -> tuple[PipelineSim, list[list[tuple[float, float]]]]:
    """One pass of `replay_overlapped`: the steady step and this pass's wire intervals per lane."""
    n, lanes = len(costs.forward_s), len(actions)
    m = sum(1 for _, kind, _ in actions[0] if kind == "F")
    unrolled = [[(s, kind, k * m + i) for k in range(steps) for s, kind, i in acts] for acts in actions]
    where = {a: p for p, acts in enumerate(unrolled) for a in acts}
    per_step = [len(acts) for acts in actions]
    lane = _LaneCompute(costs, mode, steps, m, slowdown, beside, lanes)
    wires: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]
    done: dict = {}
    arrival: dict = {}
    free_s, landed_s = [0.0] * lanes, [0.0] * lanes
    step_end_s = [[0.0] * steps for _ in range(lanes)]
    nxt, remaining = [0] * lanes, sum(map(len, unrolled))
    while remaining:
        progressed = False
        for p, acts in enumerate(unrolled):
            while nxt[p] < len(acts):
                s, kind, j = acts[nxt[p]]
                k = j // m
                ready = eager_ready_s((s, kind, j), n, done, arrival)
                if ready is None:
                    break
                if k and nxt[p] % per_step[p] == 0:  # the lane's previous step has returned
                    free_s[p] = max(free_s[p], step_end_s[p][k - 1])
                end = lane.compute(p, (s, kind, j), max(free_s[p], ready), wires[p])
                free_s[p] = done[(s, kind, j)] = end
                send_eager((s, kind, j), end, n, p, where, costs.transfer_s, landed_s, arrival, wires)
                nxt[p] += 1
                remaining -= 1
                progressed = True
                if nxt[p] % per_step[p] == 0:  # the lane's part of step k: its sends landed (and DDP's update)
                    step_end_s[p][k] = max(free_s[p], landed_s[p]) + (costs.update_s[s] if mode == "backward"
                                                                and costs.update_s else 0.0)
        if not progressed:
            raise CaramelError("pipeline simulation: the schedule deadlocks (an action waits for one never run)")
    return _steady(step_end_s, lane.busy_s, steps, lane.spans, lane.waited_s), [union_intervals(w) for w in wires]


def _once_posted(costs: StageCosts, actions: list[list[Action]], mode: str, steps: int, posting: str,
                 slowdown: float, beside: list[list[tuple[float, float]]] | None
                 ) -> tuple[PipelineSim, list[list[tuple[float, float]]]]:
    """`_once` with each step's sends and recvs as `posting` places them (`transport.py`)."""
    n, lanes = len(costs.forward_s), len(actions)
    m = sum(1 for _, kind, _ in actions[0] if kind == "F")
    unrolled = [[(s, kind, k * m + i) for k in range(steps) for s, kind, i in acts] for acts in actions]
    lane = _LaneCompute(costs, mode, steps, m, slowdown, beside, lanes)
    buckets_on: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]
    step_end_s = [[0.0] * steps for _ in range(lanes)]

    def compute(p: int, a: Action, start: float) -> float:
        return lane.compute(p, a, start, buckets_on[p])

    def on_end(p: int, k: int, t: float) -> float:  # the lane's part of step k has returned
        s = actions[p][0][0]
        step_end_s[p][k] = t + (costs.update_s[s] if mode == "backward" and costs.update_s else 0.0)
        return step_end_s[p][k]

    programs = lane_programs(posting, unrolled, n, lambda j: j // m)
    _, wires = run_programs(programs, n, costs.transfer_s, costs.latency_s, compute, on_end)
    return (_steady(step_end_s, lane.busy_s, steps, lane.spans, lane.waited_s),
            [union_intervals(w + u) for w, u in zip(wires, buckets_on)])


class _LaneCompute:
    """Each lane's compute under the overlapped reduction, shared by both transports: an action's
    forward or backward at the lane's pace beside the wires, the step's first forward gated
    layer by layer on the previous step's buckets (forward mode), the step's last backward
    issuing the buckets (backward mode: it returns once they are reduced, as DDP's does)."""

    def __init__(self, costs: StageCosts, mode: str, steps: int, m: int, slowdown: float,
                 beside: list[list[tuple[float, float]]] | None, lanes: int):
        self.costs, self.mode, self.m = costs, mode, m
        self.busy_in = [Busy.over(slowdown, [a for a, _ in w], [b for _, b in w]) if beside else Busy(1.0)
                        for w in (beside or [[]] * lanes)]
        self.link_free_s = [0.0] * lanes
        self.reduced_s: list[list[float]] = [[] for _ in range(lanes)]  # the previous step's bucket ends
        self.busy_s = [[0.0] * steps for _ in range(lanes)]
        # the waits inside the runtime's timed calls: forward's pre-hooks on the previous step's
        # buckets (forward mode), the last backward's return once its buckets are reduced (backward)
        self.waited_s = [[0.0] * steps for _ in range(lanes)]
        self.spans: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]  # compute, its end part when gated

    def compute(self, p: int, a: Action, start: float, bucket_wire: list[tuple[float, float]]) -> float:
        """Run action `a` on lane p from `start`; its end (bucket transfers recorded on `bucket_wire`)."""
        costs, (s, kind, j) = self.costs, a
        k, i = divmod(j, self.m)
        b, busy = costs.buckets[s], self.busy_in[p]
        last_backward = kind == "B" and i == self.m - 1
        if kind == "F" and i == 0 and k and self.mode == "forward":
            end, computed = _gated_forward(busy, start, costs.forward_s[s], b, self.reduced_s[p])
        else:  # the last backward also carries its buckets' messages' CPU (0 unless the spec charges it),
            # wall time as measured: added after the compute, not slowed beside the wires
            end = busy.advance(start, costs.forward_s[s] if kind == "F" else costs.backward_s[s])
            end += b.cpu_s if last_backward else 0.0
            computed = end - start
        self.busy_s[p][k] += computed
        self.waited_s[p][k] += end - start - computed
        self.spans[p].append((end - computed, end))
        if last_backward:  # the step's last backward: its buckets go on the wire
            self.reduced_s[p] = ends = _issue(b, start, busy, self.link_free_s, p, bucket_wire)
            if self.mode == "backward" and ends and ends[-1] > end:
                self.waited_s[p][k] += ends[-1] - end
                end = ends[-1]  # DDP's backward returns once every bucket is reduced
        return end


def _steady(step_end_s: list[list[float]], busy_s: list[list[float]], steps: int,
            spans: list[list[tuple[float, float]]], waited_s: list[list[float]]) -> PipelineSim:
    """The steady step (each lane's step ends' mean spacing, the slowest lane's) and compute per
    step; `spans`: every step's compute intervals per lane; `waited_s`: each step's waits inside
    the timed calls per lane (`PipelineSim.timed_busy_s` adds them to the compute)."""
    span = max((e[-1] - e[0]) / (steps - 1) for e in step_end_s) if steps > 1 else max(e[0] for e in step_end_s)
    def per_step(xs: list[float]) -> float:  # the first step, whose forward waits for nothing, left out
        return sum(xs[1:]) / (steps - 1) if steps > 1 else xs[0]

    busy_step = [per_step(b) for b in busy_s]
    timed = [b + per_step(w) for b, w in zip(busy_step, waited_s)]
    return PipelineSim(span, busy_step, [span] * len(step_end_s), spans, timed_busy_s=timed)


def _issue(b: ReduceBuckets, start: float, busy: Busy, link_free_s: list[float], p: int,
           wire: list[tuple[float, float]]) -> list[float]:
    """Place a stage's buckets on lane p's link from its last backward begun at `start`: each
    once its gradients are ready and the previous bucket is done; returns their ends."""
    ends = []
    for k, (t, ready_s) in enumerate(zip(b.time_s, b.ready_s)):
        ready = busy.advance(start, ready_s)
        queued = k > 0 and link_free_s[p] > ready
        begin = max(ready, link_free_s[p])
        link_free_s[p] = end = begin + (b.queued_time_s[k] if queued else t)
        wire.append((begin, end))
        ends.append(end)
    return ends


def _gated_forward(busy: Busy, start: float, forward_s: float, b: ReduceBuckets,
                   ends: list[float]) -> tuple[float, float]:
    """The step's first forward of a stage whose previous step's buckets end at `ends`: each
    layer waits for its bucket, then applies its update, before it computes. Returns its end
    and its compute (the waits left out)."""
    t, done, computed = start, 0.0, 0.0
    for need_s, apply_s, end in sorted(zip(b.need_s, b.apply_s, ends)):
        t, before = busy.advance(t, need_s - done), t
        computed += t - before
        t, before = busy.advance(max(t, end), apply_s), max(t, end)
        computed += t - before
        done = need_s
    t, before = busy.advance(t, forward_s - done), t
    return t, computed + t - before


def replica_mode(schedule: str, replicas: int | tuple[int, ...] | list[int], reducer: str,
                 tied_split: bool = False) -> str:
    """How a layout's replicas reduce, as the runtime runs them (`simulate.reduce_mode` from its
    parts): `replicas` of every stage (an int) or per stage (unequal), `reducer` the options'
    `replica_reducer()`."""
    if not isinstance(replicas, int) or schedule not in ("gpipe", "1f1b") or replicas == 1:
        return "after"
    return "backward" if tied_split or reducer == "ddp" else "forward"
