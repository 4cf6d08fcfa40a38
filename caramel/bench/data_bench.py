"""The data-loading benchmark: the plain loader, a shard cache, and the locality-aware sampler,
side by side on the same store, several epochs each.

The store is a URL: a local directory (or file:// URL) is served over http on loopback behind
an emulated link (`store_rate_bps`, `store_latency_s`), or with `network="cluster"` by a
`caramel data serve` process on its own host of an emulated cluster behind a tc-shaped link,
each rank on a host of its own (`data_cluster`); an http(s):// or s3:// URL is read as it is,
over whatever link leads to it. Without a URL a random data set is generated and served.

W rank processes (gloo, one tiny all-reduce per step so ranks move in lockstep as data-parallel
training does) each run every mode in turn, each round; a barrier that the parent joins marks
every epoch, so the parent reads the server's byte counter per mode and epoch (before it
releases the ranks, so none of an epoch's requests escapes the count). A step is the wait for
the next batch plus `compute_s` of sleep standing in for the model (a sleep, so the
loader workers keep the CPUs) plus the all-reduce; each is timed. Modes:

- `remote`: torch's own `DataLoader` + `DistributedSampler` over the store, one range read per
  sample, no cache (what a user has without `caramel.data`);
- `cached`: `caramel.data`'s loader in DistributedSampler order, whole shards cached per rank;
- `locality`: `caramel.data`'s loader with the locality-aware sampler over the same cache.
"""
from __future__ import annotations

import collections
import functools
import gc
import math
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from caramel.bench.data_contention import timed_step
from caramel.data.format import DatasetIndex, write_random_dataset
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.data.tiers import TierCounters
from caramel.errors import CaramelError

MODES = ("remote", "cached", "locality")


@dataclass
class DataBenchConfig:
    ranks: int = 2
    samples: int = 512  # the generated data set (no URL)
    sample_bytes: int = 16 * 1024
    samples_per_shard: int = 16
    batch_size: int = 8
    loader_workers: int = 2
    prefetch_factor: int = 2
    epochs: int = 3
    rounds: int = 2
    compute_s: float = 0.004
    store_rate_bps: float | None = 100e6  # the emulated link of a served directory; for a URL, the model's input
    store_latency_s: float = 0.002
    cache_share: float = 1.0  # disk cache budget per rank, as a share of the rank's 1/W of the data
    memory_share: float | None = None  # memory tier per loader worker, same unit (None: as cache_share)
    modes: tuple[str, ...] = MODES
    seed: int = 0
    timeout_s: float = 600.0
    calibration_steps: int = 40  # steps of each calibration (alone, beside workers): at start, before each mode's round
    network: str = "loopback"  # where a served directory is served: "loopback" (token bucket) or "cluster" (tc)
    rank_rate_bps: float = 10e9  # network="cluster": each rank host's link (the store's link is the one under test)


@dataclass
class ModeResult:
    mode: str
    epoch_step_s: list[list[float]] = field(default_factory=list)  # [round*epoch] -> per-step times (rank 0)
    epoch_wait_s: list[float] = field(default_factory=list)  # [round*epoch] -> rank 0's mean wait for a batch
    epoch_sync_s: list[float] = field(default_factory=list)  # [round*epoch] -> rank 0's mean all-reduce
    epoch_tiers: list[dict[str, int]] = field(default_factory=list)  # [round*epoch] -> all ranks' tier counts
    epoch_remote_bytes: list[int] = field(default_factory=list)  # [round*epoch], all ranks, from the server
    epoch_requests: list[int] = field(default_factory=list)
    calibrations: list[dict[str, Any]] = field(default_factory=list)  # [round] -> the calibration right before it


def budgets(cfg: DataBenchConfig, index: DatasetIndex) -> tuple[int, int]:
    """(disk cache bytes per rank, memory tier bytes per worker): shares of a rank's home shards."""
    shard_bytes = index.nbytes / len(index.shards)
    home = math.ceil(index.num_samples / cfg.ranks / (index.num_samples / len(index.shards))) * shard_bytes
    memory_share = cfg.cache_share if cfg.memory_share is None else cfg.memory_share
    return int(cfg.cache_share * home), int(memory_share * home)


