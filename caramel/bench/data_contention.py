"""How much slower the training process's side of a step runs while its loader workers prefetch
beside it: the data bench's contention calibration, measured before the modes it scores.

On a machine with fewer cores than processes (W ranks, k loader workers each, the store's
server) the training process does not get a core whenever it wants one: its compute, its
all-reduce and its receipt of a batch from a worker each wait their turn behind the workers'
prefetching. The I/O model's inputs are measured alone (compute + all-reduce without data; one
batch's trip through a one-worker loader), so that wait is in none of them.

The calibration runs, on every rank at once and before any mode, `calibration_steps` steps of
the bench's own step (wait for a batch, `compute_s`, all-reduce) with a loader of the mode's
worker count and prefetch depth over samples already decoded in memory (the data set's first
shard), through caramel.data's transport. No store, cache or sampler is involved, so none of the
scored modes' own costs are in it: only the cores shared with busy workers. With its mean step
S_loaded (a mean, as the scored steps are: an occasional long wait is contention too) against
the sum of the parts measured alone, compute + all-reduce C and the batch's trip T,

    contention = max(1, S_loaded / (C + T))

is the factor by which the model stretches the compute side of a prefetched step
(`DataLoadModel.contention`); 1 is a machine with cores to spare. It is never fitted to the
scored steps: the modes run after it.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

from caramel.data.format import DatasetIndex, decode_sample
from caramel.data.store import Store
from caramel.data.transport import WorkerCollate, received
from caramel.errors import CaramelError

WARMUP_STEPS = 2  # the first steps start the workers and fill the prefetch queue: not a steady step


def timed_step(fetch: Callable[[], Any], compute_s: float, sync: Callable[[], None]) -> tuple[float, float, float, float]:
    """One data-bench step: `fetch` the batch, `compute_s` of sleep, `sync` (the all-reduce).
    Returns (wait, compute, sync) seconds and the step's end (perf_counter); the calibration
    and the scored modes time the very same step. A StopIteration from `fetch` propagates."""
    t0 = time.perf_counter()
    fetch()
    t1 = time.perf_counter()
    time.sleep(compute_s)
    t2 = time.perf_counter()
    sync()
    end = time.perf_counter()
    return t1 - t0, t2 - t1, end - t2, end


def calibration_samples(url: str, index: DatasetIndex) -> list[Any]:
    """The data set's first shard, decoded: the calibration's samples (real shapes and dtypes)."""
    info = index.shards[0]
    data = Store(url).read_shard(info)
    return [decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "bench") for p in range(info.num_samples)]


def loaded_steps(samples: list[Any], batch_size: int, loader_workers: int, prefetch_factor: int, steps: int,
                 compute_s: float, sync: Callable[[], None]) -> dict[str, float]:
    """Run `steps` timed steps (wait for a batch, `compute_s` of sleep, `sync`) with a loader of
    `loader_workers` workers over `samples` in memory; the means of the step and its parts
    after the warm-up.
    Every rank must call it at once (`sync` is the all-reduce)."""
    if loader_workers < 1 or steps <= WARMUP_STEPS:
        raise CaramelError(f"the contention calibration needs loader workers >= 1 and more than {WARMUP_STEPS} steps, "
                           f"got {loader_workers} workers and {steps} steps")
    total = (steps + 1) * batch_size
    items = [samples[i % len(samples)] for i in range(total)]
    loader = torch.utils.data.DataLoader(items, batch_size=batch_size, num_workers=loader_workers,
                                         prefetch_factor=prefetch_factor, collate_fn=WorkerCollate(),
                                         multiprocessing_context="fork")
    it = iter(loader)
    fetch = functools.partial(lambda batches: received(next(batches)), it)
    step, wait, compute, comm = [], [], [], []
    last = time.perf_counter()
    for _ in range(steps):
        waited, computed, synced, now = timed_step(fetch, compute_s, sync)
        step.append(now - last)
        wait.append(waited)
        compute.append(computed)
        comm.append(synced)
        last = now
    del fetch, it, loader  # the workers stop here, before the modes start
    def mean(xs: list[float]) -> float:
        kept = xs[WARMUP_STEPS:]
        return sum(kept) / len(kept)

    return {"step_s": mean(step), "wait_s": mean(wait), "compute_s": mean(compute), "sync_s": mean(comm)}


def contention_factor(loaded_step_s: float | None, compute_comm_s: float | None, batch_trip_s: float) -> float:
    """How much longer the step's compute side took beside busy workers than its parts measured
    alone (module docstring); 1 without a measurement or when it ran no slower."""
    if loaded_step_s is None or compute_comm_s is None or compute_comm_s + batch_trip_s <= 0:
        return 1.0
    return max(1.0, loaded_step_s / (compute_comm_s + batch_trip_s))
