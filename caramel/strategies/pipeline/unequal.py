"""Unequal replica counts per stage (`replicas="2+1"`): PipeDream's round-robin, synchronously.

PipeDream's partitioner (`planner.pipedream_partition`) may give a slow stage more workers than
a fast one. Here stage s runs on `r_s` replicas and the step's microbatches are dealt
round-robin: microbatch m goes to replica `m mod r_s` of every stage s. The assignment repeats
every `L = lcm(r_0, r_1, ...)` microbatches, so the step is `L` *virtual pipelines*: virtual
pipeline v is the chain of ranks (replica `v mod r_s` of each stage s) and carries microbatches
v, v + L, v + 2L, ... Each is a plain pipeline, run by torch's own `PipelineStage` and
`ScheduleGPipe` / `Schedule1F1B` in a process group of its own (torch's first-step protocols,
shape inference and point to point all stay between one peer per neighbour, which they need).

    replicas 2+1, 4 microbatches (L = 2):   rank 0 (stage 0, replica 0)  ---\
                                             virtual pipeline 0: m0, m2      rank 2 (stage 1)
                                            rank 1 (stage 0, replica 1)  ---/
                                             virtual pipeline 1: m1, m3

*Order.* Every rank runs its virtual pipelines one after another in increasing v. That never
deadlocks: the lowest-numbered virtual pipeline not yet finished has every one of its ranks
either in it or on the way (all they ran before it is lower-numbered, hence finished), and on its
own it is torch's schedule, which completes (it waits for all its sends before returning).
A rank runs its first stage's forwards without waiting for anyone, so stage 0's replicas compute
side by side; a rank shared by several virtual pipelines (the single replica above) takes them in
turn.

*Exactness.* The schedules run with `scale_grads=False`, so each replica's `p.grad` is the sum
of its microbatches' loss gradients; a plain all-reduce (sum) on the stage's replica group and a
division by the step's microbatch count give the mean over all microbatches: the whole batch's
gradient, whichever replica ran which microbatch and however many each ran. (Caramel's engine
and DDP reduce one module per stage object and per step; here several stage objects share a
module, so neither fits without more work.) The replicas start from the replica group's first
rank's parameters and buffers (broadcast when the stage is built, as DDP's constructor does for
equal replicas), so ranks that built the model with different seeds still train one model.
BatchNorm buffers: the replica group's first rank's, broadcast once per step, as for equal
replicas.

*One batch.* The whole job is one pipeline: stage 0's replicas read the inputs and the last
stage's the targets, each from its own rank's arguments. At the first step every rank sends a
digest of its batch to all (`check_same_batch`), and a rank that passed another batch than the
job's first rank is an error, not a silently mixed batch.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from caramel.distributed import broadcast_coalesced
from caramel.errors import CaramelError
from caramel.strategies.pipeline.layout import stage_ranks
from caramel.strategies.pipeline.replica_reduce import KeepBuffersStage, broadcast_buffers
from caramel.strategies.pipeline.timing import StageTimer

_SYNC = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass(frozen=True)
class ReplicatedLayout:
    """This rank's place among unequal replicas: its stage, its replica index, the virtual
    pipelines it belongs to (v, their process group, their global ranks by stage)."""

    counts: tuple[int, ...]  # replicas of each stage
    stage: int
    replica: int
    virtual: tuple[tuple[int, Any, tuple[int, ...]], ...]
    replica_group: Any  # None when this stage has one replica
    group: Any  # the job's group (the loss and the state dict travel on it)
    pipeline_ranks: tuple[int, ...]  # every global rank: the whole job is one pipeline taking one batch
    created: tuple[Any, ...] = ()  # every group new_group gave this rank (to destroy at close)

    @property
    def period(self) -> int:
        return math.lcm(*self.counts)

    @property
    def positions(self) -> int:
        return len(self.counts)

    @property
    def replicas(self) -> int:
        return self.counts[self.stage]

    @property
    def stage_indices(self) -> tuple[int, ...]:
        return (self.stage,)

    @property
    def holds_first(self) -> bool:
        return self.stage == 0

    def holds_last(self, stages: int) -> bool:
        return self.stage == stages - 1

    @property
    def gather_group(self) -> tuple[Any, int]:
        """A group holding every stage (some more than once), and its size: the whole job."""
        return self.group, sum(self.counts)


def virtual_chains(counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Group ranks along each virtual pipeline v = 0..L-1: replica `v mod r_s` of each stage."""
    per_stage = stage_ranks(counts)
    return [tuple(ranks[v % len(ranks)] for ranks in per_stage) for v in range(math.lcm(*counts))]


