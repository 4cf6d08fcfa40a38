"""`overlap="auto"`: try each schedule for a few of the user's own steps, keep the fastest.

The candidates are the planner's plan for each overlap mode ("forward", "backward") and, when
the planner is not already `fifo`, DDP's own schedule (`fifo` buckets of 25 MB after a first of
1 MB, applied at `step()`), which torch's DistributedDataParallel itself runs (the controller
hands it the gradients for those blocks and, if it is kept, for good): the other candidates are
timed against what the user would otherwise run, not against the engine's imitation of it.

Why measure instead of trusting the simulator alone: when compute and communication share a
few CPU cores (CPU training, or an emulated cluster on one host), computing while a collective
streams slows both, and the gain from widening the transfer window into the next forward can
turn into a loss (docs/engine.md has the numbers). The simulator plans the bucket layout and
order for each mode; the trial measures which mode is faster here, with this model, now.

Order of events (the same on every rank, at the same steps):
1. the controller makes one plan per candidate mode (rank 0 plans, every rank adopts);
2. the candidates run in blocks A, B, C, C, B, A (consecutive blocks of one candidate merged:
   a drift of the machine's speed during the trial hits all alike), `steps` steps per block;
   the first step after each switch is a transition (the previous mode's
   pending updates are applied, allocations settle) and is not counted;
3. after the last block, one all-reduce (MAX) of every candidate's median step period and its
   standard error, so every rank sees the slowest rank's numbers and makes the same choice (the
   samples are means of consecutive pairs of periods within a block: with forward overlap a
   rank's periods alternate long and short, and single periods would make its noise look
   several times larger than the job's pace varies);
4. the fastest candidate is adopted for good (until the next re-plan, which runs a new trial),
   unless it beats the trial's baseline (`trial_baseline`: the planner's plan with backward
   overlap, DDP's timing run by the engine) by less than twice the standard error of the
   difference: then the lead is undecided, and another pass of the same blocks runs (up to
   `max_passes`), every candidate's periods pooled over the passes; after the last pass an
   undecided lead keeps the baseline. The baseline is not DDP's schedule: handed to torch DDP,
   that schedule pays DDP's search for unused parameters (~3%, docs/engine.md): at 1 Gbit/s the
   bench measured the engine's backward mode at 1.006x, 1.017x and 1.110x of plain DDP in three
   runs, the hand-over at 0.956x and 0.955x in the two of them whose trial kept DDP's schedule.
   DDP's schedule is still adopted whenever it is clearly the fastest.
Step periods on a shared host vary by 20-30% from step to step (measured), so a handful of steps
cannot tell schedules 5% apart: one pass counts 8-9 steps per candidate, and only a close call
pays for more passes (a clear winner, or the baseline in front, ends the trial after one).
Updates are exact throughout: a switch happens at a step boundary after every pending update is
applied, as for any plan change.
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
DEFAULT_TRIAL_STEPS = 5
DEFAULT_TRIAL_PASSES = 3
DDP_SCHEDULE = "fifo/backward"  # DDP's buckets, applied at step(), run by torch DDP itself


def trial_baseline(names: list[str], planner: str) -> str | None:
    """The candidate an undecided trial keeps: the planner's plan with backward overlap (for the
    `fifo` planner that is DDP's schedule itself); None if it is not among `names`."""
    name = f"{planner}/backward"
    return name if name in names else None


@dataclass
class Candidate:
    """One schedule in a trial: a plan and when its updates are applied."""

    name: str
    """how reports call it: `planner/overlap`, e.g. `caramel/forward`"""
    overlap: str
    plan: Plan
    blocks_s: list[list[float]] = field(default_factory=list)
    """the counted step periods, one list per block"""

    @property
    def periods_s(self) -> list[float]:
        return [p for b in self.blocks_s for p in b]

    def has_pairs(self) -> bool:
        return any(len(b) >= 2 for b in self.blocks_s)

    def samples_s(self, paired: bool = True) -> list[float]:
        """Means of consecutive pairs of periods within a block (an odd last period of a block
        left out), or with `paired=False` the periods themselves. With forward overlap a rank's
        periods alternate (68, 103, 70, 101 ms: it waits in one step's forward for what its peer
        sends late in the step before), so one period says little and a pair says what the job's
        pace is; a step is never paired across a switch."""
        if not paired:
            return self.periods_s
        return [(b[i] + b[i + 1]) / 2 for b in self.blocks_s for i in range(0, len(b) - 1, 2)]

    def median_s(self, paired: bool = True) -> float:
        """Median of the samples (inf when nothing was measured)."""
        xs = self.samples_s(paired)
        return statistics.median(xs) if xs else float("inf")

    def median_error_s(self, paired: bool = True) -> float:
        """Standard error of that median, from the spread of the samples (robust: 1.4826 MAD
        estimates the standard deviation, and the median's error is 1.2533 sd / sqrt(n))."""
        xs = self.samples_s(paired)
        if len(xs) < 2:
            return float("inf")
        med = statistics.median(xs)
        mad = statistics.median(abs(p - med) for p in xs)
        return 1.2533 * 1.4826 * mad / len(xs) ** 0.5


