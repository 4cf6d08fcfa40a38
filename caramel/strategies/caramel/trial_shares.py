"""The overlap trial's steps at the latest shares (balance="batch"), the same on every rank.

With balance="batch" the balancer may change the shares during a trial: a step at the old
shares is no evidence of a schedule's pace at the new ones. Every rank records its local batch
size with each period (`Candidate.blocks_n`); a decision keeps, of each candidate, the periods
run at the shares of the trial's last counted step. A step's shares are every rank's sizes
together (with three workers one rank's size can stay put while the others swap), so one
all-gather of the sizes: every rank then keeps the same steps, and every decision made from
them (re-time, fall back) is made alike. A block is cut where its shares change, so no pair of
periods spans a change; a period whose size is unknown (carried from a checkpoint entry without
sizes) is not at the latest shares.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch.distributed as dist

from caramel.errors import CaramelError

if TYPE_CHECKING:
    from caramel.strategies.caramel.trial import Candidate


def sized_by(balancer: object) -> bool:
    """Whether a trial gets local batch sizes: the balancer sets them (balance="batch"; an
    option, alike on every rank). One rule for a new trial and a resumed one."""
    return hasattr(balancer, "local_batch")


def at_latest_shares(cands: list[Candidate], last_n: int | None, group, world: int, sized: bool = True
                     ) -> tuple[list[Candidate], list[int] | None]:
    """Each candidate with only its periods at the shares of the trial's last counted step (this
    rank's size there: `last_n`), and those shares, one local batch size per rank; `cands` as they
    are and None when some rank does not know them. Every rank calls it at the same point.
    `sized` False (no balancer that sets local batch sizes: alike on every rank, an option) skips
    the all-gather: no rank knows its sizes."""
    if not sized:
        return cands, None
    mine = ([c.blocks_n for c in cands], last_n)
    gathered: list = [mine]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, mine, group=group)
    # the ranks count the same periods in the same blocks (a process's first step has none on
    # every rank); if that ever broke, the mask below and the re-time decision would differ
    # between ranks and one would wait on a collective the others never start
    shapes = [[[len(b) for b in ns] for ns in g[0]] for g in gathered]
    if any(s != shapes[0] for s in shapes):
        raise CaramelError("overlap trial: the ranks counted different numbers of step periods "
                           f"(per rank, candidate and block: {shapes}); they must run the same blocks")
    latest = [g[1] for g in gathered]
    if any(n is None for n in latest):
        return cands, None
    views = []
    for k, c in enumerate(cands):
        segments: list[list[float]] = []
        for b, periods in enumerate(c.blocks_s):
            run: list[float] = []
            for i, p in enumerate(periods):
                if [g[0][k][b][i] for g in gathered] == latest:
                    run.append(p)
                elif run:  # the shares changed: a new segment, so no pair spans the change
                    segments.append(run)
                    run = []
            if run:
                segments.append(run)
        views.append(replace(c, blocks_s=segments, blocks_n=[]))
    return views, latest


def too_few(views: list[Candidate], shares: list[int] | None, steps: int) -> bool:
    """Whether some candidate has fewer periods at the latest shares than one block counts
    (`steps` - 1): the shares changed and the decision would rest on too little of one of them.
    The lengths are the gathered sizes' (`at_latest_shares`), so every rank answers alike."""
    return shares is not None and any(len(v.periods_s) < steps - 1 for v in views)


def comparable(cands: list[Candidate], views: list[Candidate], shares: list[int] | None
               ) -> tuple[list[Candidate], list[int] | None]:
    """The latest shares' periods when every candidate ran one there, else all periods (shares
    None: the comparison mixes shares, and the result says so)."""
    if shares is not None and all(v.periods_s for v in views):
        return views, shares
    return cands, None
