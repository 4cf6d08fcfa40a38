"""`overlap="auto"`: try each overlap mode for a few of the user's own steps, keep the fastest.

Why measure instead of trusting the simulator alone: when compute and communication share a
few CPU cores (CPU training, or an emulated cluster on one host), computing while a collective
streams slows both, and the gain from widening the transfer window into the next forward can
turn into a loss (docs/engine.md has the numbers). The simulator plans the bucket layout and
order for each mode; the trial measures which mode is faster here, with this model, now.

Order of events (the same on every rank, at the same steps):
1. the controller makes one plan per candidate mode (rank 0 plans, every rank adopts);
2. each candidate runs `steps` steps; the first is a transition (pending lazy updates of the
   previous candidate are applied, allocations settle) and is not counted;
3. after the last candidate, one all-reduce (MAX) of every candidate's median step period, so
   every rank sees the slowest rank's numbers and makes the same choice;
4. the fastest candidate is adopted for good (until the next re-plan, which runs a new trial).
Updates are exact throughout: a candidate switch happens at a step boundary after every pending
update is applied, as for any plan change.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from caramel.plan.plan import Plan

# Modes an automatic choice considers, in order of trial (and of preference on an exact tie):
# "none" never beats "backward" (it only removes overlap), so it is not a candidate.
AUTO_CANDIDATES = ("forward", "backward")
DEFAULT_TRIAL_STEPS = 4


@dataclass
class Candidate:
    overlap: str
    plan: Plan
    periods_s: list[float] = field(default_factory=list)

    def median_s(self) -> float:
        """Median step period without the transition step (inf when nothing was measured)."""
        counted = self.periods_s[1:]
        return statistics.median(counted) if counted else float("inf")


def choose(medians_s: dict[str, float]) -> str:
    """The fastest mode; on an exact tie, the first in trial order."""
    assert medians_s, "no candidates measured"
    return min(medians_s, key=lambda mode: (medians_s[mode], list(medians_s).index(mode)))


class OverlapTrial:
    """Runs candidates one after another; `record(period_s)` after every step says what to adopt next."""

    def __init__(self, candidates: list[Candidate], steps: int, group, world: int):
        assert candidates and steps >= 2, "a trial needs a candidate and at least one counted step each"
        self.candidates = candidates
        self.steps = steps
        self.group, self.world = group, world
        self.index = 0
        self.result: dict | None = None

    @property
    def current(self) -> Candidate:
        return self.candidates[self.index]

    def record(self, period_s: float) -> Candidate | None:
        """Count one finished step of the current candidate; the candidate to adopt now, if any.

        Returns the next candidate when the current one has run its steps, the winner after the
        last one (and fills `result`), else None (keep going).
        """
        cand = self.current
        cand.periods_s.append(period_s)
        if len(cand.periods_s) < self.steps:
            return None
        if self.index + 1 < len(self.candidates):
            self.index += 1
            return self.current
        return self._decide()

    def _decide(self) -> Candidate:
        # slowest rank per candidate: the step is as slow as its slowest worker
        t = torch.tensor([c.median_s() for c in self.candidates], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        medians = {c.overlap: float(v) for c, v in zip(self.candidates, t.tolist())}
        winner = choose(medians)
        self.result = {"step_period_s": medians, "chosen": winner, "steps_per_candidate": self.steps}
        return next(c for c in self.candidates if c.overlap == winner)
