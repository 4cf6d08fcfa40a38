"""Uneven workers in the bench: an emulated slow worker, and the runner for `balance="batch"`.

`--slow-worker RANK:FACTOR` makes that rank's compute FACTOR times slower with a calibrated
delay (not a CPU quota; `caramel.profile.slowdown`): the job first times the model's forward
and backward per sample on each rank, with no communication, and the slow rank then sleeps
(FACTOR - 1) times that, per sample of its local batch, after every training forward.

`BalancedRunner` draws each step's local batch from a pool of one global batch (every rank's
fixed batch, repeated world-size times) through the balancer's sampler, so every strategy
trains the same global batch per step and step times compare as samples per second do.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn as nn

from caramel.bench.baselines import plain_step, sync_device
from caramel.bench.strategies import TrainRunner


class BalancedRunner(TrainRunner):
    """A `balance="batch"` strategy's steps: this rank's share of one global batch per step."""

    def __init__(self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets, loss_fn,
                 device: torch.device, world: int, **kw: Any):
        from caramel.strategies.caramel.balance import balanced_sampler
        super().__init__(name, model, optimizer, inputs, targets, loss_fn, device, **kw)
        self.pool_x = torch.cat([inputs] * world)
        self.pool_y = torch.cat([targets] * world)
        n = len(self.pool_x)
        self.sampler = balanced_sampler(optimizer, n, n)
        self._batches = itertools.chain.from_iterable(iter(self.sampler) for _ in itertools.count())

    def step(self) -> None:
        idx = torch.tensor(next(self._batches))
        plain_step(self.model, self.optimizer, self.pool_x[idx], self.pool_y[idx], self.loss_fn)
        sync_device(self.device)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["share_counts"] = list(self.sampler.schedule.current)
        return out