def choose(medians_s: dict[str, float], errors_s: dict[str, float] | None = None, baseline: str | None = None) -> str:
    """The fastest candidate; on an exact tie, the first in trial order.

    With a `baseline` (`trial_baseline`) and the medians' standard errors, another candidate is
    chosen only if it beats the baseline by more than twice the error of the difference: on a
    noisy host a smaller lead is as likely to be luck.
    """
    assert medians_s, "no candidates measured"
    best = min(medians_s, key=lambda name: (medians_s[name], list(medians_s).index(name)))
    if baseline is None or errors_s is None or best == baseline or baseline not in medians_s:
        return best
    lead = medians_s[baseline] - medians_s[best]
    noise = (errors_s[best] ** 2 + errors_s[baseline] ** 2) ** 0.5
    return best if lead > 2 * noise else baseline


class OverlapTrial:
    """Runs the candidates in blocks; `record(period_s)` after every step says what to adopt next."""

    def __init__(self, candidates: list[Candidate], steps: int, group, world: int, baseline: str | None = None,
                 max_passes: int = 1):
        assert candidates and steps >= 2, "a trial needs a candidate and at least one counted step per block"
        assert baseline is None or baseline in {c.name for c in candidates}
        assert max_passes >= 1
        self.candidates = candidates
        self.baseline = baseline
        self.steps = steps
        self.group, self.world = group, world
        self.max_passes = max_passes
        self.passes = 1
        self.blocks: list[tuple[int, int]] = self._one_pass()  # (candidate index, steps)
        self.block = 0
        self.in_block = 0
        self.result: dict | None = None

    def _one_pass(self) -> list[tuple[int, int]]:
        # in order, then back: A, B, C, C, B, A, merged where a candidate follows itself
        n = len(self.candidates)
        blocks: list[tuple[int, int]] = []
        for i in list(range(n)) + list(reversed(range(n))):
            if blocks and blocks[-1][0] == i:
                blocks[-1] = (i, blocks[-1][1] + self.steps)
            else:
                blocks.append((i, self.steps))
        return blocks

    @property
    def current(self) -> Candidate:
        return self.candidates[self.blocks[self.block][0]]

    def record(self, period_s: float) -> Candidate | None:
        """Count one finished step of the current block; the candidate to adopt now, if any.

        Returns the next block's candidate when the current block is over, the winner after the
        last block (and fills `result`), else None (keep going).
        """
        if self.in_block > 0:  # the block's first step is the transition into it
            if self.in_block == 1:
                self.current.blocks_s.append([])
            self.current.blocks_s[-1].append(period_s)
        self.in_block += 1
        if self.in_block < self.blocks[self.block][1]:
            return None
        self.in_block = 0
        self.block += 1
        if self.block < len(self.blocks):
            return self.current
        return self._decide()

    def total_steps(self) -> int:
        return sum(n for _, n in self.blocks)

    def _decide(self) -> Candidate:
        # slowest rank per candidate: the step is as slow as its slowest worker; likewise the
        # noisiest rank's error
        n = len(self.candidates)
        # every candidate judged alike: in pairs only if each has a block of two counted steps
        # (with trial_steps=2 only the merged middle block has), else period by period; the
        # same on every rank, which all run the same blocks
        paired = all(c.has_pairs() for c in self.candidates)
        t = torch.tensor([c.median_s(paired) for c in self.candidates]
                         + [c.median_error_s(paired) for c in self.candidates], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        values = t.tolist()
        medians = {c.name: float(v) for c, v in zip(self.candidates, values[:n])}
        errors = {c.name: float(v) for c, v in zip(self.candidates, values[n:])}
        winner, fastest = choose(medians, errors, self.baseline), choose(medians)
        if winner != fastest and self.passes < self.max_passes:
            # a lead within the noise: measure every candidate again (same values on every rank,
            # so every rank goes on alike)
            self.passes += 1
            self.blocks += self._one_pass()
            return self.current
        self.result = {"step_period_s": medians, "median_error_s": errors, "chosen": winner,
                       "fastest": fastest, "baseline": self.baseline, "passes": self.passes,
                       "steps_counted": {c.name: len(c.periods_s) for c in self.candidates},
                       "samples": {c.name: len(c.samples_s(paired)) for c in self.candidates}, "paired": paired}
        return next(c for c in self.candidates if c.name == winner)
