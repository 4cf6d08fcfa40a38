"""Worker functions for the rank-failure tests (spawned; must be importable)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch.distributed as dist
import torch.nn as nn

from caramel.data.share_sampler import ShareSchedule
from caramel.runtime.stats import EngineStats
from caramel.strategies.caramel.balance import Balancer


class _FailingFit(Balancer):
    """A balancer whose cost fit raises on the rank told to fail."""

    fail_rank = 1

    def _mine(self):
        if self.rank == self.fail_rank:
            raise ValueError("the fit blew up")
        return super()._mine()


def balance_failure_worker(rank: int, world: int) -> dict:
    """One decision of a real 2-rank gloo balancer whose rank 1 cannot fit its cost: what each
    rank raised (type, message) and how long after the decision began."""
    engine = SimpleNamespace(stats=EngineStats(), remove_at_release=lambda *handles: None,
                             recorder=SimpleNamespace(now=time.perf_counter), count_wait=lambda s: None)
    b = _FailingFit(engine, nn.Linear(2, 2), dist.group.WORLD, rank, world, every=1)
    b.schedule, b.local_batch = ShareSchedule(8, world), 4
    engine.stats.last_step_s, engine.stats.last_wait_s = 0.01, 0.0
    t0 = time.monotonic()
    try:
        b.step_end()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"type": type(e).__name__, "message": str(e), "after_s": time.monotonic() - t0}
    return {"type": None, "message": "", "after_s": time.monotonic() - t0}
