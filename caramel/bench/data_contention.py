"""How much slower the training process's side of a step runs while its loader workers prefetch
beside it: the data bench's contention calibration, measured before each mode it scores.

On a machine with fewer cores than processes (W ranks, k loader workers each, the store's
server) the training process does not get a core whenever it wants one: its compute, its
all-reduce and its receipt of a batch from a worker each wait their turn behind the workers'
prefetching. The I/O model's inputs are measured alone (compute + all-reduce without data; one
batch's trip through a one-worker loader), so that wait is in none of them.

Right before each round of each mode, every rank runs `calibration_steps` of the bench's own step
(wait for a batch, `compute_s`, all-reduce) without data (C, the median) and then beside a loader
of the mode's own class and worker setup over data that needs no store (`mode_calibration_loader`):
the plain mode's torch DataLoader over samples in memory, the cached and locality modes'
StatefulDataLoader with their memory tier and counters over a disk cache holding the first two
shards, timed over a second pass of its persistent workers (`steady_steps`: two passes of
`calibration_steps`, the second timed), as the modes are scored from their second epoch. So the
mode's loader's own work per batch (tier lookups, decoding, counters, the loader's state in the
training process) is in it; the store, the misses and the sampler's order are not: the model
charges those itself. With its mean step S_loaded (a mean, as the scored steps are: an occasional
long wait is contention too; with `calibration_sub_windows` K > 1 the median of K consecutive
parts' means, `calibration_window`) against the floor of C (the quickest of the run's windows of steps
alone, `alone_floor_s`) plus the batch's trip T by the mode's transport,

    contention = max(1, S_loaded / (C + T))

per round (`round_inputs`). The model predicts each round's step from that round's factor (a
round on a busier machine runs slower beside the workers) and the mode's step is the median over
its rounds, as the measured step is a median over its epochs (`data_report.summarize`). The factor stretches the compute side of a prefetched
step (`DataLoadModel.contention`); 1 is a machine with cores to spare. S_loaded is taken right
before its round, the floor C over the whole run's windows of steps alone (later rounds'
included, so a round's prediction is complete when the run ends); neither is fitted to the
scored steps, both being steps timed apart from them.

The timed second pass starts with a new iterator over the warm workers inside its first step,
as each scored epoch does; its warm-up steps over steady ones (`epoch_start_excess_s`) are what an
epoch's start costs beside the load, which the model adds to each epoch's edge.

`loaded_steps` is the calibration run once per run before any mode (torch's DataLoader over
samples in memory, caramel.data's transport): the model of one calibration per run, which the
bench reports beside the per-mode one.
"""
from __future__ import annotations

import functools
import os
import random
import time
from typing import Any, Callable, Iterator

import torch

from caramel.bench.calibration_window import WARMUP_STEPS, window_summary
from caramel.data.format import DatasetIndex, ShardInfo, decode_sample
from caramel.data.store import Store
from caramel.data.tiers import TierCounters
from caramel.data.transport import WorkerCollate, received
from caramel.errors import CaramelError


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


def calibration_shards(url: str, index: DatasetIndex, count: int = 2) -> list[tuple[ShardInfo, bytes]]:
    """The data set's first `count` shards as read from the store: the calibrations' samples
    (real shapes and dtypes; two shards, as the locality sampler mixes groups of shards)."""
    store = Store(url)
    return [(info, store.read_shard(info)) for info in index.shards[:count]]


def decoded(shards: list[tuple[ShardInfo, bytes]]) -> list[Any]:
    """Every sample of `shards`, decoded: the in-memory data of the plain loader's calibration."""
    return [decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "bench")
            for info, data in shards for p in range(info.num_samples)]


def time_steps(batches: Iterator[Any], steps: int, compute_s: float, sync: Callable[[], None],
               on_warm: Callable[[], None] | None = None, sub_windows: int = 1) -> dict[str, Any]:
    """`steps` timed steps (next batch of `batches`, `compute_s` of sleep, `sync`); the means of
    the step's parts after the warm-up (`on_warm` called as it ends), and its step: the mean too,
    or with `sub_windows` > 1 the median of that many consecutive parts' means
    (`calibration_window.window_summary`; `step_s_mean` keeps the mean, `steps_s` every step after
    the warm-up, so a stored window can be summed up again). Every rank must call it at once
    (`sync` is the all-reduce)."""
    if steps <= WARMUP_STEPS:
        raise CaramelError(f"the contention calibration needs more than {WARMUP_STEPS} steps, got {steps}")
    fetch = functools.partial(next, batches)
    step, wait, compute, comm = [], [], [], []
    last = time.perf_counter()
    for k in range(steps):
        if k == WARMUP_STEPS and on_warm is not None:
            on_warm()
        waited, computed, synced, now = timed_step(fetch, compute_s, sync)
        step.append(now - last)
        wait.append(waited)
        compute.append(computed)
        comm.append(synced)
        last = now

    def mean(xs: list[float]) -> float:
        kept = xs[WARMUP_STEPS:]
        return sum(kept) / len(kept)

    return {"step_s": window_summary(step[WARMUP_STEPS:], sub_windows), "step_s_mean": mean(step),
            "steps_s": step[WARMUP_STEPS:], "wait_s": mean(wait), "compute_s": mean(compute), "sync_s": mean(comm),
            "warmup_step_s": step[:WARMUP_STEPS]}


