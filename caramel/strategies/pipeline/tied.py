"""Tied weights split across stages: one Parameter per holder, their gradients summed each step.

torch's splitter gives every stage that uses a tied parameter (GPT-2's `head.weight = tok.weight`)
its own new copy, which no optimizer holds. `share_tied` points each stage back at the model's
own Parameter under every name it has there, so the optimizer (the whole model's, or one made
from the stage's parameters) steps it under the model's names. On each rank that Parameter then
gets only its stages' part of the gradient; as Megatron-LM does for its embedding/output weight,
`TiedGrads.reduce` sums the parts over the ranks holding a use (one group per pipeline, made
once), after the schedule's microbatch accumulation and the replicas' reduction and before the
optimizer step. Every holder then has the full gradient, the same optimizer state and so takes
the same update: the copies stay equal (they start equal: the first holder's value is broadcast).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError


@dataclass(frozen=True)
class TiedWeight:
    names: tuple[str, ...]  # the model's names of the parameter (its aliases)
    stages: tuple[int, ...]  # the stages whose modules hold it, ascending


def share_tied(model: nn.Module, stages: list[nn.Module]) -> list[TiedWeight]:
    """Replace each stage parameter that is not one of the model's own (a splitter's copy) by the
    model's Parameter of the same name; the tied parameters that end on more than one stage."""
    own = {id(p) for p in model.parameters()}
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    for stage in stages:
        for name, p in list(stage.named_parameters(remove_duplicate=False)):
            if id(p) in own:
                continue
            try:
                original = model.get_parameter(name)
            except AttributeError:
                called = [part.partition("@")[0] for part in name.split(".") if "@" in part]
                if called:  # the tracer's name for a module's second call: `a@1`
                    raise CaramelError(f"pipeline: module {called[0]!r} is called on both sides of the cut (torch's "
                                       f"tracer copied its parameter as {name!r}); cut so that every call of it is "
                                       f"on one stage") from None
                raise CaramelError(f"pipeline: torch's tracer made a stage parameter {name!r} that the model does "
                                   f"not have; cut elsewhere") from None
            owner, _, attr = name.rpartition(".")
            setattr(stage.get_submodule(owner) if owner else stage, attr, original)
    # tied: one model Parameter held by several stages, under one name or several (a module on
    # one stage and `F.linear(h, self.a.weight)` on a later one share a single name)
    holders: dict[int, list[int]] = {}
    for i, stage in enumerate(stages):
        for p in stage.parameters():  # each Parameter once per stage
            holders.setdefault(id(p), []).append(i)
    return [TiedWeight(tuple(names), tuple(holders[key])) for key, names in aliases.items()
            if len(holders.get(key, ())) > 1]


def shared_positions(tied: list[TiedWeight], positions: int) -> list[TiedWeight]:
    """The tied weights of which one rank holds several stages (stage k on position k mod
    positions): their gradients would be one `grad` scaled and stepped once per stage."""
    return [w for w in tied if len({k % positions for k in w.stages}) < len(w.stages)]


class TiedGrads:
    """The groups that sum each tied weight's gradient over its holders (module docstring).

    Ranks are laid out as `make_layout` does: group rank `position * replicas + replica`, stage
    k on position k mod positions. Replica j's holders form one group: the replicas' reduction
    has already averaged each stage's part, so the sum is the tied weight's whole gradient."""

    def __init__(self, model: nn.Module, tied: list[TiedWeight], positions: int, replicas: int, replica: int,
                 process_group: Any = None):
        ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        self.params: list[nn.Parameter] = []
        self.groups: list[Any] = []  # per tied weight, this rank's group (None: it holds no use)
        self.created: list[Any] = []
        me = dist.get_rank()
        for w in tied:
            held = sorted({k % positions for k in w.stages})
            mine = None
            if len(held) > 1:  # `Pipeline._tie` refuses two holders on one position: one per rank
                for j in range(replicas):  # every rank makes every group, in one order
                    members = [ranks[p * replicas + j] for p in held]
                    group = dist.new_group(members)
                    if me in members:
                        mine = (group, members[0])
                        self.created.append(group)
            self.params.append(model.get_parameter(w.names[0]))
            self.groups.append(mine)
        with torch.no_grad():
            for p, g in zip(self.params, self.groups):
                if g is not None:
                    dist.broadcast(p.data, src=g[1], group=g[0])

    def reduce(self) -> None:
        """Sum each tied weight's gradient over its holders (a holder without a gradient adds
        zeros). A frozen weight is left alone; where no holder had a gradient this step every
        holder keeps `grad` None, as an untied weight would, so weight decay or momentum does
        not move it: one more element in the sum counts the holders with a gradient."""
        for p, g in zip(self.params, self.groups):
            if g is None or not p.requires_grad:
                continue
            buf = torch.zeros(p.numel() + 1, dtype=p.dtype, device=p.device)
            if p.grad is not None:
                buf[:-1].copy_(p.grad.reshape(-1))
                buf[-1] = 1
            dist.all_reduce(buf, group=g[0])
            if buf[-1].item() == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = buf[:-1].view_as(p).clone()
            else:
                p.grad.copy_(buf[:-1].view_as(p))

    def close(self) -> None:
        for group in self.created:
            dist.destroy_process_group(group)
        self.created = []
