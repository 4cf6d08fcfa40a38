"""What ssp/asp do about stale gradients (`ps:staleness=...`; docs/ps.md, Staleness).

Under ssp:S a gradient of step t is computed on parameters up to S updates old and applied on
top of update t - 1 (the servers apply updates in order). With one slow worker that staleness
comes from two places:

- a fast worker runs ahead of the slowest, up to the bound: its gradient is computed on
  parameters older than the slowest worker's, though its lead buys nothing (the next reduction
  needs the slowest worker's gradient anyway). `pace` removes that: a forward first waits until
  every rank has pushed the previous step; the slowest rank (the one with the most busy seconds
  at the latest applied update, each rank's own work, its waits excluded) waits for no one;
- hiding the transfers: the slowest worker starts step t before update t - 1 has come back,
  so even paced, gradients are about one update old. `predict` (pace, and) runs each forward
  on the parameters extrapolated to the version its gradient will be applied to, w + tau *
  delta (delta: the parameter's latest update, tau: the updates it lacks), the weight
  prediction of SpecTrain (Chen et al. 2018) and PipeMare; the true values are kept aside and
  put back before the owner's optimizer steps, before a pull lands and at `synchronize()`.

`compensate` (pace, and) corrects each stale gradient at its server instead, DC-ASGD's delay
compensation (`compensate.py`): each rank sends, per parameter, how many updates its copy
lagged, and the server adds lambda * g * g * (w_now - w_used) to that rank's gradient.

`scale` is staleness-aware SGD (Zhang, Gupta, Lian, Liu, IJCAI 2016) on plain ssp (no pace:
the method is the alternative to holding the fast worker back): the same per-rank lags reach
the server, which divides each worker's gradient by max(1, tau) before adding them up, so a
gradient tau updates old is applied at lr / tau (`scaled`; with SGD exactly the paper's
update, with Adam a reweighting of the stale gradients within the update).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from caramel.errors import CaramelError
from caramel.strategies.ps.buckets import unflatten
from caramel.strategies.ps.compensate import DelayCompensation

if TYPE_CHECKING:
    from caramel.strategies.ps.engine import PsEngine

MODES = ("none", "pace", "predict", "compensate", "scale")


@torch.no_grad()
def scaled(parts: list[torch.Tensor], lags: list[int]) -> None:
    """staleness=scale: worker j's pushed gradient of one parameter, `parts[j]`, divided in
    place by max(1, lags[j]) (Zhang et al.'s lr / tau; a fresh gradient, tau 0, keeps lr)."""
    for part, lag in zip(parts, lags):
        if lag > 1:
            part.div_(lag)


class StalenessControl:
    """The staleness handling of one engine (staleness=pace, predict, compensate or scale under
    ssp/asp)."""

    def __init__(self, engine: PsEngine, mode: str):
        if engine.groups.dedicated:  # the servers read a step's message at a fixed length
            raise CaramelError(f"ps: staleness={mode} does not combine with dedicated servers yet; use colocated "
                               f"servers (dedicated=false) or staleness=none")
        self.e, self.predicting, self.scaling = engine, mode == "predict", mode == "scale"
        self.pacing = mode != "scale"
        from caramel.strategies.ps.options import ASP_BOUND_STEPS  # options imports MODES from here

        bound = engine.bound if engine.bound is not None else ASP_BOUND_STEPS
        self.dc = DelayCompensation(engine.options.dc_lambda0(), bound) if mode == "compensate" else None
        self.lags: list[list[int]] = []  # compensate, scale: per rank, per plan parameter, the lag of the latest applied push
        self.peer_busy_s: list[float] = []  # every rank's busy seconds at the latest applied update
        self.busy_since: float | None = None
        self.busy_wait0 = 0.0
        self.wait_s = 0.0  # seconds spent waiting for the slowest worker's push
        # scale: the (worker, parameter) parts this rank's servers divided (tau > 1; a worker that did not use
        # a parameter another did pushes zeros, counted too); carried over a re-plan, not over a resume
        self.scaled_count = 0
        self.base: dict[int, torch.Tensor] = {}  # predict: the true value of a parameter now extrapolated
        self.delta: dict[int, torch.Tensor] = {}  # predict: each parameter's latest update
        self.at: dict[int, tuple[int, int]] = {}  # predict: (version, step) each extrapolation was made at

    # --- pace --------------------------------------------------------------------------
    def busy_slots(self) -> list[float]:
        """This step's busy seconds in this rank's slot (zeros elsewhere): the count all-reduce
        sums them into every rank's. None under scale (only pace reads them)."""
        e = self.e
        if not self.pacing:
            return []
        busy = 0.0
        if self.busy_since is not None:
            busy = time.perf_counter() - self.busy_since - (e.wait_s + self.wait_s - self.busy_wait0)
        return [busy if r == e.rank else 0.0 for r in range(e.world)]

    def lag_slots(self) -> list[float]:
        """compensate, scale: how many updates this rank's copy of each parameter lags the step
        being pushed, in this rank's slot (zeros elsewhere; summed into every rank's by the count
        all-reduce)."""
        e = self.e
        if self.dc is None and not self.scaling:
            return []
        mine = [float(e.steps - e.version[i]) for i in e.plan.params]
        zeros = [0.0] * len(mine)
        return [x for r in range(e.world) for x in (mine if r == e.rank else zeros)]

    def applied(self, counts: list[float]) -> None:
        e = self.e
        n = at = len(e.plan.params)
        if self.pacing:  # the layout `finish_pushes` sends: used, busy_slots(), lag_slots()
            self.peer_busy_s, at = counts[n:n + e.world], n + e.world
        if self.dc is not None or self.scaling:
            flat = counts[at:at + e.world * n]
            self.lags = [[int(round(x)) for x in flat[r * n:(r + 1) * n]] for r in range(e.world)]

    def compensate(self, step: int, b: int, flat: torch.Tensor, parts: list[torch.Tensor], used: dict[int, bool]) -> None:
        """Before the server adds up bucket b's pushes of update `step` (its own `flat`, the
        other workers' `parts` in rank order): correct (compensate) or scale (scale) each for
        its rank's lag."""
        if self.dc is None and not self.scaling:
            return
        e = self.e
        members = e.plan.buckets[b]
        like = [e.params[i] for i in members]
        pos = {i: k for k, i in enumerate(e.plan.params)}
        others = [j for j in range(e.workers) if j != e.rank]
        ranks, tensors = [e.rank] + others, [flat] + parts
        views = [unflatten(t, like) for t in tensors]
        lags = [[self.lags[r][pos[i]] for i in members] for r in ranks]
        if self.scaling:
            for k, i in enumerate(members):
                if used[i]:
                    scaled([v[k] for v in views], [lag[k] for lag in lags])
                    self.scaled_count += sum(lag[k] > 1 for lag in lags)
            return
        self.dc.bucket(members, views, lags, e.params, step, used, e.workers)

    def slowest(self) -> bool:
        """This rank was the busiest at the latest applied update (ties: the lowest rank);
        unknown (every rank waits) before the first."""
        busy = self.peer_busy_s
        return bool(busy) and max(busy) > 0 and max(range(len(busy)), key=lambda r: (busy[r], -r)) == self.e.rank

    def pace(self) -> float:
        """Before a training forward: unless this rank is the slowest, wait until every rank has
        pushed the previous step; then apply every update all ranks have pushed (its pulls start
        and land during the forward). Applying one waits at most for its transfer, never for a
        straggler: gloo's point-to-point pushes cannot be polled for completion (`is_completed()`
        stays false until waited), so "every rank pushed it" is the test, not "it has arrived".
        Returns the wait (s). staleness=scale does not pace (plain ssp's timing)."""
        e, waited = self.e, 0.0
        if not self.pacing:
            return waited
        if e.pending and not self.slowest():
            t0 = time.perf_counter()
            latest = e.pending[-1]
            latest.used_work.wait()  # the latest pushed update: every rank has pushed it
            latest.used.tolist()  # on a GPU, wait() only orders streams: reading the count blocks the host
            waited = time.perf_counter() - t0
            self.wait_s += waited
        while e.pending and (e.pending[0].arrived() or e.pending[0].everyone_pushed()):
            e.apply_next()
        return waited

    def step_done(self) -> None:
        """The end of `step()`: a rank's own work (its busy seconds) starts here."""
        self.busy_since, self.busy_wait0 = time.perf_counter(), self.e.wait_s + self.wait_s

    # --- predict -----------------------------------------------------------------------
    @torch.no_grad()
    def landing(self, i: int, value: torch.Tensor) -> None:
        """A new version of parameter i arrives (a pull, or the owner's step): its update is the
        new value less the true current one; the parameter is true again."""
        if not self.predicting:
            return
        p = self.e.params[i]
        old = self.base.pop(i, None)
        self.delta[i] = value - (old if old is not None else p)

    def owner_step(self, mine: list[int], step, version: int) -> None:
        """The owner's optimizer steps its shard `mine` (`step()`) from the true values, at
        `version`; with predict, the step's change is each parameter's latest update; with
        compensate, the values are kept for the stale gradients still to come."""
        self.restore(mine)
        if self.dc is not None:  # this update's pushes were on versions >= version - its largest lag
            oldest = version - max(max(lags) for lags in self.lags) if self.lags else None
            self.dc.record(version, {i: self.e.params[i] for i in mine}, oldest)
        before = {i: self.e.params[i].detach().clone() for i in mine} if self.predicting else {}
        step()
        with torch.no_grad():
            for i, old in before.items():
                self.delta[i] = self.e.params[i] - old

    @torch.no_grad()
    def restore(self, idx: list[int]) -> None:
        """Put back the true values of these parameters (before the owner's optimizer steps them)."""
        for i in idx:
            old = self.base.pop(i, None)
            if old is not None:
                self.e.params[i].copy_(old)

    def extrapolate(self, idx: list[int]) -> None:
        """A training forward is about to use these: each at w + tau * delta, tau = the updates
        it lacks (its gradient is applied on top of the latest one)."""
        if not self.predicting or not torch.is_grad_enabled():
            return
        with torch.no_grad():
            self._extrapolate(idx)

    def _extrapolate(self, idx: list[int]) -> None:
        e = self.e
        for i in idx:
            tau = e.steps - e.version[i]
            d = self.delta.get(i)
            if tau <= 0 or d is None:
                self.restore([i])
                continue
            if i in self.base and self.at.get(i) == (e.version[i], e.steps):
                continue  # already there: another copy would bump the version autograd checks
            p = e.params[i]
            if i not in self.base:
                self.base[i] = p.detach().clone()
            p.copy_(self.base[i] + tau * d)
            self.at[i] = (e.version[i], e.steps)