def check_batches(cfg: DataBenchConfig, num_samples: int) -> None:
    """Each rank gets num_samples // ranks samples and drops a partial batch: it needs one full batch
    per epoch, or it has no step to time."""
    if num_samples // cfg.ranks < cfg.batch_size:
        raise CaramelError(f"--batch-size {cfg.batch_size}: each of the {cfg.ranks} ranks gets {num_samples // cfg.ranks} "
                           f"of the {num_samples} samples, less than one batch; expected a batch size <= "
                           f"{num_samples // cfg.ranks} (or fewer ranks, more samples)")


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
    out: dict[str, Any] = {"mode": mode, "round": rnd, "alone_s": _steps_alone(cfg, sync), "loaded": None}
    if _calibrates_loaded(cfg, shards):
        from caramel.bench.data_contention import mode_calibration_loader, steady_steps

        directory = f"{workdir}/calibration-{rnd}-{mode}"
        loader = None
        try:
            loader = mode_calibration_loader(mode, cfg, url, index, rank, shards, directory, budget, counters)
            out["loaded"] = steady_steps(loader, cfg.calibration_steps, cfg.compute_s, sync, probe_window)
        finally:
            _shut_down(loader)  # its workers gone before the mode's first step, or at once on an error
            del loader
            gc.collect()
            # the rank's two-shard cache goes now, not at the run's end: ranks x rounds x modes copies of shards
            shutil.rmtree(f"{directory}/rank{rank}", ignore_errors=True)
    return out


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
        if rank == 0:
            queue.put(("alone", _steps_alone(cfg, sync)))
        else:
            _steps_alone(cfg, sync)
        if _calibrates_loaded(cfg, shards):  # once, before the modes: the model with one calibration per run
            from caramel.bench.data_contention import decoded, loaded_steps

            loaded = loaded_steps(decoded(shards), cfg.batch_size, cfg.loader_workers, cfg.prefetch_factor,
                                  cfg.calibration_steps, cfg.compute_s, sync)
            gc.collect()  # its workers gone before the first mode
            if rank == 0:
                queue.put(("loaded", loaded))
        for rnd in range(cfg.rounds):
            for mode in cfg.modes:
                calibration = _mode_calibration(mode, cfg, url, index, rank, rnd, workdir, budget, shards,
                                                calibration_counters, sync, probe_window)
                if rank == 0 and calibration is not None:
                    queue.put(("calibration", calibration))
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


class _Inbox:
    """The ranks' messages, each tagged with its kind ("alone", "loaded", "calibration", "epoch"),
    taken by kind: each rank's queue feeder sends in the background, so rank 0's calibration
    before the next mode can arrive before another rank's last epoch message of this one."""

    def __init__(self, queue, procs, timeout_s: float):
        self.queue, self.procs, self.timeout_s = queue, procs, timeout_s
        self.early: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def get(self, kind: str):
        """The next message of `kind`; a rank that died meanwhile is an error at once, not after the timeout."""
        import queue as queues

        deadline = time.monotonic() + self.timeout_s
        while not self.early[kind]:
            try:
                tag, message = self.queue.get(timeout=1.0)
                self.early[tag].append(message)
            except queues.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"a rank process failed or stalled (exit codes {dead})") from None
        return self.early[kind].popleft()


def is_local(url: str) -> bool:
    """A directory on this machine (served behind the emulated link) rather than a remote store."""
    return "://" not in url or url.startswith("file://")


