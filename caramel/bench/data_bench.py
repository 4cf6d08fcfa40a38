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
loader workers keep the CPUs) plus the all-reduce; each is timed (a rank's side: `data_bench_rank`). Modes:

- `remote`: torch's own `DataLoader` + `DistributedSampler` over the store, one range read per
  sample, no cache (what a user has without `caramel.data`);
- `cached`: `caramel.data`'s loader in DistributedSampler order, whole shards cached per rank;
- `locality`: `caramel.data`'s loader with the locality-aware sampler over the same cache.
"""
from __future__ import annotations

import collections
import math
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caramel.bench.calibration_window import WARMUP_STEPS, CalibrationWindow
from caramel.bench.data_bench_rank import _calibrates_loaded, _rank_main
from caramel.data.format import DatasetIndex, write_random_dataset
from caramel.data.serve import serve_directory
from caramel.data.store import Store
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
    calibration_seconds: float | None = None  # instead of calibration_steps: a window lasting this long alone
    calibration_sub_windows: int = 1  # the loaded step: the median of this many parts' means (1: the mean)
    network: str = "loopback"  # where a served directory is served: "loopback" (token bucket) or "cluster" (tc)
    rank_rate_bps: float = 10e9  # network="cluster": each rank host's link (the store's link is the one under test)

    def calibration_window(self) -> CalibrationWindow:
        """The calibrations' window as a checked option (`calibration_window.CalibrationWindow`)."""
        return CalibrationWindow(self.calibration_steps, self.calibration_seconds, self.calibration_sub_windows)


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
    # [round*epoch] -> every rank's mean wait and all-reduce, by rank: when rank 0's all-reduce grows,
    # whether another rank reached it later because its own batch came later (empty: not kept)
    epoch_wait_s_ranks: list[list[float]] = field(default_factory=list)
    epoch_sync_s_ranks: list[list[float]] = field(default_factory=list)


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


class _Inbox:
    """The ranks' messages, each tagged with its kind ("alone", "loaded", "calibration",
    "calibration_rank", "epoch"),
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
    if cfg.calibration_seconds is not None or cfg.calibration_sub_windows != 1 or cfg.calibration_steps > WARMUP_STEPS:
        # a bad window is one error here, before anything starts (0-2 steps alone, no window: as before)
        cfg.calibration_window().check_time(cfg.compute_s, cfg.timeout_s)
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
                if cfg.calibration_steps > 0:  # the other ranks' side of the same calibration
                    others = sorted((inbox.get("calibration_rank") for _ in range(cfg.ranks - 1)), key=lambda o: o["rank"])
                    results[mode].calibrations[-1] = dict(results[mode].calibrations[-1], other_ranks=others)
                for _epoch in range(cfg.epochs):
                    barrier.wait()  # the ranks are ready and wait to be released (_run_epochs)
                    b0, q0 = (server.bytes_served, server.requests_served) if server else (0, 0)
                    barrier.wait()  # released
                    barrier.wait()  # the epoch ended
                    if server is not None:
                        results[mode].epoch_remote_bytes.append(server.bytes_served - b0)
                        results[mode].epoch_requests.append(server.requests_served - q0)
                    tiers: dict[str, int] = {}
                    waits, syncs = [0.0] * cfg.ranks, [0.0] * cfg.ranks
                    for _ in range(cfg.ranks):
                        rank, counts, steps, wait_s, sync_s = inbox.get("epoch")
                        tiers = {k: tiers.get(k, 0) + v for k, v in counts.items()}
                        waits[rank], syncs[rank] = wait_s, sync_s
                        if rank == 0:
                            results[mode].epoch_step_s.append(steps)
                            results[mode].epoch_wait_s.append(wait_s)
                            results[mode].epoch_sync_s.append(sync_s)
                    results[mode].epoch_tiers.append(tiers)
                    results[mode].epoch_wait_s_ranks.append(waits)
                    results[mode].epoch_sync_s_ranks.append(syncs)
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