class _Restarted:
    """`iter(loader)` on the first `next`, so the restart of a warm loader's workers is inside the
    first timed step, as a scored epoch's start is inside its first wait (`data_bench_rank._run_epochs`)."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.it = loader, None

    def __iter__(self) -> "_Restarted":
        return self

    def __next__(self) -> Any:
        if self.it is None:
            self.it = iter(self.loader)
        return next(self.it)


def epoch_start_excess_s(loaded: dict[str, Any] | None) -> float | None:
    """What a warm loader's epoch start costs beside the load: the restart pass's warm-up steps
    (`restart_step_s`, the new iterator's start inside the first) over as many of its steady
    steps. None when not measured (records before it)."""
    if not loaded or not loaded.get("restart_step_s"):
        return None
    steps = loaded["restart_step_s"]
    return max(sum(steps) - len(steps) * loaded["step_s"], 0.0)


def steady_steps(loader: Any, steps: int, compute_s: float, sync: Callable[[], None],
                 window: Any = None, sub_windows: int = 1) -> dict[str, Any]:
    """`time_steps` over a second pass of `loader`, whose workers persist from the first: the
    steady state the modes are scored in (their epochs 2+, workers started and warm), not the
    workers' start-up, which on a loaded machine lasts more than the warm-up's steps when the
    compute is short. The first pass (the same steps, all-reduce included) is kept as
    `first_pass_step_s`. The second pass starts with a new iterator over the warm workers, inside
    its first timed step as a scored epoch's start is (the first pass run to its end first, as an
    epoch is): its warm-up steps are kept as `restart_step_s` (`epoch_start_excess_s`).
    With `window` (an Event) it is set over the first pass's steps after the warm-up and cleared
    before the second: the loaded but unscored steps in which the request probe reads
    (`data_overhead`), whose monotonic bounds are kept as `probe_window_s`. The second pass's
    step is summed up over `sub_windows` (`time_steps`)."""
    bounds: list[float] = []

    def opened() -> None:
        bounds.append(time.monotonic())
        window.set()

    it = iter(loader)
    try:
        first = time_steps(it, steps, compute_s, sync, opened if window is not None else None)
        first.pop("warmup_step_s")  # the workers' start-up (fork), which no scored epoch repeats
        first.pop("steps_s")
    finally:
        if window is not None:
            window.clear()
            bounds.append(time.monotonic())
    for _ in it:  # untimed: a scored epoch ends its pass before the next starts, so its restart drains nothing
        pass
    out = time_steps(_Restarted(loader), steps, compute_s, sync, sub_windows=sub_windows)
    # the second pass restarts warm workers as every scored epoch does: its warm-up steps are that start
    out = dict(out, first_pass_step_s=first["step_s"], restart_step_s=out.pop("warmup_step_s"))
    if len(bounds) == 2:
        out["probe_window_s"] = bounds
    return out


def loaded_steps(samples: list[Any], batch_size: int, loader_workers: int, prefetch_factor: int, steps: int,
                 compute_s: float, sync: Callable[[], None]) -> dict[str, float]:
    """The calibration run once before every mode: `steps` timed steps with torch's DataLoader of
    `loader_workers` workers over `samples` in memory, through caramel.data's transport (the model
    with one calibration per run; `data_bench_rank._mode_calibration` runs each mode's own loader).
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
    out = time_steps(map(received, it), steps, compute_s, sync)
    out.pop("warmup_step_s")  # the one calibration's workers start here: not an epoch's restart
    out.pop("steps_s")
    del it, loader  # the workers stop here, before the modes start
    return out


