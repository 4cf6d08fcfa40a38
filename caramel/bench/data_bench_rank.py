"""What each rank process of the data-loading benchmark does (`caramel.bench.data_bench`).

A spawned rank joins the gloo group (on its own host with `network="cluster"`), times its
steps alone and beside busy loader workers, then runs every mode's round: a calibration right
before it (`_mode_calibration`), then the mode's loader for `epochs` epochs, each step timed and
each epoch's counts and times sent to the parent through the queue, in lockstep with the parent
through the barrier. Kept apart from `data_bench`, which is the parent's side: it sets up the
store, spawns the ranks, reads the server's counters per epoch and builds the report.
"""
from __future__ import annotations

import functools
import gc
import shutil
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import torch

from caramel.bench.data_contention import timed_step
from caramel.data.format import DatasetIndex
from caramel.data.store import Store
from caramel.data.tiers import TierCounters

if TYPE_CHECKING:
    from caramel.bench.data_bench import DataBenchConfig


def _loader(mode: str, cfg: DataBenchConfig, url: str, rank: int, rnd: int, workdir: str, budget: tuple[int, int],
            counters: TierCounters):
    """(loader, the sampler to set_epoch or None) of one mode."""
    if mode == "remote":
        from caramel.data.loader import ShardedDataset

        dataset = ShardedDataset(Store(url), counters=counters)
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=cfg.ranks, rank=rank, shuffle=True,
                                                      seed=cfg.seed + rnd, drop_last=True)
        kwargs: dict[str, Any] = {}
        if cfg.loader_workers > 0:
            kwargs = dict(prefetch_factor=cfg.prefetch_factor, persistent_workers=True, multiprocessing_context="fork")
        return torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True,
                                           num_workers=cfg.loader_workers, **kwargs), sampler
    from caramel.data.loader import LoaderOptions, make_loader

    opts = LoaderOptions(batch_size=cfg.batch_size, num_workers=cfg.loader_workers, prefetch_factor=cfg.prefetch_factor,
                         cache_dir=f"{workdir}/cache-{rnd}-{mode}", cache_budget_bytes=budget[0],
                         memory_budget_bytes=budget[1], locality=(mode == "locality"), seed=cfg.seed + rnd)
    return make_loader(url, rank, cfg.ranks, opts, counters=counters), None


