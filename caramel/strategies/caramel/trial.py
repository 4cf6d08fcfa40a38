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
4. the chosen candidate is the most preferred one that the fastest does not beat by more than
   twice the standard error of their difference (a smaller lead is as likely luck as not on a
   noisy host). The order of preference (`trial_preference`) is the trial's baseline, then the
   planner's other plans, then DDP's schedule: handed to torch DDP it pays DDP's search for
   unused parameters (docs/engine.md, "DDP's schedule, run by torch DDP"), and in the bench every
   hand-over on record ran behind plain DDP (docs/results/engine-history.md). The baseline is the
   planner's plan the simulator predicts fastest by more than `PREDICTED_TIE` (each plan's
   `predicted_step_time_s`, simulated for the cluster it was made for: on a measured cluster its
   rate, latencies and each collective's pause in compute): a measured lead within the noise is
   settled by the other evidence there is (docs/engine.md has how the predictions ranked the modes against
   the trials and the timed rounds). Without predictions it is the planner's
   plan with backward overlap (DDP's timing run by the engine). If the chosen candidate is
   not the fastest (a lead within the noise), another pass of the same blocks runs (up to
   `max_passes`), every candidate's periods pooled over the passes; after the last pass the
   choice stands;
5. a chosen candidate other than the baseline must be faster than it again on fresh steps
   before it is adopted for good (until the next re-plan, which runs a new trial): one
   confirmation pass of blocks X, Y, Y, X of the two (the one running first), the baseline
   kept if the challenger's median there is not the lower (also when the passes saw the
   baseline clearly beaten by another candidate: the fresh steps are the newer evidence).
   Picking the fastest of several noisy
   medians favours whichever was lucky (the winner's curse), which a test on the same steps
   that picked it cannot see and fresh steps can: on 4 workers sharing 2 cores the bench saw
   trials adopt DDP's schedule for a 3% lead (131.9 ms against 135.9) that the interleaved
   rounds reversed. The confirmation asks for the direction only, not for a lead of twice its
   noise again: with half a pass of steps per candidate that test threw out real leads (forward
   overlap at 500 Mbit/s, 69.8 against 74.8 ms, which then ran 4% behind DDP with backward
   overlap), and a lead the passes found clear that is no accident repeats its sign.
With balance="batch" the shares may change during the trial (the balancer is not held back):
a step at the old shares (a slowed worker given half the batch) is no evidence of a schedule's
pace at the new ones, and with changes early in the first pass whichever candidate ran after them
(DDP's schedule, in the middle block) would look fastest. So each decision (`trial_shares`)
compares the candidates on the steps run at the shares of the trial's last counted step, a block
cut where its shares change. When a candidate has fewer such steps than one block counts
(`steps` - 1), the candidates are timed again, their steps at those shares pooled with the
earlier ones': after the passes, every candidate in another pass (within `max_passes`,
`retimed_passes` in the result); after the confirmation, its blocks X, Y, Y, X once more (once
only: `confirmation.retimed`). If some candidate then has none there, all steps are compared
(`shares` null in the result or its confirmation: mixed shares, which the summary says).
The threshold is one block's count: at the defaults a decision after a change can rest on 4
periods, 2 pairs, per candidate (the medians' errors then come from two samples). Asking for
more (a block's pairs at each block position, 8 periods) would re-time nearly every trial under
balance="batch" (the change at batch 20 falls in DDP's middle block at the defaults, leaving it
4), 30 steps more of a 120-step run; a pick other than the baseline still faces the confirmation.
Step periods on a shared host vary by 20-30% from step to step (measured), so a handful of steps
cannot tell schedules 5% apart: without a share change one pass counts 2 x (`steps` - 1) periods
per candidate (8 at the defaults; 2 x `steps` - 1 for the candidate of the merged middle block),
only a close call pays for more passes (a clear winner, or the baseline in front, ends the trial
after one), and only a choice other than the baseline pays for the confirmation (4 x `steps`
steps, twice that if re-timed).
Updates are exact throughout: a switch happens at a step boundary after every pending update is
applied, as for any plan change.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from caramel.distributed import collective_device
from caramel.plan.plan import Plan
from caramel.strategies.caramel import trial_shares

# Modes an automatic choice considers, in order of trial (and of preference on an exact tie):
# "none" never beats "backward" (it only removes overlap), so it is not a candidate.
AUTO_CANDIDATES = ("forward", "backward")
DEFAULT_TRIAL_STEPS = 5
DEFAULT_TRIAL_PASSES = 3
DDP_SCHEDULE = "fifo/backward"  # DDP's buckets, applied at step(), run by torch DDP itself
# A predicted lead smaller than this fraction is none: the validation's target for the
# simulator's median error on this host (docs/simulator.md), whose latest runs scored 1.0-2.0%.
# Plans that hide all their communication are predicted alike in both modes up to rounding.
PREDICTED_TIE = 0.03


def trial_baseline(names: list[str], planner: str, predicted_s: dict[str, float | None] | None = None) -> str | None:
    """The candidate an undecided trial keeps: the planner's plan (`planner/...` in `names`) the
    simulator predicts fastest by more than `PREDICTED_TIE`, when `predicted_s` holds a
    prediction for each of them; else the planner's plan with backward overlap (for the `fifo`
    planner that is DDP's schedule itself). None if there is no such candidate."""
    backward = f"{planner}/backward"
    if backward not in names:
        return None
    own = [n for n in names if n.startswith(f"{planner}/")]
    preds = predicted_s or {}
    if own and all(preds.get(n) is not None for n in own):
        best = min(own, key=preds.__getitem__)  # the first in trial order on an exact tie
        if preds[backward] > preds[best] * (1 + PREDICTED_TIE):
            return best
    return backward


def trial_preference(names: list[str], planner: str, predicted_s: dict[str, float | None] | None = None) -> list[str]:
    """`names` in the order a tie within the noise is settled: the baseline (`trial_baseline`),
    the planner's other plans in trial order, then DDP's schedule run by torch DDP. Empty when
    there is no baseline: the fastest then wins outright and nothing is confirmed. `planner` is
    the prefix of the candidates' names (`plan` for a plan the user gave)."""
    base = trial_baseline(names, planner, predicted_s)
    if base is None:
        return []
    rest = [n for n in names if n != base]
    rest.sort(key=lambda n: n == DDP_SCHEDULE)  # stable: trial order otherwise
    return [base] + rest


def confirmation_note(result: dict) -> str:
    """How a finished trial's confirmation went, for reports: '' when none ran (the baseline was
    chosen outright), else e.g. "caramel/forward confirmed on fresh steps: 58.1 against 66.0 ms"."""
    conf = result.get("confirmation")
    if not conf:
        return ""
    name = conf["candidate"]
    others = [n for n in conf["step_period_s"] if n != name]
    ms = " against ".join(f"{conf['step_period_s'][n] * 1e3:.1f}" for n in [name] + others)
    verdict = "confirmed" if conf["confirmed"] else "led, not confirmed"
    how = []
    if conf.get("retimed"):
        how.append("run twice, too few steps at the latest shares")
    if conf.get("shares") is None and result.get("sized"):
        # a share change acted late in its blocks: the two were compared over mixed shares
        n = ", ".join(f"{k} {v}" for k, v in conf["samples"].items())
        how.append(f"on mixed shares, samples {n}")
    return f"{name} {verdict} on fresh steps: {ms} ms" + (f" ({'; '.join(how)})" if how else "")


@dataclass
class Candidate:
    """One schedule in a trial: a plan and when its updates are applied."""

    name: str
    """how reports call it: `planner/overlap`, e.g. `caramel/forward`"""
    overlap: str
    plan: Plan
    blocks_s: list[list[float]] = field(default_factory=list)
    """the counted step periods, one list per block"""
    blocks_n: list[list[int | None]] = field(default_factory=list)
    """this rank's local batch size in each of those steps (None where unknown: no balancer)"""

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


def choose(medians_s: dict[str, float], errors_s: dict[str, float] | None = None,
           preference: list[str] | tuple[str, ...] = ()) -> str:
    """The fastest candidate; on an exact tie, the first in trial order.

    With a `preference` (most preferred first, `trial_preference`) and the medians' standard
    errors: the most preferred candidate that the fastest does not beat by more than twice the
    error of their difference (on a noisy host a smaller lead is as likely luck as not), the
    fastest if it beats them all.
    """
    assert medians_s, "no candidates measured"
    best = min(medians_s, key=lambda name: (medians_s[name], list(medians_s).index(name)))
    if errors_s is None:
        return best
    for name in preference:
        if name == best:
            return best
        if name not in medians_s:
            continue
        lead = medians_s[name] - medians_s[best]
        noise = (errors_s[best] ** 2 + errors_s[name] ** 2) ** 0.5
        if lead <= 2 * noise:
            return name
    return best


class OverlapTrial:
    """Runs the candidates in blocks; `record(period_s)` after every step says what to adopt next."""

    def __init__(self, candidates: list[Candidate], steps: int, group, world: int, preference: list[str] | None = None,
                 max_passes: int = 1, confirm: bool = True, predicted_s: dict[str, float | None] | None = None,
                 sized: bool = False):
        """`preference`: candidate names, most preferred first (`trial_preference`); its first
        is the baseline. Without one the fastest wins outright and nothing is confirmed.
        `predicted_s`: the simulator's step time per candidate, as chose the preference; only
        reported (the result's `predicted_step_time_s`). `sized`: a balancer records local batch
        sizes (`record`'s `n`), alike on every rank; without one no decision gathers sizes."""
        assert candidates and steps >= 2, "a trial needs a candidate and at least one counted step per block"
        assert preference is None or set(preference) <= {c.name for c in candidates}
        assert max_passes >= 1
        self.candidates = candidates
        self.preference = list(preference or [])
        self.baseline = self.preference[0] if self.preference else None
        self.steps = steps
        self.group, self.world = group, world
        self.max_passes = max_passes
        self.confirm = confirm
        self.sized = sized
        self.predicted_s = {k: v for k, v in (predicted_s or {}).items() if v is not None}
        self.passes = 1
        self.selection: dict | None = None
        """while a confirmation runs: what the passes found (the later `result` without its verdict)"""
        self.blocks: list[tuple[int, int]] = self._one_pass()  # (candidate index, steps)
        self.block = 0
        self.in_block = 0
        self.ran: list[list] = []
        """[candidate name, first step, last step] of every block run so far, in order (the
        engine's step counts `record` is given); reported in `result` so that what changed
        during the trial (a balancer's shares) can be placed in its blocks"""
        self.last_n: int | None = None
        """this rank's local batch size in the last counted step (`blocks_n`'s latest entry)"""
        self.retimed = 0
        """passes run because a candidate had too few steps at the latest shares (`_decide`)"""
        self.confirm_retimed = False
        """whether the confirmation's blocks ran again for the same reason (`_confirmed`)"""
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

    def record(self, period_s: float | None, step: int | None = None, n: int | None = None) -> Candidate | None:
        """Count one finished step of the current block; the candidate to adopt now, if any.

        `period_s` None: the step has no period (a process's first, as after a resume inside a
        block); it takes its place in the block but adds no sample. `step`: the engine's count
        of steps with this one, entered in `ran`. `n`: this rank's local batch size in the step
        (balance="batch"), so that candidates are compared on steps run at the same shares.
        Returns the next block's candidate when the current block is over, the winner after the
        last block (and fills `result`), else None (keep going).
        """
        if step is not None:
            if self.in_block == 0 or not self.ran:  # a block starts (or a resume without a record)
                self.ran.append([self.current.name, step, step])
            else:
                self.ran[-1][2] = step
        if self.in_block > 0:  # the block's first step is the transition into it
            if self.in_block == 1:
                self.current.blocks_s.append([])
                self.current.blocks_n.append([])
            if period_s is not None:
                self.current.blocks_s[-1].append(period_s)
                self.current.blocks_n[-1].append(n)
                self.last_n = n
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

    def _all_ranks(self, cands: list[Candidate]) -> tuple[dict[str, float], dict[str, float], bool]:
        """Every candidate's median period and its error, each the slowest (noisiest) rank's.

        The step is as slow as its slowest worker. Every candidate is judged alike: in pairs only
        if each has a block of two counted steps (with steps=2 only the merged middle block has),
        else period by period; the same on every rank, which all run the same blocks."""
        n = len(cands)
        paired = all(c.has_pairs() for c in cands)
        t = torch.tensor([c.median_s(paired) for c in cands] + [c.median_error_s(paired) for c in cands],
                         dtype=torch.float64)
        if self.world > 1:
            t = t.to(collective_device(self.group))
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        values = t.tolist()
        medians = {c.name: float(v) for c, v in zip(cands, values[:n])}
        errors = {c.name: float(v) for c, v in zip(cands, values[n:])}
        return medians, errors, paired

    def _at_latest_shares(self, cands: list[Candidate]) -> tuple[list[Candidate], list[int] | None]:
        return trial_shares.at_latest_shares(cands, self.last_n, self.group, self.world, self.sized)

    def _steps_run(self) -> dict:
        # the trial's first and last step and its blocks as run (None and [] when no step was
        # given); `complete` false when the record misses steps of the trial: recording began at
        # a resume from a checkpoint without it, so `start_step` is the resume's, not the trial's
        recorded = sum(b - a + 1 for _, a, b in self.ran)
        return {"start_step": self.ran[0][1] if self.ran else None, "end_step": self.ran[-1][2] if self.ran else None,
                "blocks": [list(b) for b in self.ran], "complete": recorded == self.total_steps()}

    def _named(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    def _decide(self) -> Candidate:
        if self.selection is not None:
            return self._confirmed()
        views, shares = self._at_latest_shares(self.candidates)
        if self.passes < self.max_passes and trial_shares.too_few(views, shares, self.steps):
            # the shares changed during the pass and a candidate has fewer steps at the latest
            # ones than one block counts: time every candidate again (steps at other shares
            # would favour whichever ran after the change)
            self.passes += 1
            self.retimed += 1
            self.blocks += self._one_pass()
            return self.current
        views, shares = trial_shares.comparable(self.candidates, views, shares)
        medians, errors, paired = self._all_ranks(views)
        winner, fastest = choose(medians, errors, self.preference), choose(medians)
        if winner != fastest and self.passes < self.max_passes:
            # a lead within the noise: measure every candidate again (same values on every rank,
            # so every rank goes on alike)
            self.passes += 1
            self.blocks += self._one_pass()
            return self.current
        result = {"step_period_s": medians, "median_error_s": errors, "chosen": winner,
                  "fastest": fastest, "baseline": self.baseline, "passes": self.passes,
                  "steps_counted": {c.name: len(c.periods_s) for c in self.candidates},
                  "samples": {c.name: len(c.samples_s(paired)) for c in views}, "paired": paired,
                  "shares": shares, "sized": self.sized, "retimed_passes": self.retimed,
                  "predicted_step_time_s": dict(self.predicted_s), "confirmation": None}
        if self.confirm and self.baseline is not None and winner != self.baseline:
            return self._start_confirmation(result)
        self.result = {**result, **self._steps_run()}
        return self._named(winner)

    def _start_confirmation(self, selection: dict) -> Candidate:
        # the two start afresh: only steps run after the choice judge it; the one running now
        # goes first, so the confirmation starts without a switch when it can
        self.selection = selection
        w, b = self.candidates.index(self._named(selection["chosen"])), self.candidates.index(self._named(self.baseline))
        first, second = (b, w) if self.blocks[-1][0] == b else (w, b)
        for i in (w, b):
            self.candidates[i].blocks_s, self.candidates[i].blocks_n = [], []
        self.blocks += [(first, self.steps), (second, 2 * self.steps), (first, self.steps)]
        return self.current

    def _confirmed(self) -> Candidate:
        sel = self.selection
        assert sel is not None
        challenger, baseline = self._named(sel["chosen"]), self._named(self.baseline)
        views, shares = self._at_latest_shares([challenger, baseline])
        if not self.confirm_retimed and trial_shares.too_few(views, shares, self.steps):
            # the shares changed late in the confirmation: one of the two has too few steps at
            # the latest ones (none, if it acted in the last block), so its blocks run once more,
            # in the same order, and the steps at those shares are pooled
            self.confirm_retimed = True
            first, second = self.blocks[-1][0], self.blocks[-2][0]
            self.blocks += [(first, self.steps), (second, 2 * self.steps), (first, self.steps)]
            return self.current
        views, shares = trial_shares.comparable([challenger, baseline], views, shares)
        medians, errors, paired = self._all_ranks(views)
        chosen = challenger.name if medians[challenger.name] < medians[baseline.name] else baseline.name
        self.result = {**sel, "chosen": chosen, "confirmation": {
            "candidate": challenger.name, "confirmed": chosen == challenger.name, "step_period_s": medians,
            "median_error_s": errors, "paired": paired, "shares": shares, "retimed": self.confirm_retimed,
            "samples": {c.name: len(c.samples_s(paired)) for c in views}}, **self._steps_run()}
        self.selection = None
        return self._named(chosen)