def alone_floor_s(start_s: float | None, calibrations: list[dict[str, Any]]) -> float | None:
    """The quickest of a run's windows of steps alone (the one before the modes, and each mode's
    round's): the compute side's floor. Another process on the cores only slows such a window,
    and on the loaded machine a whole window of 40 steps alone sometimes ran at up to twice its
    floor while the loaded steps timed right after it did not, so a slow window is interference,
    not the round's load. None when nothing was measured."""
    windows = ([start_s] if start_s is not None else []) + [c["alone_s"] for c in calibrations]
    return min(windows) if windows else None


def round_inputs(calibrations: list[dict[str, Any]], batch_trip_s: float, floor_s: float) -> list[tuple[float, float]]:
    """(contention, compute + all-reduce alone) of each round of one mode: the loaded step of the
    calibration right before the round (so a load that changed between rounds is followed) against
    the run's floor of steps alone (`alone_floor_s`). A round calibrated without loader workers
    has contention 1."""
    return [(contention_factor(c["loaded"]["step_s"] if c.get("loaded") else None, floor_s, batch_trip_s), floor_s)
            for c in calibrations]


def round_epoch_starts(calibrations: list[dict[str, Any]]) -> list[float]:
    """Each round's measured epoch start (`epoch_start_excess_s`), 0 where its calibration did not
    time one (records before it, rounds without loader workers): the model's edge as before."""
    return [epoch_start_excess_s(c.get("loaded")) or 0.0 for c in calibrations]


def contention_factor(loaded_step_s: float | None, compute_comm_s: float | None, batch_trip_s: float) -> float:
    """How much longer the step's compute side took beside busy workers than its parts measured
    alone (module docstring); 1 without a measurement or when it ran no slower."""
    if loaded_step_s is None or compute_comm_s is None or compute_comm_s + batch_trip_s <= 0:
        return 1.0
    return max(1.0, loaded_step_s / (compute_comm_s + batch_trip_s))


def calibration_order(shards: list[tuple[ShardInfo, bytes]], index: DatasetIndex, total: int, seed: int) -> list[int]:
    """`total` sample indices of `shards`, each pass over them shuffled (seeded): the order in
    which the locality sampler reads a group of cached shards, so the workers switch shards as
    in the scored steps (memory-tier lookups, not only the shard in use)."""
    first = {info.name: k for k, info in enumerate(index.shards)}
    pool = [i for info, _ in shards for i in index.sample_range(first[info.name])]
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < total:
        rng.shuffle(pool)
        order.extend(pool)
    return order[:total]


def mode_calibration_loader(mode: str, cfg: Any, url: str, index: DatasetIndex, rank: int,
                            shards: list[tuple[ShardInfo, bytes]], directory: str, budget: tuple[int, int],
                            counters: TierCounters):
    """A loader of the mode's own class and worker setup over data that needs no store: what the
    mode's training process and workers do per batch, beside the step, without the loading the
    model charges itself (the link, the requests, the misses' disk reads).

    `remote`: torch's DataLoader as the plain mode builds it (its workers, prefetch, persistent
    workers, default collate by shared memory) over `shards` decoded in memory. `cached` and
    `locality`: `make_loader` with the mode's options (StatefulDataLoader, caramel.data's transport,
    the memory tier's budget, the tier counters) on a disk cache holding `shards`, read in a
    locality-like order of theirs; after the first read of each shard they come from the memory
    tier, as a fully cached mode's do. Enough batches for `cfg.calibration_steps` steps. Nothing
    is read from the store at `url`, not even its `index` (the caller's): the server's count of
    a run's bytes stays the modes' own."""
    total = (cfg.calibration_steps + 1) * cfg.batch_size
    if mode == "remote":
        samples = decoded(shards)
        items = [samples[i % len(samples)] for i in range(total)]
        return torch.utils.data.DataLoader(items, batch_size=cfg.batch_size, num_workers=cfg.loader_workers,
                                           prefetch_factor=cfg.prefetch_factor, persistent_workers=True,
                                           multiprocessing_context="fork")
    from caramel.data.cache import ShardCache
    from caramel.data.loader import LoaderOptions, make_loader

    disk = max(budget[0], sum(len(data) for _, data in shards))  # the shards stay on disk whatever the mode's budget
    cache = ShardCache(os.path.join(directory, f"rank{rank}"), disk)
    for info, data in shards:
        cache.put(info, data)
    opts = LoaderOptions(batch_size=cfg.batch_size, num_workers=cfg.loader_workers, prefetch_factor=cfg.prefetch_factor,
                         cache_dir=directory, cache_budget_bytes=disk, memory_budget_bytes=budget[1],
                         locality=(mode == "locality"), seed=cfg.seed)
    return make_loader(url, rank, cfg.ranks, opts, counters=counters,
                       sampler=calibration_order(shards, index, total, cfg.seed + rank), index=index)
