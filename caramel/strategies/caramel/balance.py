"""`balance="batch"`: each worker's share of the global batch follows its measured speed.

A synchronous step lasts as long as its slowest worker; with equal shares a worker twice as
slow doubles every step. Here each rank times its own compute per sample (the step's period
minus its waits on communication, over its local batch), in a moving window; every
`balance_every` steps the ranks all-gather those times and every rank computes the same new
counts, proportional to each one's samples per second (`caramel.data.share_sampler`), kept only
when they are predicted to shorten the step by more than `MIN_GAIN`. The new counts apply from
the first batch no rank has drawn yet.

Gradients are weighted by share: a rank whose forward saw n of the global batch's B samples
adds n/B of its mean gradient (`Engine.set_grad_scale`, read from the forward's input), so the
sum the ranks reduce is the global batch's mean gradient, as if one process had trained on
the union of the ranks' batches. Use the sampler `balanced_sampler` returns, one batch per step.
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.data.share_sampler import ShareSampler, ShareSchedule, counts_from_rates
from caramel.errors import CaramelError
from caramel.topology.spec import ClusterSpec

WINDOW_STEPS = 10  # per-sample compute times kept (the median of them is the estimate)
MIN_GAIN = 0.05  # new counts must be predicted to shorten the step by more than 5%


class Balancer:
    """The shares of one engine's ranks (module docstring)."""

    def __init__(self, engine: Any, model: nn.Module, group: Any, rank: int, world: int, every: int):
        self.engine, self.group, self.rank, self.world, self.every = engine, group, rank, world, every
        self.schedule: ShareSchedule | None = None
        self.times: collections.deque = collections.deque(maxlen=WINDOW_STEPS)
        self.local_batch: int | None = None
        self.changes: list[dict[str, Any]] = []
        self._steps = 0
        model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)

    def attach(self, schedule: ShareSchedule) -> None:
        if schedule.world_size != self.world:
            raise CaramelError(f"the share schedule is for {schedule.world_size} ranks, this job has {self.world}")
        self.schedule = schedule

    def _pre_forward(self, _m, args, kwargs) -> None:
        if self.schedule is None or not torch.is_grad_enabled():
            return
        first = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0), None)
        if first is None:
            raise CaramelError("balance='batch' weights gradients by the local batch size, read from the forward's "
                               "first tensor input; this forward has none")
        self.local_batch = int(first.shape[0])
        self.engine.set_grad_scale(self.local_batch / self.schedule.global_batch)

    def step_end(self) -> None:
        """After every reduced step: record this rank's time per sample; every `every` steps, decide."""
        if self.schedule is None:
            raise CaramelError("balance='batch' needs its sampler: draw batches with "
                               "caramel.strategies.caramel.balance.balanced_sampler(optimizer, len(dataset), global_batch)")
        stats = self.engine.stats
        if stats.last_step_s is not None and self.local_batch:
            self.times.append(max(stats.last_step_s - stats.last_wait_s, 0.0) / self.local_batch)
        self._steps += 1
        if self.every and self._steps % self.every == 0 and self.world > 1:
            self._decide()

    def _decide(self) -> None:
        mine = statistics.median(self.times) if self.times else 0.0
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, (mine, self.schedule.drawn), group=self.group)
        times = [t for t, _ in gathered]
        if min(times) <= 0.0:
            return  # some rank has no measurement yet
        old = self.schedule.current
        new = counts_from_rates([1.0 / t for t in times], self.schedule.global_batch)
        old_s = max(t * n for t, n in zip(times, old))
        new_s = max(t * n for t, n in zip(times, new))
        if new == old or new_s >= old_s * (1.0 - MIN_GAIN):
            return
        start = max(d for _, d in gathered)
        self.schedule.change(new, start)
        record = {"step": self.engine.stats.step, "from_batch": start, "counts": new, "previous": list(old),
                  "s_per_sample": times, "predicted_step_s": new_s, "previous_step_s": old_s}
        self.changes.append(record)
        self.engine.stats.log("share_changes", record)


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
