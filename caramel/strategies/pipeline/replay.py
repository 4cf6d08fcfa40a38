"""The pipeline's schedules as data, and their replay over stage costs and links.

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
from caramel.sim.event_loop import Busy
from caramel.strategies.pipeline.timeline import MAX_CONTENTION_PASSES, Action, PipelineSim, StageCosts
from caramel.strategies.pipeline.transport import eager_ready_s, lane_programs, run_programs, send_eager
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
