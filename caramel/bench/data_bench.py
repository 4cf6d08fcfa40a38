"""The data-loading benchmark: plain remote reads, a shard cache, and the locality-aware
sampler, side by side on the same store, several epochs each.

W rank processes (gloo, one tiny all-reduce per step so ranks move in lockstep as data-parallel
training does) each run every mode in turn, each round; a barrier that the parent joins marks
every epoch, so the parent reads the server's byte counter per mode and epoch. A step is the
wait for the next batch plus `compute_s` of sleep standing in for the model (a sleep, so the
loader workers keep the CPUs). Modes:

- `remote`: DistributedSampler order, no cache, one range read per sample (a plain Dataset over remote files);
- `cached`: DistributedSampler order, whole shards cached per rank (LRU, `cache_share` of a rank's share of the data);
- `locality`: the locality-aware sampler over the same cache.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from caramel.data.format import write_dataset
from caramel.data.io_model import DataLoadModel
from caramel.data.loader import LoaderOptions, make_loader
from caramel.data.serve import serve_directory
from caramel.stats import median, paired_ratio_interval

MODES = ("remote", "cached", "locality")


@dataclass
class DataBenchConfig:
    ranks: int = 2
    samples: int = 512
    sample_bytes: int = 16 * 1024
    samples_per_shard: int = 16
    batch_size: int = 8
    loader_workers: int = 2
    epochs: int = 3
    rounds: int = 2
    compute_s: float = 0.004
    store_rate_bps: float = 100e6
    store_latency_s: float = 0.002
    cache_share: float = 1.0  # cache budget per rank, as a share of the rank's 1/W of the data
    modes: tuple[str, ...] = MODES
    seed: int = 0
    timeout_s: float = 600.0


@dataclass
class ModeResult:
    mode: str
    epoch_step_s: list[list[float]] = field(default_factory=list)  # [round*epoch] -> per-step times (rank 0)
    epoch_remote_bytes: list[int] = field(default_factory=list)  # [round*epoch], all ranks, from the server
    epoch_requests: list[int] = field(default_factory=list)


def _rank_main(rank: int, cfg: DataBenchConfig, url: str, workdir: str, barrier, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/pg", rank=rank, world_size=cfg.ranks,
                            timeout=__import__("datetime").timedelta(seconds=cfg.timeout_s))
    try:
        shard_bytes = cfg.samples_per_shard * _encoded_sample_bytes(cfg)
        budget = int(cfg.cache_share * math.ceil(cfg.samples / cfg.ranks / cfg.samples_per_shard) * shard_bytes)
        token = torch.zeros(1)
        for rnd in range(cfg.rounds):
            for mode in cfg.modes:
                cache_dir = None if mode == "remote" else f"{workdir}/cache-{rnd}-{mode}"
                opts = LoaderOptions(batch_size=cfg.batch_size, num_workers=cfg.loader_workers, cache_dir=cache_dir,
                                     cache_budget_bytes=budget, locality=(mode == "locality"), seed=cfg.seed + rnd,
                                     persistent_workers=cfg.loader_workers > 0)
                loader = make_loader(url, rank, cfg.ranks, opts)
                for epoch in range(cfg.epochs):
                    barrier.wait()
                    times, last = [], time.perf_counter()
                    for _batch in loader:
                        time.sleep(cfg.compute_s)
                        dist.all_reduce(token)
                        now = time.perf_counter()
                        times.append(now - last)
                        last = now
                    if rank == 0:
                        queue.put((rnd, mode, epoch, times))
                    barrier.wait()
                del loader
    except BaseException:
        barrier.abort()  # the parent and the other ranks stop waiting at once
        raise
    finally:
        dist.destroy_process_group()


def _encoded_sample_bytes(cfg: DataBenchConfig) -> int:
    from caramel.data.format import encode_sample

    return len(encode_sample((torch.zeros(cfg.sample_bytes, dtype=torch.uint8), torch.tensor(0))))


def _local_s_per_sample(directory: Path) -> float:
    """Read + decode time of one sample from a local shard (the model's local term), measured."""
    from caramel.data.format import decode_sample
    from caramel.data.store import Store

    store = Store(str(directory))
    info = store.index().shards[0]
    t0 = time.perf_counter()
    reps = 0
    while time.perf_counter() - t0 < 0.2:
        data = (directory / info.name).read_bytes()
        for p in range(info.num_samples):
            decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "bench")
        reps += info.num_samples
    return (time.perf_counter() - t0) / reps


def _request_overhead_s(directory: Path) -> float:
    """Median time of one range read from an unshaped server: the per-request CPU cost on this machine."""
    from caramel.data.store import Store

    with serve_directory(directory) as server:
        store = Store(server.url)
        info = store.index().shards[0]
        times = []
        for p in range(min(20, info.num_samples * 4)):
            t0 = time.perf_counter()
            store.read_sample_bytes(info, p % info.num_samples)
            times.append(time.perf_counter() - t0)
    return median(times)


