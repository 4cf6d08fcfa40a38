"""`balance="batch"`: each worker's share of the global batch follows its measured speed.

A synchronous step lasts as long as its slowest worker; with equal shares a worker twice as
slow doubles every step. Here each rank times its own compute (the step's period minus its
waits on communication) per local batch size, in a moving window per size. Every
`balance_every` steps the ranks all-gather what they measured at the shares in force and every
rank computes the same new counts, those that minimize the slowest rank's predicted compute
(`counts_for_costs`); the new counts apply from the first batch no rank has drawn yet.

What a rank contributes (`rank_cost`) is anchored at its median at the shares in force:
t = fixed + per_sample * n through that point, so the prediction for the counts now running is
what was measured, and a move goes toward the ranks finishing together even when the fixed cost
is off (with no fixed cost known, the move is proportional to the ranks' measured rates). The
fixed cost comes from a fit over the shares in force and the last ones (`fit_cost`; sizes
closer than `MIN_SPREAD` keep the last fitted one), shrunk toward 0 by its standard error
(`shrunk_fixed_s`): charging per-step costs (optimizer, Python, the engine) per sample would
make a rank given fewer samples look slower per sample. Older sizes leave the fit: the first
steps run slow on some ranks (run 6 of docs/results/adapt-history.md: rank 0 up to 1.7x its
later pace per sample), and such a window, kept in the fit for tens of steps, tilted its line.
That is a trade-off, not a cure for late settling: on the virtual clock 2 sizes follow slow
spells under noise better than 4 and do no better elsewhere, and on the host it settled later
than the one before it until the settling rule below (docs/adapt.md, "When the shares settle").
New counts are kept when they are predicted to shorten the step by more than `MIN_GAIN` and
by more than `NOISE_Z` standard errors of the ranks' medians (root sum of squares), the latter
capped at `MAX_NOISE_GAIN`; a move against the last move's direction only when the next
decision proposes it again (a slow spell of a few steps would otherwise swing the shares there
and back).

Settling (`hold_when_settled`): the shared host slows one rank for spells of 5-35 steps by 10-60%
(docs/results/adapt-balance-host-spells.json), and a decision whose window met a spell moved the
shares there and, after it, back (run 9: the last change at batch 65 in the median). So once a
decision has kept the shares, a move needs two decisions in a row proposing it, and after
`HOLD_DECISIONS` decisions in a row keeping them the shares are frozen: a move then needs
`THAW_DECISIONS` decisions in a row proposing it (a change between the ranks that lasts, not a
spell; the same bar as any move, so a lasting change that costs a step more than it is followed).
The windows hold `BATCH_WINDOW_STEPS` = 20 steps: a spell moves a median only while it fills over
half of a window, 11 steps or more, so most spells (median 6 steps) move none, and one must last
22 steps or more to sway three decisions 10 steps apart (docs/adapt.md, "When the shares settle").

Gradients are weighted by share: a rank whose forward saw n of the global batch's B samples
adds n/B of its mean gradient (`Engine.set_grad_scale`, read from the forward's input), so the
sum the ranks reduce is the global batch's mean gradient, as if one process had trained on
the union of the ranks' batches. Use the sampler `balanced_sampler` returns, one batch per step.
The windows, fitted fixed cost and share schedule are checkpointed with the optimizer's state
dict (`caramel.strategies.caramel.balance_state`).
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.data.share_sampler import ShareSampler, ShareSchedule
from caramel.errors import CaramelError
from caramel.strategies.rank_failure import global_ranks, raise_failed, run_local
from caramel.topology.spec import ClusterSpec

WINDOW_STEPS = 10  # compute times kept per rank (balance="dropout"'s window; batch's before the settling rule)
BATCH_WINDOW_STEPS = 20  # compute times kept per local batch size (the median of them is the estimate)
FIT_SIZES = 2  # the local batch sizes whose times enter the fit: the shares in force and the last
MIN_SPREAD = 1.2  # the largest fitted size over the smallest, for the slope to be trusted
MIN_GAIN = 0.01  # new counts must be predicted to shorten the step by more than 1% ...
NOISE_Z = 2.0  # ... and by more than this many standard errors of the ranks' medians,
MAX_NOISE_GAIN = 0.05  # ... that bar capped at 5%: on a noisy host the spread alone would hold any shares
MAD_TO_SE = 1.4826 * 1.2533  # MAD -> standard deviation (normal), times the median's efficiency loss
HOLD_DECISIONS = 2  # decisions in a row keeping the shares, after which they are frozen ...
THAW_DECISIONS = 3  # ... until this many decisions in a row propose the same move


def fit_cost(medians: dict[int, float], prior_fixed_s: float | None = None) -> tuple[float, float, bool]:
    """(fixed_s, per_sample_s, fitted) of t = fixed + per_sample * n through the (n, t) points.
    Least squares when the sizes spread by `MIN_SPREAD` or more (`fitted`: True); sizes a few
    samples apart make the slope mostly noise, so then the per-sample cost is re-estimated
    under `prior_fixed_s` (the last fitted fixed cost), or without one, and where the fit is
    not physical (a negative part), all of the time is charged per sample through the origin."""
    points = [(n, t) for n, t in medians.items() if n > 0]
    if not points:
        return 0.0, 0.0, False
    sizes = [n for n, _ in points]
    if len(points) >= 2 and max(sizes) >= MIN_SPREAD * min(sizes):
        mean_n = sum(sizes) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        var = sum((n - mean_n) ** 2 for n in sizes)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / var
        fixed = mean_t - slope * mean_n
        if slope > 0.0 and fixed >= 0.0:
            return fixed, slope, True
    fixed = prior_fixed_s if prior_fixed_s is not None and all(t > prior_fixed_s for _, t in points) else 0.0
    return fixed, sum((t - fixed) * n for n, t in points) / sum(n * n for n in sizes), False


def median_se(times_s: list[float]) -> float:
    """The standard error of the median of `times_s` from their spread (MAD); 0 under 3 times."""
    if len(times_s) < 3:
        return 0.0
    mid = statistics.median(times_s)
    return MAD_TO_SE * statistics.median(abs(t - mid) for t in times_s) / len(times_s) ** 0.5


def shrunk_fixed_s(medians: dict[int, float], ses: dict[int, float], fixed_s: float) -> float:
    """The fitted fixed cost shrunk toward 0 by its noise: fixed * f^2 / (f^2 + se^2), with se
    propagated from the medians' standard errors through the least-squares intercept. Two sizes
    40 samples apart put the intercept 4x their noise away (the lever), and a fixed cost too high
    makes the per-sample cost too low and the move overshoot; a precise fit is kept whole."""
    sizes = [n for n in medians if n > 0]
    mean_n = sum(sizes) / len(sizes)
    var = sum((n - mean_n) ** 2 for n in sizes)
    se2 = sum((1.0 / len(sizes) - mean_n * (n - mean_n) / var) ** 2 * ses[n] ** 2 for n in sizes)
    denominator = fixed_s ** 2 + se2
    return fixed_s * fixed_s ** 2 / denominator if fixed_s > 0.0 and denominator > 0.0 else 0.0


def rank_cost(times_s: list[float], n: int, fixed_s: float | None) -> tuple[float, float, float]:
    """(fixed_s, per_sample_s, se_s) of one rank at its `n` samples: the line through the median
    of `times_s` (module docstring) with the fixed cost given (none, or one not below the
    median: 0), and the median's standard error from the spread (0 under 3 times: unknown)."""
    mid = statistics.median(times_s)
    fixed = fixed_s if fixed_s is not None and 0.0 <= fixed_s < mid else 0.0
    return fixed, (mid - fixed) / n, median_se(times_s)


