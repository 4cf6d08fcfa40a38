"""Where each stage lives: cutting an `nn.Sequential` into stage modules, and the process groups
of hybrid data x pipeline parallelism.

Ranks of the job's group are laid out stage-major: group rank `g = position * replicas + replica`,
so a stage's replicas are neighbours. Pipeline `replica` is the ranks with that replica index (it
moves activations point to point); replica group `position` is the ranks holding the same
stage(s) (it averages their gradients). With "interleaved", position `p` of `P` holds stages
`p, p + P, p + 2P, ...` (torch's looped placement).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError


def split_sequential(model: nn.Module, boundaries: list[int]) -> list[nn.Sequential]:
    """The stages of `model` cut before each index in `boundaries`. Each stage is an
    `nn.Sequential` holding the very same child modules under their original names, so a stage's
    `state_dict()` keys are the whole model's and loading the whole model loads every stage."""
    if not isinstance(model, nn.Sequential):
        raise CaramelError(f"pipeline: the model must be an nn.Sequential (its children are the layers a "
                           f"partition cuts between), got {type(model).__name__}")
    children = list(model.named_children())
    if boundaries and boundaries[-1] >= len(children):
        raise CaramelError(f"pipeline: partition {boundaries} cuts at layer {boundaries[-1]}, but the model has "
                           f"{len(children)} layers (valid cuts are 1..{len(children) - 1})")
    edges = [0, *boundaries, len(children)]
    return [nn.Sequential(OrderedDict(children[a:b])) for a, b in zip(edges[:-1], edges[1:])]


@dataclass(frozen=True)
class Layout:
    """This rank's place: which pipeline position, which replica, which stages, which groups."""

    positions: int  # workers along one pipeline
    replicas: int
    position: int
    replica: int
    stage_indices: tuple[int, ...]
    pipeline_group: Any  # carries activations and their gradients between positions
    replica_group: Any  # None with one replica; else the ranks that hold the same stages
    pipeline_ranks: tuple[int, ...]  # global ranks along this rank's pipeline, by position
    created: tuple[Any, ...] = ()  # the groups make_layout made that hold this rank (to destroy at close)

    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_indices

    def holds_last(self, stages: int) -> bool:
        return stages - 1 in self.stage_indices

    @property
    def gather_group(self) -> tuple[Any, int]:
        """A group holding every stage once, and its size: this rank's pipeline."""
        return self.pipeline_group, self.positions


def make_layout(stages: int, replicas: int, interleaved: bool, process_group: Any = None) -> Layout:
    """Build the groups (every rank of `process_group` must call this, in the same order)."""
    world = dist.get_world_size(process_group)
    me = dist.get_rank(process_group)
    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    if world % replicas:
        raise CaramelError(f"pipeline: replicas={replicas} does not divide the {world} workers")
    positions = world // replicas
    if interleaved:
        if stages % positions or stages < 2 * positions:
            raise CaramelError(f"pipeline: schedule=interleaved needs stages to be a multiple (>= 2x) of the "
                               f"{positions} workers per pipeline, got stages={stages}")
    elif positions != stages:
        raise CaramelError(f"pipeline: stages={stages} x replicas={replicas} needs {stages * replicas} workers, "
                           f"the group has {world}")
    position, replica = divmod(me, replicas)
    pipeline_groups, replica_groups = [], []
    if replicas == 1:
        pipeline_groups, replica_groups = [process_group], [None] * positions
    else:
        # every rank creates every group, in one order, as new_group requires
        for r in range(replicas):
            pipeline_groups.append(dist.new_group([ranks[p * replicas + r] for p in range(positions)]))
        for p in range(positions):
            replica_groups.append(dist.new_group([ranks[p * replicas + r] for r in range(replicas)]))
    own = tuple(range(position, stages, positions))
    pipeline_group = pipeline_groups[replica if replicas > 1 else 0]
    created = (pipeline_group, replica_groups[position]) if replicas > 1 else ()
    return Layout(positions, replicas, position, replica, own, pipeline_group, replica_groups[position],
                  tuple(ranks[p * replicas + replica] for p in range(positions)), created)


def stage_ranks(counts: tuple[int, ...] | list[int]) -> list[list[int]]:
    """Group ranks of each stage's replicas, stage-major: [2, 1] -> [[0, 1], [2]]."""
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def stage_speeds(worker_speeds: list[float], counts: tuple[int, ...] | list[int], positions: int | None = None
                 ) -> list[float]:
    """Each stage's compute speed: the slowest of the workers that run it (its replicas reduce
    together, so the stage's step waits for the slowest). `worker_speeds` by group rank (missing
    ones 1.0); `counts`: replicas per stage; ranks are stage-major for unequal counts and
    `position * replicas + replica` for equal ones, where with `positions` < stages
    ("interleaved") stage k lives on position k mod positions."""
    counts = list(counts)
    equal = len(set(counts)) == 1
    if equal and positions is not None and positions != len(counts):
        r = counts[0]
        per_position = stage_ranks([r] * positions)
        ranks = [per_position[k % positions] for k in range(len(counts))]
    else:  # equal counts without interleaving are stage-major too: position * r + replica
        ranks = stage_ranks(counts)
    return [min(worker_speeds[g] if g < len(worker_speeds) else 1.0 for g in rs) for rs in ranks]
