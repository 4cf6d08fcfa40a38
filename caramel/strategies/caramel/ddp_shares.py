"""DDP's schedule under `balance="batch"`: torch DDP's buckets, weighted by share and timed.

Torch DDP averages each bucket over the ranks with equal weights (it divides by the world
size), while `balance="batch"` needs each rank's mean gradient weighted by its share n_r / B
(`balance.Balancer`). The balancer also needs each rank's compute, its step period minus its
waits on communication, and while torch DDP runs the job the engine's own hooks, which time
those waits, stand aside. So when the overlap trial tries (or keeps) DDP's schedule with
`balance="batch"`, the hand-over registers this communication hook on the DDP module
(`Handover.hand_over`):

- each bucket is multiplied by the engine's gradient scale (the share the balancer set from the
  forward's input; 1 / world size when none is set) and summed over the ranks, so the reduced
  gradient is the union batch's mean, as with the engine's own plan (torch does not predivide
  a bucket when a hook is registered);
- the hook notes when the last bucket of a step became ready (the backward's compute is done)
  and when the last all-reduce completed; on gloo (CPU tensors) DDP's backward returns only
  then, so the difference is the step's exposed wait, which `Engine.step` adds to the step's
  waits (`wait_s`). On NCCL this does not hold: the work's future completes when the
  all-reduce is enqueued and the CPU runs ahead of the GPU, so the hook times about nothing
  there (docs/adapt.md, limits).

balance="dropout" cannot run under torch DDP this way: its average divides each entry by the
number of ranks that computed it, which a bucket-wide weight cannot express.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.distributed as dist


class SharesHook:
    """A DDP communication hook: all-reduce of share-weighted buckets, with the exposed wait timed."""

    def __init__(self, engine: Any, group: Any):
        self.engine, self.group = engine, group
        self._lock = threading.Lock()  # the completion callbacks run on the process group's threads
        self._ready_s: float | None = None  # when the step's latest bucket was handed to the hook
        self._done_s: float | None = None  # when the step's latest all-reduce completed

    # unannotated: torch checks a hook's annotations, which this module's postponed ones would fail
    def reduce(self, _state, bucket):
        scale = self.engine.grad_scale
        buf = bucket.buffer()
        buf.mul_(1.0 / self.engine.world_size if scale is None else scale)
        with self._lock:
            self._ready_s = time.perf_counter()
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            with self._lock:
                now = time.perf_counter()
                self._done_s = now if self._done_s is None else max(self._done_s, now)
            return f.value()[0]

        return fut.then(done)

    def wait_s(self) -> float:
        """The exposed wait of the step just reduced (0 when nothing was reduced), and reset."""
        with self._lock:
            ready, done = self._ready_s, self._done_s
            self._ready_s = self._done_s = None
        if ready is None or done is None:
            return 0.0
        return max(done - ready, 0.0)