def counts_for_costs(costs: list[tuple[float, float]], global_batch: int) -> list[int]:
    """Whole-sample counts summing to `global_batch`, each >= 1, that minimize the slowest rank's
    fixed + per_sample * count: each sample goes, in turn, to the rank that would finish it
    first (optimal for this min-max; ties to the lower rank, so every rank computes the same)."""
    counts = [1] * len(costs)
    for _ in range(global_batch - len(costs)):
        r = min(range(len(costs)), key=lambda k: (costs[k][0] + costs[k][1] * (counts[k] + 1), k))
        counts[r] += 1
    return counts


def move_signs(new: list[int], old: list[int]) -> list[int]:
    """Per rank +1, 0 or -1: whether a move from `old` to `new` gives it samples or takes them."""
    return [(a > b) - (a < b) for a, b in zip(new, old)]


def predicted_s(costs: list[tuple[float, float]], counts: list[int]) -> float:
    return max(a + b * n for (a, b), n in zip(costs, counts))


class Balancer:
    """The shares of one engine's ranks (module docstring)."""

    runs_under_ddp = True  # DDP's schedule may run the job: `ddp_shares.SharesHook` weights and times it
    hold_when_settled = True  # False: the controller before the settling rule (for the virtual clock's comparison)
    window_steps = BATCH_WINDOW_STEPS  # the controller before the settling rule: WINDOW_STEPS

    def __init__(self, engine: Any, model: nn.Module, group: Any, rank: int, world: int, every: int):
        self.engine, self.group, self.rank, self.world, self.every = engine, group, rank, world, every
        self.schedule: ShareSchedule | None = None
        self.times: collections.OrderedDict[int, collections.deque] = collections.OrderedDict()  # size -> compute s
        self.fixed_s: float | None = None  # this rank's fixed cost per step, from the last trusted fit
        self.local_batch: int | None = None
        self.changes: list[dict[str, Any]] = []
        self._steps = 0
        # a move against the last one's direction waits for the next decision to propose it again
        self.pending_reversal: list[int] | None = None
        # settling (module docstring): decisions in a row that kept the shares, each rank's median
        # compute when they were frozen (None: not frozen), and while frozen the decisions in a row
        # that proposed the same move (`_thaws`; the checkpoint's name for it is kept)
        self.held_decisions = 0
        self.frozen_s: list[float] | None = None
        self.drifted_decisions = 0
        self.pending_schedule: dict[str, Any] | None = None  # a checkpoint's schedule, loaded before attach()
        engine.remove_at_release(model.register_forward_pre_hook(self._pre_forward, with_kwargs=True))

    @property
    def step(self) -> int:
        """Reduced steps ended so far, restored on resume: the count a share change's `step` is."""
        return self._steps

    def attach(self, schedule: ShareSchedule) -> None:
        if schedule.world_size != self.world:
            raise CaramelError(f"the share schedule is for {schedule.world_size} ranks, this job has {self.world}")
        self.schedule = schedule
        if self.pending_schedule is not None:
            self.restore_schedule(self.pending_schedule)

    def restore_schedule(self, state: dict[str, Any]) -> None:
        """A checkpoint's share schedule (`ShareSchedule.state_dict`); kept until the sampler attaches."""
        if self.schedule is None:
            self.pending_schedule = state
            return
        try:
            self.schedule.load_state_dict(state)
        except (ValueError, KeyError) as e:
            raise CaramelError(f"balance='batch': the checkpoint's share schedule does not fit this run ({e})") from None
        self.pending_schedule = None

    def _pre_forward(self, _m, args, kwargs) -> None:
        if self.schedule is None or not torch.is_grad_enabled():
            return
        first = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0), None)
        if first is None:
            raise CaramelError("balance='batch' weights gradients by the local batch size, read from the forward's "
                               "first tensor input; this forward has none")
        self.local_batch = int(first.shape[0])
        self.engine.set_grad_scale(self.local_batch / self.schedule.global_batch)

    def step_end(self, timed: bool = True) -> None:
        """After every reduced step: record this rank's time per sample (unless not `timed`: a
        profiling step, or one holding a plan's adoption); every `every` steps, decide."""
        if self.schedule is None:
            raise CaramelError("balance='batch' needs its sampler: draw batches with "
                               "caramel.strategies.caramel.balance.balanced_sampler(optimizer, len(dataset), global_batch)")
        stats = self.engine.stats
        if timed and stats.last_step_s is not None and self.local_batch:  # None: a process's first step, untimed
            window = self.times.setdefault(self.local_batch, collections.deque(maxlen=self.window_steps))
            window.append(max(stats.last_step_s - stats.last_wait_s, 0.0))
            self.times.move_to_end(self.local_batch)
            while len(self.times) > FIT_SIZES:
                self.times.popitem(last=False)
        self._steps += 1
        if self.every and self._steps % self.every == 0 and self.world > 1:
            self._decide()

    def _mine(self) -> tuple[int, float, float, float] | None:
        """(n, fixed_s, per_sample_s, se_s) at this rank's latest local batch size, refitting the
        fixed cost over the sizes timed under the schedule in force; None with nothing timed there."""
        window = self.times.get(self.local_batch) if self.local_batch else None
        if not window:
            return None
        medians = {n: statistics.median(q) for n, q in self.times.items()}
        fixed, _, fitted = fit_cost(medians, self.fixed_s)
        if fitted:
            self.fixed_s = shrunk_fixed_s(medians, {n: median_se(list(q)) for n, q in self.times.items()}, fixed)
        return (self.local_batch, *rank_cost(list(window), self.local_batch, self.fixed_s))

    def _decide(self) -> None:
        # a fit that raised here alone would leave the peers in the all-gather until the group's
        # timeout: it is carried to every rank instead, and raised on each (`rank_failure`)
        mine = run_local(self._mine, "could not fit its step cost")
        gathered: list[Any] = [None] * self.world
        t0 = self.engine.recorder.now()
        dist.all_gather_object(gathered, (mine, self.schedule.drawn), group=self.group)
        self.engine.count_wait(self.engine.recorder.now() - t0)  # blocked on the slower ranks, not compute
        raise_failed("balance", [m for m, _ in gathered], self.rank, mine, global_ranks(self.group, self.world))
        if any(m is None for m, _ in gathered):
            return  # some rank has no measurement at the shares in force yet
        old = [m[0] for m, _ in gathered]  # the counts of the ranks' latest steps: the same batch
        if old != self.schedule.current:
            return  # a change not yet run (a loader drew ahead): measure the counts it set first
        costs = [(a, b) for (_, a, b, _), _ in gathered]
        medians_s = [a + b * n for (n, a, b, _), _ in gathered]  # every rank's median at the shares in force
        if any(b <= 0.0 for _, b in costs):
            # a compute that reads 0 (its wait clamped at the period) would draw the whole batch;
            # no decision was made, so the decisions "in a row" start again
            self.pending_reversal, self.held_decisions, self.drifted_decisions = None, 0, 0
            return
        new = counts_for_costs(costs, self.schedule.global_batch)
        old_s, new_s = predicted_s(costs, old), predicted_s(costs, new)
        noise_s = NOISE_Z * sum(m[3] ** 2 for m, _ in gathered) ** 0.5  # the ranks' medians differ by noise
        if new == old or old_s - new_s <= max(MIN_GAIN * old_s, min(noise_s, MAX_NOISE_GAIN * old_s)):
            self.pending_reversal, self.drifted_decisions = None, 0
            self.held_decisions += 1
            if self.hold_when_settled and self.frozen_s is None and self.held_decisions >= HOLD_DECISIONS:
                self.frozen_s, self.drifted_decisions = medians_s, 0
            return
        signs = move_signs(new, old)
        if self.frozen_s is not None and not self._thaws(signs):
            return
        settled = self.hold_when_settled and self.held_decisions > 0  # a move off held shares is confirmed
        reverses = bool(self.changes) and any(s * t < 0 for s, t in zip(
            signs, move_signs(self.changes[-1]["counts"], self.changes[-1]["previous"])))
        if (settled or reverses) and self.pending_reversal != signs:
            self.pending_reversal = signs  # proposed once: kept if the next decision proposes it too
            self.held_decisions = 0  # this decision did not keep the shares: the keeps in a row end
            return
        self.pending_reversal = None
        self.held_decisions = 0
        start = max(d for _, d in gathered)
        self.schedule.change(new, start)
        record = {"step": self._steps, "from_batch": start, "counts": new, "previous": list(old),
                  "fixed_s": [a for a, _ in costs], "s_per_sample": [b for _, b in costs],
                  "predicted_step_s": new_s, "previous_step_s": old_s, "noise_s": noise_s}
        self.changes.append(record)
        self.engine.stats.log("share_changes", record)

    def _thaws(self, signs: list[int]) -> bool:
        """Whether frozen shares thaw at this decision, which proposed a move in direction `signs`:
        when `THAW_DECISIONS` decisions in a row proposed it (a lasting change between the ranks,
        not a spell). The move is then confirmed, made at once."""
        self.drifted_decisions = self.drifted_decisions + 1 if self.pending_reversal == signs else 1
        self.pending_reversal = signs
        if self.drifted_decisions < THAW_DECISIONS:
            return False
        self.frozen_s, self.drifted_decisions, self.held_decisions = None, 0, 0
        self.pending_reversal = signs  # confirmed: the move below needs no further decision
        return True


def balanced_sampler(optimizer: torch.optim.Optimizer, dataset_len: int, global_batch: int,
                     seed: int = 0, counts: list[int] | None = None) -> ShareSampler:
    """This rank's batch sampler for a model parallelized with `balance="batch"`: global batches
    of `global_batch` samples cut into the shares the balancer sets (equal, or `counts`, at first)."""
    engine = getattr(optimizer, "_caramel_engine", None)
    balancer = getattr(getattr(engine, "controller", None), "balancer", None)
    if balancer is None:
        raise CaramelError("balanced_sampler needs an optimizer that caramel.parallelize(..., balance='batch') returned")
    schedule = ShareSchedule(global_batch, balancer.world, counts)
    balancer.attach(schedule)
    return ShareSampler(dataset_len, schedule, balancer.rank, seed)


def balanced_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """What `balance="batch"` makes of uneven workers, for the simulator: shares proportional to
    speed give every worker the compute of global batch / total speed, so each runs the profile's
    step at the mean speed (the bytes reduced do not change; whole-sample rounding is ignored)."""
    mean = sum(w.speed for w in cluster.workers) / cluster.world_size
    return dataclasses.replace(cluster, workers=[dataclasses.replace(w, speed=mean) for w in cluster.workers])