def _run_epochs(loader, sampler, cfg: DataBenchConfig, rank: int, barrier, queue, counters: TierCounters,
                sync) -> None:
    """One mode's epochs on one rank, each step timed; each epoch's counts and times go to `queue`.
    The iterator is local, so none outlives the call (with persistent workers it holds them)."""
    for epoch in range(cfg.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        barrier.wait()  # every rank ready: the parent reads the server's counters now...
        barrier.wait()  # ...and only then are the ranks released, so no request of the epoch precedes them
        before = counters.snapshot()
        steps, waits, syncs = [], [], []
        it = None

        def fetch() -> None:
            nonlocal it
            if it is None:  # starting the epoch (workers told to begin) is part of the first wait
                it = iter(loader)
            next(it)
        last = time.perf_counter()
        while True:
            try:
                waited, _, synced, now = timed_step(fetch, cfg.compute_s, sync)
            except StopIteration:
                break
            steps.append(now - last)
            waits.append(waited)
            syncs.append(synced)
            last = now
        queue.put(("epoch", (rank, asdict(counters.snapshot() - before), steps, sum(waits) / len(waits),
                             sum(syncs) / len(syncs))))
        barrier.wait()


def _calibrates_loaded(cfg: DataBenchConfig, shards: list | None) -> bool:
    """Whether the ranks time steps beside busy loader workers before the modes (the model's
    contention): with workers, samples, and steps beyond the calibration's warm-up."""
    from caramel.bench.data_contention import WARMUP_STEPS

    return bool(shards) and cfg.loader_workers > 0 and cfg.calibration_steps > WARMUP_STEPS


def _steps_alone(cfg: DataBenchConfig, sync) -> float:
    """The median of `calibration_steps` steps of compute and all-reduce without data (every rank at once)."""
    no_data = []
    for _ in range(cfg.calibration_steps):
        t0 = time.perf_counter()
        time.sleep(cfg.compute_s)
        sync()
        no_data.append(time.perf_counter() - t0)
    return sorted(no_data)[len(no_data) // 2] if no_data else cfg.compute_s


def _mode_calibration(mode: str, cfg: DataBenchConfig, url: str, index: DatasetIndex | None, rank: int, rnd: int,
                      workdir: str, budget: tuple[int, int], shards: list | None, counters: TierCounters,
                      sync, probe_window=None) -> dict | None:
    """Right before a mode's round, on every rank: its steps alone and (with loader workers) beside
    the mode's own loader over data that needs no store (`data_contention.mode_calibration_loader`),
    from the second pass of its workers (`steady_steps`), so the model's contention follows the
    machine's load from round to round and includes the mode's loader's own work per batch.
    `probe_window` (rank 0's, an Event): opened over the first pass's loaded steps, in which the
    bench's request probe reads (`data_overhead`). None when the bench calibrates nothing."""
    if cfg.calibration_steps <= 0:
        return None
    out: dict[str, Any] = {"mode": mode, "round": rnd, "alone_s": _steps_alone(cfg, sync), "loaded": None,
                           "window_steps": cfg.calibration_steps}
    if _calibrates_loaded(cfg, shards):
        from caramel.bench.data_contention import mode_calibration_loader, steady_steps

        directory = f"{workdir}/calibration-{rnd}-{mode}"
        loader = None
        try:
            loader = mode_calibration_loader(mode, cfg, url, index, rank, shards, directory, budget, counters)
            out["loaded"] = steady_steps(loader, cfg.calibration_steps, cfg.compute_s, sync, probe_window,
                                         cfg.calibration_sub_windows)
            out["loaded"]["sub_windows"] = cfg.calibration_sub_windows
        finally:
            _shut_down(loader)  # its workers gone before the mode's first step, or at once on an error
            del loader
            gc.collect()
            # the rank's two-shard cache goes now, not at the run's end: ranks x rounds x modes copies of shards
            shutil.rmtree(f"{directory}/rank{rank}", ignore_errors=True)
    return out


def other_rank_calibration(rank: int, calibration: dict) -> dict:
    """What a rank other than 0 reports of its calibration: its loaded pass's step, wait, compute
    and all-reduce means (None without a loaded pass), so the record can say which rank was late."""
    loaded = calibration.get("loaded")
    keys = ("step_s", "wait_s", "compute_s", "sync_s")
    return {"rank": rank, "loaded": {k: loaded[k] for k in keys if k in loaded} if loaded else None}


def _window_in_steps(cfg: DataBenchConfig, alone_s: float) -> DataBenchConfig:
    """`cfg` with a window given in seconds converted to steps from the slowest rank's first steps
    alone (an all-reduce, so every rank runs the same count: each step ends in one)."""
    if cfg.calibration_seconds is None:
        return cfg
    import torch.distributed as dist

    slowest = torch.tensor([alone_s], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return replace(cfg, calibration_steps=cfg.calibration_window().steps_for(float(slowest.item())))


def _first_windows(cfg: DataBenchConfig, rank: int, queue, shards: list | None, sync) -> DataBenchConfig:
    """The run's first windows, once before the modes, on every rank: steps alone (rank 0 sends
    "alone"), then beside busy workers (the model with one calibration per run; "loaded"). Returns
    `cfg` with its window in steps (`_window_in_steps`), which every later calibration runs."""
    alone_s = _steps_alone(cfg, sync)
    if rank == 0:
        queue.put(("alone", alone_s))
    cfg = _window_in_steps(cfg, alone_s)
    if _calibrates_loaded(cfg, shards):
        from caramel.bench.data_contention import decoded, loaded_steps

        loaded = loaded_steps(decoded(shards), cfg.batch_size, cfg.loader_workers, cfg.prefetch_factor,
                              cfg.calibration_steps, cfg.compute_s, sync)
        gc.collect()  # its workers gone before the first mode
        if rank == 0:
            queue.put(("loaded", dict(loaded, window_steps=cfg.calibration_steps)))
    return cfg


def _shut_down(loader) -> None:
    """Stop `loader`'s persistent workers now. Dropping the last reference does the same, but on an
    error the traceback's frames still hold the loader and its iterator."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None


def _rank_main(rank: int, cfg: DataBenchConfig, url: str, workdir: str, budget: tuple[int, int], barrier, queue,
               host: tuple[str, str] | None = None, shards: list | None = None, index: DatasetIndex | None = None,
               probe_window=None) -> None:
    import datetime

    import torch.distributed as dist

    if host is not None:  # network="cluster": this rank's own host, before any thread or socket exists
        from caramel.bench.data_cluster import enter_host
        enter_host(*host)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/pg", rank=rank, world_size=cfg.ranks,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    try:
        counters = TierCounters()  # before the loaders fork their workers, which inherit it
        calibration_counters = TierCounters()  # the calibrations' workers count apart from the modes'
        token = torch.zeros(1)
        sync = functools.partial(dist.all_reduce, token)
        cfg = _first_windows(cfg, rank, queue, shards, sync)
        for rnd in range(cfg.rounds):
            for mode in cfg.modes:
                calibration = _mode_calibration(mode, cfg, url, index, rank, rnd, workdir, budget, shards,
                                                calibration_counters, sync, probe_window)
                if rank == 0 and calibration is not None:
                    queue.put(("calibration", calibration))
                elif calibration is not None:
                    queue.put(("calibration_rank", other_rank_calibration(rank, calibration)))
                loader, sampler = _loader(mode, cfg, url, rank, rnd, workdir, budget, counters)
                _run_epochs(loader, sampler, cfg, rank, barrier, queue, counters, lambda: dist.all_reduce(token))
                # the mode's iterator left with _run_epochs; dropping the loader now shuts its persistent
                # workers down here, between modes, not inside the next mode's first timed step
                del loader, sampler
                gc.collect()  # and if a reference cycle holds the iterator, now rather than during a later step
    except BaseException:
        barrier.abort()  # the parent and the other ranks stop waiting at once
        raise
    finally:
        dist.destroy_process_group()
