"""Uneven workers in `caramel train`: an emulated slow worker, and batches cut by share.

`--slow-worker RANK:FACTOR` slows that rank's forward + backward FACTOR times with the
calibrated delay of `caramel.profile.slowdown` (each rank times its own compute per sample on
a first batch; the slow rank then sleeps (FACTOR - 1) times its measurement per sample after
every training forward).

With `--strategy caramel:balance=batch` each step's global batch (workers x batch size
samples) is cut into the shares the engine's balancer sets (`balanced_sampler`): the same
global batch per step as with equal shares, so the same samples are seen at the same step and
samples per second compare. The epoch's order is the share sampler's own permutation, and the
partial last global batch is dropped. A resumed run continues with the share schedule,
balance="dropout"'s fractions, mask step and confirmation, and each rank's timing window: they
travel in the optimizer state (`caramel.strategies.caramel.balance_state`). With
balance="dropout" the summary adds the drop fractions in force at the end and their changes
([step, fractions] pairs).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.profile.slowdown import parse_slow_worker, per_sample_compute_s, slow_down


def emulate_slow_worker(spec: str, rank: int, world: int, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                        loss_fn) -> dict[str, Any] | None:
    """Slow `model` on the rank `spec` names (all ranks call: they gather their measurements);
    returns what was done, the same dict on every rank, or None without a spec."""
    if not spec:
        return None
    slow_rank, factor = parse_slow_worker(spec, "--slow-worker")
    if slow_rank >= world:
        raise CaramelError(f"--slow-worker {spec}: rank {slow_rank} does not exist among {world} workers")
    mine = per_sample_compute_s(model, x, y, loss_fn)
    gathered: list[Any] = [None] * world
    if world > 1:
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    delay = (factor - 1.0) * gathered[slow_rank]
    if rank == slow_rank:
        slow_down(model, delay)
    return {"rank": slow_rank, "factor": factor, "method": "calibrated delay",
            "compute_per_sample_s": gathered[slow_rank], "delay_per_sample_s": delay,
            "compute_per_sample_per_rank_s": gathered}


class BatchSource:
    """This rank's sample indices for each step: the sharded sampler's equal slices, or with
    balance="batch" the share sampler's (module docstring)."""

    def __init__(self, sharded, optimizer: torch.optim.Optimizer, balance: str, global_batch: int, dataset_len: int,
                 seed: int):
        self.sharded, self.shares = sharded, None
        engine = getattr(optimizer, "_caramel_engine", None)
        self.balancer = getattr(getattr(engine, "controller", None), "balancer", None)
        if balance != "batch":
            return
        if sharded.remainder != "drop":
            raise CaramelError("balance='batch' drops the partial last global batch of an epoch; use --remainder drop")
        from caramel.strategies.caramel.balance import balanced_sampler
        self.shares = balanced_sampler(optimizer, dataset_len, global_batch, seed=seed)

    def indices(self, step: int) -> torch.Tensor:
        if self.shares is None:
            return self.sharded.indices(step)
        out = torch.tensor(self.shares.batch(step), dtype=torch.long)
        self.shares.schedule.drawn = step + 1  # the balancer changes shares only from undrawn batches
        return out

    def summary(self) -> dict[str, Any]:
        if hasattr(self.balancer, "fractions"):  # balance="dropout": the drops in force, and their changes
            return {"dropout_fractions": list(self.balancer.fractions),
                    "dropout_changes": [[c["step"], c["fractions"]] for c in self.balancer.changes]}
        if self.shares is None:
            return {}
        return {"share_counts": list(self.shares.schedule.current),
                "share_changes": [[start, list(c)] for start, c in self.shares.schedule.entries]}