def run_data_bench(cfg: DataBenchConfig) -> dict[str, Any]:
    """Run every mode, every round; return the records (JSON-ready)."""
    import torch.multiprocessing as mp

    for m in cfg.modes:
        assert m in MODES, m
    workdir = Path(tempfile.mkdtemp(prefix="caramel-data-bench-"))
    try:
        g = torch.Generator().manual_seed(cfg.seed)
        write_dataset(workdir / "data", ((torch.randint(0, 256, (cfg.sample_bytes,), dtype=torch.uint8, generator=g),
                                          torch.tensor(i)) for i in range(cfg.samples)), cfg.samples_per_shard)
        local_s = _local_s_per_sample(workdir / "data")
        overhead_s = _request_overhead_s(workdir / "data")
        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(cfg.ranks + 1, timeout=cfg.timeout_s), ctx.Queue()
        results = {m: ModeResult(m) for m in cfg.modes}
        with serve_directory(workdir / "data", rate_bps=cfg.store_rate_bps, latency_s=cfg.store_latency_s) as server:
            procs = [ctx.Process(target=_rank_main, args=(r, cfg, server.url, str(workdir), barrier, queue))
                     for r in range(cfg.ranks)]
            for p in procs:
                p.start()
            try:
                for _rnd in range(cfg.rounds):
                    for mode in cfg.modes:
                        for _epoch in range(cfg.epochs):
                            barrier.wait()
                            b0, q0 = server.bytes_served, server.requests_served
                            barrier.wait()
                            results[mode].epoch_remote_bytes.append(server.bytes_served - b0)
                            results[mode].epoch_requests.append(server.requests_served - q0)
                            results[mode].epoch_step_s.append(queue.get(timeout=cfg.timeout_s)[3])
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
        return _summarize(cfg, results, local_s, overhead_s, _encoded_sample_bytes(cfg))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _summarize(cfg: DataBenchConfig, results: dict[str, ModeResult], local_s: float, overhead_s: float,
               sample_bytes: int) -> dict[str, Any]:
    steady = {m: [i for i in range(len(r.epoch_step_s)) if i % cfg.epochs >= 1] for m, r in results.items()}
    needed = cfg.samples // cfg.ranks // cfg.batch_size * cfg.batch_size * cfg.ranks * sample_bytes  # per epoch
    rows = []
    base = results.get("remote")
    for mode, r in results.items():
        idx = steady[mode]
        epoch_means = [sum(r.epoch_step_s[i]) / len(r.epoch_step_s[i]) for i in idx]
        first = [sum(r.epoch_step_s[i]) / len(r.epoch_step_s[i]) for i in range(len(r.epoch_step_s)) if i % cfg.epochs == 0]
        remote = sum(r.epoch_remote_bytes[i] for i in idx) / max(len(idx), 1)
        hit = max(0.0, 1.0 - remote / needed)
        model = DataLoadModel(sample_bytes=sample_bytes, batch_size=cfg.batch_size, ranks=cfg.ranks,
                              store_bandwidth_bps=cfg.store_rate_bps, store_latency_s=cfg.store_latency_s, hit_rate=hit,
                              request_bytes=None if mode == "remote" else cfg.samples_per_shard * sample_bytes,
                              loader_workers=cfg.loader_workers, local_s_per_sample=local_s,
                              request_overhead_s=overhead_s)
        row = {"mode": mode, "step_s_epoch1": median(first), "step_s_steady": median(epoch_means),
               "epoch_means_steady_s": epoch_means, "remote_bytes_per_epoch_steady": remote,
               "remote_bytes_per_epoch_first": sum(r.epoch_remote_bytes[i] for i in range(len(r.epoch_step_s))
                                                   if i % cfg.epochs == 0) / cfg.rounds,
               "requests_per_epoch_steady": sum(r.epoch_requests[i] for i in idx) / max(len(idx), 1),
               "hit_rate_steady": hit, "predicted_step_s": model.step_time_s(cfg.compute_s),
               "predicted_data_s": model.data_time_s()}
        row["prediction_error"] = row["predicted_step_s"] / row["step_s_steady"] - 1.0
        if base is not None:
            ref = [sum(base.epoch_step_s[i]) / len(base.epoch_step_s[i]) for i in steady["remote"]]
            row["speedup_vs_remote"] = median(ref) / median(epoch_means)
            row["speedup_ci95"] = paired_ratio_interval(ref, epoch_means, per_round=1)
            row["remote_bytes_cut"] = 1.0 - remote / max(sum(base.epoch_remote_bytes[i] for i in steady["remote"])
                                                         / len(steady["remote"]), 1)
        rows.append(row)
    return {"format": "caramel.data-bench/1", "config": asdict(cfg), "local_s_per_sample": local_s, "request_overhead_s": overhead_s,
            "encoded_sample_bytes": sample_bytes, "data_bytes": sample_bytes * cfg.samples,
            "cpu_count": os.cpu_count(), "rows": rows}


def format_rows(report: dict[str, Any], markdown: bool = False) -> str:
    """The side-by-side table (terminal or markdown)."""
    head = ["mode", "epoch 1 ms", "epochs 2+ ms", "speedup", "95% interval", "remote MB/epoch", "hit rate",
            "bytes cut", "model ms", "model error"]
    lines = []
    for r in report["rows"]:
        ci = r.get("speedup_ci95")
        lines.append([r["mode"], f"{r['step_s_epoch1'] * 1e3:.1f}", f"{r['step_s_steady'] * 1e3:.1f}",
                      f"{r.get('speedup_vs_remote', float('nan')):.2f}x", f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-",
                      f"{r['remote_bytes_per_epoch_steady'] / 1e6:.2f}", f"{r['hit_rate_steady']:.0%}",
                      f"{r.get('remote_bytes_cut', 0.0):.0%}", f"{r['predicted_step_s'] * 1e3:.1f}",
                      f"{r['prediction_error']:+.0%}"])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(row) + " |" for row in lines])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [head] + lines)
