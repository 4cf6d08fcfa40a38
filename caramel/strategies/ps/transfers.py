"""What the parameter-server engine moves: its private process groups, one step's gradients on
their way to the servers (`Update`), and a parameter's pull in flight (`Pull`)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from caramel.strategies.ps.hierarchy import Hierarchy


@dataclass
class PsGroups:
    """The private groups of one model (all over the same ranks). Each server shard has a push
    group and a pull group of its own, so transfers to and from different servers run side by
    side (a single group runs its collectives one after another), while each shard's transfers
    keep the planned order (colocated, a serving rank's pushes travel on its own pull group,
    point-to-point, so on gloo under bsp they go ahead of its pulls on each link; NCCL runs
    each send/recv pair on a communicator of its own: `PsEngine.link_group`);
    `control` carries the small all-reduces, plans and optimizer state, `buffers` rank 0's
    buffers."""

    control: Any
    buffers: Any
    push: list[Any]
    pull: list[Any]
    hier: Hierarchy | None = None  # hierarchical=True: node and leader groups (`hierarchy.py`)
    # dedicated servers (`server.py`): the group rank serving each shard (empty: colocated), the
    # group carrying the workers' commands to them, and rank 0 -> servers for hyper-parameters
    dedicated: list[int] = field(default_factory=list)
    cmd: Any = None
    hp: Any = None
    clip: Any = None  # clip_grad_norm > 0: the servers' all-reduce of their shards' squared norms

    def all(self) -> list[Any]:
        extra = ([self.cmd, self.hp] if self.dedicated else []) + ([self.clip] if self.clip is not None else [])
        mine = [self.control, self.buffers, *self.push, *self.pull, *extra] + (self.hier.groups() if self.hier else [])
        return [g for g in mine if g is not dist.GroupMember.NON_GROUP_MEMBER]  # dedicated: not every group has every rank


@dataclass
class Update:
    """The gradients of one step on their way to the servers."""

    step: int
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # parameter -> this rank's gradient / world (a view of its bucket's flat tensor, reduced in place at the owner)
    flats: dict[int, torch.Tensor] = field(default_factory=dict)  # bucket -> its flat gradient tensor
    works: list[Any] = field(default_factory=list)
    used: torch.Tensor | None = None  # per plan parameter: how many ranks had a gradient (after its all-reduce)
    used_work: Any = None
    hparams: list[dict[str, Any]] | None = None
    relay: deque = field(default_factory=deque)  # hierarchical, at a leader on NCCL: (bucket, node reduce) still to forward
    forwards: list[tuple[int, Any]] = field(default_factory=list)  # hierarchical, at a leader on gloo: (bucket, its node sum's send)
    incoming: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # at a server on gloo (colocated flat, or a hierarchical leader): bucket -> the other workers' pushes or leaders' sums (receives posted)
    sums: list[tuple[int, torch.Tensor, list[torch.Tensor]]] = field(default_factory=list)  # at a server: (bucket, flat, the other workers' pushes) to add in

    def everyone_pushed(self) -> bool:
        """Every rank has handed over this step's gradients (its count arrived): the reductions
        are on the wire, so waiting for them costs a transfer, never a straggler."""
        return self.used_work is not None and self.used_work.is_completed()

    def arrived(self) -> bool:
        """Every reduction of this update has completed. A gloo point-to-point work reports
        completion only once waited on, so with colocated flat servers and at hierarchical
        server leaders on gloo this stays false until `_apply` waits; `everyone_pushed` is
        the test that fires there."""
        return all(w.is_completed() for w in self.works) and (self.used_work is None or self.used_work.is_completed())


@dataclass
class Pull:
    """One parameter's pull in flight to this rank."""

    version: int  # updates the parameter holds once this lands
    work: Any
    buf: torch.Tensor
