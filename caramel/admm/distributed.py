"""dlADMM across ranks with the samples split: the same iterates as one process, to rounding.

Each rank holds a contiguous shard of the samples and their auxiliary variables (z, a, u are
per sample, so they never travel). What is summed over samples travels in one all-reduce per
use: a weight or bias gradient (features x features), and the objective values that decide
each backtracking trial (one scalar), so every rank accepts the same step. The weights are
replicated and updated identically everywhere.

This is an exact sharding of the serial algorithm, not consensus ADMM: there are no per-rank
weight copies to agree, so the answer does not depend on the number of ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from caramel.admm.options import AdmmOptions
from caramel.admm.subproblems import Reducer
from caramel.admm.trainer import DlAdmm
from caramel.errors import CaramelError


def allreduce_total(group: dist.ProcessGroup | None = None) -> Reducer:
    """A reducer that sums a tensor over the ranks of `group` (float64 on the wire for exactness
    of the decisions; the caller's dtype comes back)."""
    def total(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().to(torch.float64).clone()
        dist.all_reduce(out, group=group)
        return out.to(t.dtype)
    return total


def shard(n: int, world_size: int, rank: int) -> slice:
    """Rank `rank`'s contiguous share of n samples (shares differ by at most one)."""
    if n < world_size:
        raise CaramelError(f"dlADMM: {n} samples cannot be split across {world_size} ranks (every rank needs one)")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def sharded_dladmm(x: torch.Tensor, labels: torch.Tensor, classes: int, options: AdmmOptions | None = None,
                   group: dist.ProcessGroup | None = None) -> DlAdmm:
    """This rank's part of a dlADMM run over the full (x, labels), which every rank passes."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    part = shard(len(x), world, rank)
    return DlAdmm(x[part], labels[part], classes, options, total=allreduce_total(group))