def make_replicated_layout(counts: tuple[int, ...], process_group: Any = None) -> ReplicatedLayout:
    """Build the virtual pipelines' and the replica groups (every rank of `process_group` calls
    this, in the same order, as `new_group` requires)."""
    world = dist.get_world_size(process_group)
    me = dist.get_rank(process_group)
    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    spec = "+".join(map(str, counts))
    if sum(counts) != world:
        raise CaramelError(f"pipeline: replicas={spec} needs {sum(counts)} workers (their sum), the group has {world}")
    per_stage = stage_ranks(counts)
    stage = next(s for s, rs in enumerate(per_stage) if me in rs)
    virtual, created = [], []
    for v, chain in enumerate(virtual_chains(counts)):
        # stage-major ranks keep each chain in stage order, as new_group's sorted ranks number it
        group = dist.new_group([ranks[g] for g in chain])
        if me in chain:
            virtual.append((v, group, tuple(ranks[g] for g in chain)))
            created.append(group)
    replica_group = None
    for s, rs in enumerate(per_stage):
        if len(rs) > 1:
            g = dist.new_group([ranks[r] for r in rs])
            if s == stage:
                replica_group = g
                created.append(g)
    return ReplicatedLayout(tuple(counts), stage, per_stage[stage].index(me), tuple(virtual), replica_group,
                            process_group, tuple(ranks), tuple(created))


def check_same_batch(inputs: torch.Tensor, targets: torch.Tensor, group: Any, spec: str) -> None:
    """Every rank of `group` passed the same batch (a digest of its bytes, gathered once): stage
    0's replicas read the inputs and the last stage's the targets, each from its own arguments."""
    digest = hashlib.sha1()
    for t in (inputs, targets):
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    mine = digest.hexdigest()
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    other = [r for r, d in enumerate(every) if d != every[0]]
    if other:
        raise CaramelError(f"pipeline: replicas={spec} trains one batch across the whole job (stage 0's replicas read "
                           f"the inputs, the last stage's the targets): every rank must pass the same batch to "
                           f"step(), but rank(s) {other} of the group passed another than rank 0")


class VirtualPipelines:
    """One rank's stage, run as one torch schedule per virtual pipeline it belongs to."""

    def __init__(self, module: nn.Module, layout: ReplicatedLayout, stages: int, device: torch.device,
                 schedule: str, microbatches: int, loss_fn: Callable, timer: StageTimer) -> None:
        if microbatches % layout.period:
            raise CaramelError(f"pipeline: replicas={'+'.join(map(str, layout.counts))} deals microbatches "
                               f"round-robin: microbatches must be a multiple of {layout.period}, got {microbatches}")
        self.module, self.layout, self.stages, self.microbatches = module, layout, stages, microbatches
        self.timer = timer
        self.checked = False  # the first step checks that every rank passed the same batch
        if layout.replica_group is not None:  # one starting point for the replicas, as DDP's constructor
            broadcast_coalesced([*module.parameters(), *module.buffers()],
                                dist.get_global_rank(layout.replica_group, 0), layout.replica_group)
        self.runs: list[tuple[int, Any]] = []
        for v, group, _ in layout.virtual:
            stage = KeepBuffersStage(module, layout.stage, stages, device, group=group)
            timer.wrap_stage(stage)
            try:
                run = _SYNC[schedule](stage, microbatches // layout.period, loss_fn=loss_fn, scale_grads=False)
            except ValueError as e:  # torch's own checks of microbatches against stages
                raise CaramelError(f"pipeline: schedule={schedule}, replicas={'+'.join(map(str, layout.counts))}, "
                                   f"microbatches={microbatches}: {e}") from None
            timer.wrap_loss(run)
            self.runs.append((v, run))

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, optimizer: torch.optim.Optimizer
             ) -> torch.Tensor | None:
        """Run this rank's virtual pipelines in increasing v, reduce the stage's gradients over its
        replicas and step `optimizer` (gradients zeroed first). Returns the sum of this rank's
        microbatch losses (last stage), else None."""
        lay, m = self.layout, self.microbatches
        if not self.checked:
            check_same_batch(inputs, targets, lay.group, "+".join(map(str, lay.counts)))
            self.checked = True
        first, last = lay.holds_first, lay.holds_last(self.stages)
        xs, ys = inputs.chunk(m), targets.chunk(m)
        optimizer.zero_grad(set_to_none=True)
        total: torch.Tensor | None = None
        for v, run in self.runs:
            mine = range(v, m, lay.period)
            args = (torch.cat([xs[k] for k in mine]),) if first else ()
            losses: list[torch.Tensor] = []
            run.step(*args, target=torch.cat([ys[k] for k in mine]) if last else None,
                     losses=losses if last else None, return_outputs=False)
            if last:
                part = torch.stack([x.detach() for x in losses]).sum()
                total = part if total is None else total + part
        self.timer.end_step()
        self._reduce()
        optimizer.step()
        return total

    def share_loss(self, local: torch.Tensor) -> torch.Tensor:
        """The whole batch's loss on every rank: each last-stage replica's sum (zero elsewhere),
        summed over the job, over the microbatches."""
        dist.all_reduce(local, group=self.layout.group)
        return local / self.microbatches

    def _reduce(self) -> None:
        """Sum each gradient over the stage's replicas and divide by the step's microbatches."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if self.layout.replica_group is not None:
            for dtype in sorted({g.dtype for g in grads}, key=str):  # one flat all-reduce per dtype
                same = [g for g in grads if g.dtype == dtype]
                flat = torch.cat([g.reshape(-1) for g in same])
                dist.all_reduce(flat, group=self.layout.replica_group)
                offset = 0
                for g in same:
                    g.copy_(flat[offset: offset + g.numel()].view_as(g))
                    offset += g.numel()
            broadcast_buffers(self.module, self.layout.replica_group)
        for g in grads:
            g.div_(self.microbatches)
