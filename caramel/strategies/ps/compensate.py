"""Delay compensation at the servers (`ps:staleness=compensate`; docs/ps.md, Staleness).

A stale gradient g(w_used) was computed on parameters some updates older than the w_now it is
applied to. DC-ASGD (Zheng et al., ICML 2017) corrects it with the first-order Taylor term of
the gradient, the Hessian approximated by the outer product of the gradient (its diagonal):

    g(w_now) ~ g + lambda * g * g * (w_now - w_used)            (elementwise)

with the paper's adaptive lambda (DC-ASGD-a): lambda = lambda0 / sqrt(MeanSquare + eps),
MeanSquare a running mean (momentum DC_MOMENTUM) of g * g per element. The paper leaves its
start open; here the first gradient's g * g starts it (started at 0, the first ~20 updates'
lambda would be up to 1 / sqrt(1 - DC_MOMENTUM) = 4.5x the steady one). The correction is
made on the gradient, before the user's optimizer sees it, so it works with any optimizer
the `ps` strategy runs. Each worker's gradient is corrected on its own (its own w_used)
before the server adds them up: each push carries, per parameter, how many updates the
pushing rank's parameters lagged (`lag`), and the server keeps the versions of its shard
from the oldest the latest update's pushes used (w_used is at most S updates old), so it holds
(largest lag + 1) copies of its shard, at most S (asp: ASP_BOUND_STEPS).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

DC_MOMENTUM = 0.95  # the paper's m for the running mean square of the gradient
DC_EPS = 1e-7  # keeps lambda finite where a gradient has been zero


@torch.no_grad()
def compensated(parts: list[torch.Tensor], drifts: list[torch.Tensor | None], mean_sq: torch.Tensor | None,
                lambda0: float, workers: int) -> torch.Tensor:
    """Correct one parameter's pushes in place: `parts[j]` is worker j's gradient g_j divided by
    the worker count W (as pushed), `drifts[j]` = w_now - w_used of worker j (None: not stale).
    Returns the new running mean square of the full-scale gradient, averaged over the workers.
    In the pushed scale the correction lambda * g_j * g_j * drift / W is W * lambda * part_j^2 *
    drift. It is computed, and the running mean kept, in float32 whatever the parameter's dtype:
    in half precision lambda (up to lambda0 * W / sqrt(DC_EPS)) overflows and the running mean
    loses most of its bits."""
    wide = [p.float() for p in parts]
    sq = wide[0] * wide[0]
    for p in wide[1:]:
        sq.addcmul_(p, p)
    sq.mul_(workers * workers / len(parts))  # mean over the workers of g_j^2, g_j = W * part_j
    if mean_sq is None:  # the first gradient starts it (a zero start would make lambda 4.5x too large at first)
        mean_sq = sq
    else:
        mean_sq.mul_(DC_MOMENTUM).add_(sq, alpha=1 - DC_MOMENTUM)
    if any(d is not None for d in drifts):
        lam = mean_sq.add(DC_EPS).rsqrt_().mul_(lambda0 * workers)
        for p, w, d in zip(parts, wide, drifts):
            if d is not None:
                p.add_((d.float() * lam * w * w).to(p.dtype))
    return mean_sq


@dataclass
class DelayCompensation:
    """One server's compensation state: its shard's recent versions and running mean squares."""

    lambda0: float
    keep_versions: int  # how many versions back a gradient may be (the staleness bound)
    history: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # version -> parameter -> value
    mean_sq: dict[int, torch.Tensor] = field(default_factory=dict)
    missing: int = 0  # gradients left uncorrected: their version was no longer (or not yet) kept here
    corrected: int = 0  # (worker, parameter) gradients corrected with a lag > 0

    def adopt(self, mean_sq: dict[int, torch.Tensor], owner: dict[int, int], rank: int,
              params: list[torch.Tensor]) -> None:
        """Take the running mean squares of the parameters this rank serves (`owner`: parameter
        -> server) from every server's (a new placement, a resumed checkpoint)."""
        self.mean_sq = {i: m.to(params[i].device, torch.float32) for i, m in mean_sq.items() if owner.get(i) == rank}

    @torch.no_grad()
    def record(self, version: int, values: dict[int, torch.Tensor], oldest_used: int | None = None) -> None:
        """The shard's values at `version` (before that update is applied); drop what no later
        gradient can have used: older than the bound allows, or than `oldest_used`, the oldest
        version a push of this update was computed on (a rank's copy only moves forward, so its
        later pushes use that version or a newer one; under asp that keeps ~2 copies, not 32)."""
        self.history[version] = {i: v.detach().clone() for i, v in values.items()}
        first = version + 1 - self.keep_versions if oldest_used is None else max(version + 1 - self.keep_versions, oldest_used)
        for old in [v for v in self.history if v < first]:
            del self.history[old]

    def drift(self, i: int, now: torch.Tensor, version_now: int, lag: int) -> torch.Tensor | None:
        """w_now - w_used (float32) of parameter i for a push `lag` updates behind version_now;
        None when it is fresh, or when that version is not kept (counted in `missing`, which
        stats_dict reports as dc_missing: such a gradient is applied uncorrected, not refused)."""
        if lag <= 0:
            return None
        old = self.history.get(version_now - lag, {}).get(i)
        if old is None:
            self.missing += 1
            return None
        self.corrected += 1
        return now.float() - old.float()

    @torch.no_grad()
    def bucket(self, members: list[int], views: list[list[torch.Tensor]], lags: list[list[int]],
               params: list[torch.Tensor], version_now: int, used: dict[int, bool], workers: int) -> None:
        """Correct one pushed bucket in place: `views[j][k]` is worker j's gradient of parameter
        members[k] (a view of its pushed flat tensor), `lags[j][k]` how many updates behind
        version_now worker j's copy of it was."""
        for k, i in enumerate(members):
            if not used[i]:
                continue
            drifts = [self.drift(i, params[i], version_now, lag[k]) for lag in lags]
            self.mean_sq[i] = compensated([v[k] for v in views], drifts, self.mean_sq.get(i), self.lambda0, workers)


def gather_mean_sq(dc: DelayCompensation | None, group: Any) -> dict[int, torch.Tensor]:
    """All ranks: every server's running mean squares, merged (parameter -> CPU float32 tensor),
    for a checkpoint and for a new placement (`dc`: None on a rank that serves nothing, or
    without compensate)."""
    mine = {} if dc is None else {i: m.detach().cpu() for i, m in dc.mean_sq.items()}
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    merged: dict[int, torch.Tensor] = {}
    for part in everyone:
        merged.update(part)
    return merged