def run_data_bench(cfg: DataBenchConfig, url: str | None = None) -> dict[str, Any]:
    """Run every mode, every round, on the store at `url` (None: a generated data set); return the report."""
    from caramel.bench.data_contention import calibration_shards
    from caramel.bench.data_report import measure_local_costs, request_overhead_s, summarize

    for m in cfg.modes:
        if m not in MODES:
            raise CaramelError(f"data bench mode {m!r} is not one of {', '.join(MODES)}")
    if cfg.network not in ("loopback", "cluster"):
        raise CaramelError(f"data bench network {cfg.network!r}: expected loopback or cluster")
    if cfg.network == "cluster" and url is not None and not is_local(url):
        raise CaramelError(f"--network cluster serves a local directory from a host of the emulated cluster; "
                           f"{url!r} is a remote store, read as it is: give a directory (or file:// URL) or drop --network")
    if cfg.network == "cluster" and not cfg.store_rate_bps:
        raise CaramelError("--network cluster shapes the store's link with tc: give --store-rate (e.g. 100mbit)")
    workdir = Path(tempfile.mkdtemp(prefix="caramel-data-bench-"))
    try:
        with ExitStack() as stack:
            server, cluster, hosts, probe_url = None, None, None, None
            if cfg.network == "cluster":
                from caramel.bench.data_cluster import cluster_store

                directory = Path(url.removeprefix("file://")) if url else workdir / "data"
                if url is None:
                    check_batches(cfg, cfg.samples)
                    write_random_dataset(directory, cfg.samples, cfg.sample_bytes, cfg.samples_per_shard, cfg.seed)
                index = Store(str(directory)).index()
                overhead_s = request_overhead_s(str(directory))
                # no probe: the store's server runs on the cluster's store host, which a server here does not time
                cluster = stack.enter_context(cluster_store(str(directory.resolve()), cfg.ranks, cfg.store_rate_bps,
                                                            cfg.store_latency_s, cfg.rank_rate_bps,
                                                            workdir / "store-server.log"))
                data_url, hosts = cluster.url, cluster.rank_hosts
            elif url is None or is_local(url):
                directory = Path(url.removeprefix("file://")) if url else workdir / "data"
                if url is None:
                    check_batches(cfg, cfg.samples)
                    write_random_dataset(directory, cfg.samples, cfg.sample_bytes, cfg.samples_per_shard, cfg.seed)
                index = Store(str(directory)).index()  # a missing or damaged data set is named here, before serving
                overhead_s = request_overhead_s(str(directory))
                probe_url = stack.enter_context(serve_directory(directory)).url  # unshaped: the overhead under load
                server = stack.enter_context(serve_directory(directory, rate_bps=cfg.store_rate_bps,
                                                             latency_s=cfg.store_latency_s))
                data_url = server.url
            else:
                data_url, overhead_s = url, 0.0
                index = Store(url).index()
            check_batches(cfg, index.num_samples)
            # the local costs read one shard from the directory when the store's host is out of this one's reach
            costs = measure_local_costs(str(directory) if cluster else data_url, index, cfg.batch_size, str(workdir))
            costs["request_overhead_s"] = overhead_s
            budget = budgets(cfg, index)
            shards = calibration_shards(str(directory) if cluster else data_url, index)
            results, costs["compute_comm_s"], costs["loaded"] = _run_ranks(cfg, data_url, workdir, budget, server,
                                                                           hosts, shards, index, probe_url)
        report = summarize(cfg, results, index, costs, budget, source=url or "generated", served=server is not None)
        if cluster is not None:
            from caramel.bench.data_cluster import cluster_report
            report["cluster"] = cluster_report(cluster, results, cfg)
        return report
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_ranks(cfg: DataBenchConfig, url: str, workdir: Path, budget: tuple[int, int], server,
               hosts: list[tuple[str, str]] | None = None, shards: list | None = None,
               index: DatasetIndex | None = None,
               probe_url: str | None = None) -> tuple[dict[str, ModeResult], float | None, dict[str, float] | None]:
    """Each mode's results (with the calibration run right before each of its rounds), the median
    step of compute and all-reduce alone, and (with `shards` and loader workers) the same steps
    beside busy workers (`data_contention.loaded_steps`), both once before the modes. With
    `probe_url` (an unshaped server of the store's directory) each round's calibration also
    carries the range read's time inside the window rank 0 opens over its loaded, unscored steps
    (`data_overhead.OverheadProbe`)."""
    from caramel.bench.data_overhead import OverheadProbe, probed_calibration
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(cfg.ranks + 1, timeout=cfg.timeout_s), ctx.Queue()
    probing = cfg.calibration_steps > 0 and probe_url is not None and index is not None and _calibrates_loaded(cfg, shards)
    window = ctx.Event() if probing else None
    results = {m: ModeResult(m) for m in cfg.modes}
    procs = [ctx.Process(target=_rank_main, args=(r, cfg, url, str(workdir), budget, barrier, queue,
                                                  hosts[r] if hosts else None, shards, index,
                                                  window if r == 0 else None))
             for r in range(cfg.ranks)]
    for p in procs:
        p.start()
    compute_comm_s, loaded = None, None
    try:
        inbox = _Inbox(queue, procs, cfg.timeout_s)
        compute_comm_s = inbox.get("alone")
        if _calibrates_loaded(cfg, shards):
            loaded = inbox.get("loaded")
        for _rnd in range(cfg.rounds):
            for mode in cfg.modes:
                if probing:
                    with OverheadProbe(probe_url, index, gate=window) as probe:
                        calibration = inbox.get("calibration")
                    results[mode].calibrations.append(probed_calibration(calibration, probe))
                elif cfg.calibration_steps > 0:
                    results[mode].calibrations.append(inbox.get("calibration"))
                for _epoch in range(cfg.epochs):
                    barrier.wait()  # the ranks are ready and wait to be released (_run_epochs)
                    b0, q0 = (server.bytes_served, server.requests_served) if server else (0, 0)
                    barrier.wait()  # released
                    barrier.wait()  # the epoch ended
                    if server is not None:
                        results[mode].epoch_remote_bytes.append(server.bytes_served - b0)
                        results[mode].epoch_requests.append(server.requests_served - q0)
                    tiers: dict[str, int] = {}
                    for _ in range(cfg.ranks):
                        rank, counts, steps, wait_s, sync_s = inbox.get("epoch")
                        tiers = {k: tiers.get(k, 0) + v for k, v in counts.items()}
                        if rank == 0:
                            results[mode].epoch_step_s.append(steps)
                            results[mode].epoch_wait_s.append(wait_s)
                            results[mode].epoch_sync_s.append(sync_s)
                    results[mode].epoch_tiers.append(tiers)
                    if server is None:  # a store this bench does not run: what the ranks' workers counted
                        results[mode].epoch_remote_bytes.append(tiers["store_bytes"])
                        results[mode].epoch_requests.append(tiers["store_requests"])
    except threading.BrokenBarrierError:
        pass  # a rank failed; its exit code says so below
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"a rank process failed (exit codes {bad})")
    return results, compute_comm_s, loaded
