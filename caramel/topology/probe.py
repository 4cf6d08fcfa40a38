"""Fit a cluster's latency (alpha) and bandwidth (beta) from a sweep of real all-reduces.

`probe_cluster()` runs this module as a torchrun job on the cluster (`python -m
caramel.topology.probe --out FILE ...`): each rank all-reduces float32 tensors over a geometric
sweep of sizes, and rank 0 writes the fastest, median and mean time per size. `fit_alpha_beta()` then fits the
ring all-reduce model of DESIGN.md, t(S) = 2(n-1)·alpha + 2(n-1)/n · 8·S / B, by least squares
on relative error (every size counts, not only the largest), and returns a `ClusterSpec`. With
gloo, the job then times the same bytes as one all-reduce and as back-to-back pieces
(`measure_queued_extra`) for the spec's `queued_latency_s`, what a collective queued behind
another pays, and its `collective_cpu_s`, the pause each collective's CPU time costs a worker's
compute (that CPU time, times the ranks per core where ranks share cores: `host_core_share`;
the spec holds it for the job that probed, its ranks on its cores).

Each size is summarized by the mean over repetitions (of the slowest rank's time): the cost a
plan pays per collective on average. The fastest repetition would hide the host's wake-up
latency, which is part of every collective's cost: on a host whose idle CPUs halt, a fit of the
fastest times puts alpha far below what collectives really cost (docs/results/cluster.md,
"Probe"). The fit drops at most a third of the sizes as outliers when they sit far
off the line the others agree on; the fastest and median times are kept in `meta.probe`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError

if TYPE_CHECKING:
    from caramel.cluster.emulated import EmulatedCluster

MIN_BYTES = 4 * 1024
MAX_BYTES = 64 * 1024 * 1024
# the queued latency's probe (`measure_queued_extra`): pieces sent whole and one by one
QUEUED_PIECES = 16
QUEUED_REPS = 5
QUEUED_BACKLOG = 2  # a piece's transfer, in lone collectives' time
QUEUED_MIN_BYTES, QUEUED_MAX_BYTES = 64 * 1024, 4 * 1024 * 1024


@dataclass
class AlphaBetaFit:
    """The fitted model and how well it explains the measurements."""

    latency_s: float
    bandwidth_bps: float
    world_size: int
    sizes_bytes: list[int]
    times_s: list[float]
    max_rel_error: float  # over the sizes kept in the fit
    outliers: list[tuple[int, float]] = field(default_factory=list)  # (bytes, seconds) left out of the fit

    def predict_s(self, nbytes: float) -> float:
        n = self.world_size
        return 2 * (n - 1) * self.latency_s + 2 * (n - 1) / n * 8 * nbytes / self.bandwidth_bps


def fit_alpha_beta(sizes_bytes: list[int], times_s: list[float], world_size: int) -> AlphaBetaFit:
    """Weighted least squares of t = c0 + c1·S (weights 1/t), mapped to alpha and bandwidth, with outlier rejection.

    After each fit, the size with the largest relative residual is dropped if that residual is
    above 25% and above 3x the median residual, while more than two thirds of the sizes remain.
    """
    fit = _fit_once(sizes_bytes, times_s, world_size)
    keep = list(range(len(sizes_bytes)))
    while len(keep) - 1 >= max(3, math.ceil(2 * len(sizes_bytes) / 3)):
        errs = {i: abs(fit.predict_s(sizes_bytes[i]) - times_s[i]) / times_s[i] for i in keep}
        worst = max(keep, key=errs.__getitem__)
        median_err = statistics.median(errs.values())
        rest = [i for i in keep if i != worst]
        if errs[worst] <= max(0.25, 3 * median_err) or len({sizes_bytes[i] for i in rest}) < 2:
            break
        keep = rest
        fit = _fit_once([sizes_bytes[i] for i in keep], [times_s[i] for i in keep], world_size)
    fit.outliers = [(sizes_bytes[i], times_s[i]) for i in range(len(sizes_bytes)) if i not in keep]
    fit.sizes_bytes, fit.times_s = list(sizes_bytes), list(times_s)
    return fit


def _fit_once(sizes_bytes: list[int], times_s: list[float], world_size: int) -> AlphaBetaFit:
    if world_size < 2:
        raise CaramelError(f"probing needs at least 2 workers (all-reduce on one worker moves no bytes), got {world_size}")
    if len(sizes_bytes) != len(times_s) or len(set(sizes_bytes)) < 2:
        raise CaramelError("the probe needs times for at least two different sizes to fit latency and bandwidth")
    if any(not (math.isfinite(t) and t > 0) for t in times_s):
        raise CaramelError(f"probe times must be positive and finite, got {times_s}")
    w = [1.0 / t for t in times_s]  # relative error: small messages constrain alpha, large ones beta
    sw = sum(wi * wi for wi in w)
    sx = sum(wi * wi * s for wi, s in zip(w, sizes_bytes))
    sy = sum(wi * wi * t for wi, t in zip(w, times_s))
    sxx = sum(wi * wi * s * s for wi, s in zip(w, sizes_bytes))
    sxy = sum(wi * wi * s * t for wi, s, t in zip(w, sizes_bytes, times_s))
    det = sw * sxx - sx * sx
    c1 = (sw * sxy - sx * sy) / det
    c0 = (sy - c1 * sx) / sw
    if not c1 > 0:
        raise CaramelError("probe times do not grow with message size; cannot fit a bandwidth (is the network idle and shaped?)")
    if c0 < 0:  # latency below the noise: refit the slope through the origin
        c0 = 0.0
        c1 = sum(wi * wi * s * t for wi, s, t in zip(w, sizes_bytes, times_s)) / sxx
    n = world_size
    fit = AlphaBetaFit(latency_s=c0 / (2 * (n - 1)), bandwidth_bps=2 * (n - 1) / n * 8 / c1, world_size=n,
                       sizes_bytes=list(sizes_bytes), times_s=list(times_s), max_rel_error=0.0)
    fit.max_rel_error = max(abs(fit.predict_s(s) - t) / t for s, t in zip(sizes_bytes, times_s))
    return fit


def queued_piece_bytes(latency_s: float, bandwidth_bps: float, world_size: int) -> int | None:
    """Piece size for `measure_queued_extra`: about `QUEUED_BACKLOG` lone collectives' time at
    `bandwidth_bps`, so the link stays busy while the next piece is prepared (a multiple of 4,
    at most `QUEUED_MAX_BYTES`). None when even that takes less than one lone collective: the
    next piece's fixed cost would not fit behind it, and what each piece adds would overstate
    the queued latency."""
    lone_s = 2 * (max(world_size, 2) - 1) * latency_s
    want = max(QUEUED_BACKLOG * lone_s * bandwidth_bps / 8, QUEUED_MIN_BYTES)
    if want > QUEUED_MAX_BYTES and QUEUED_MAX_BYTES * 8 / bandwidth_bps < lone_s:
        return None
    return int(min(want, QUEUED_MAX_BYTES)) // 4 * 4


@dataclass(frozen=True)
class QueuedExtra:
    """What each extra back-to-back collective adds on one rank when the same bytes go as more pieces."""

    extra_s: float  # wall time (may be slightly negative: noise)
    cpu_s: float  # this process's CPU time: the backend's threads, the caller's, the kernel's on their behalf


def measure_queued_extra(group: Any, piece_bytes: int, pieces: int = QUEUED_PIECES, reps: int = QUEUED_REPS) -> QueuedExtra:
    """Seconds, of wall time and of this process's CPU time, each extra collective adds on this rank
    when `pieces` x `piece_bytes` go as back-to-back all-reduces instead of one (medians of `reps`
    paired tries).

    `group` is a gloo process group (its `allreduce([tensor])` returns a work). Every rank must
    call this with the same sizes, at the same point. With one backend thread (the engine's
    groups), a collective queued behind a large one costs this much more than its bytes: its
    fixed cost is mostly spent while the previous one's bytes drain (`ClusterSpec`). Its CPU
    cost is not hidden that way: it is `ClusterSpec.collective_cpu_s`.
    """
    import torch

    assert pieces >= 2 and reps >= 1 and piece_bytes >= 4
    numel = piece_bytes // 4
    whole = torch.zeros(numel * pieces)
    parts = list(whole.split(numel))

    def timed(bufs: list) -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        for w in [group.allreduce([b]) for b in bufs]:
            w.wait()
        return time.perf_counter() - t0, time.process_time() - c0

    extra, cpu = [], []
    for _ in range(reps):
        (one_s, one_cpu), (many_s, many_cpu) = timed([whole]), timed(parts)
        extra.append((many_s - one_s) / (pieces - 1))
        cpu.append((many_cpu - one_cpu) / (pieces - 1))
    return QueuedExtra(statistics.median(extra), statistics.median(cpu))


def host_core_share(group: Any = None) -> float:
    """Ranks per core where this job's ranks share cores, at least 1.

    Ranks share cores when they run under one kernel (the same boot id: the emulated cluster's
    namespaces all run on one host) on CPUs their affinities have in common. Each rank counts
    `1 / len(its cores)` on every core it may run on; the share is the most any core carries.
    Every rank of `group` must call this at the same point (one all-gather); all get the same
    value. Not seen: CPU quotas (a container's `--cpus`), which leave the affinity whole.

    Why: `ClusterSpec.collective_cpu_s` is the pause a collective's start costs a running
    compute. Measured as this process's CPU time it is that pause only while each rank has a
    core of its own. Ranks sharing saturated cores all wait for the CPU any of them spends: a
    collective's CPU time on each of 4 workers is 4 times that taken from 2 cores, 2 times it
    from every worker's time. (Intra-op threads do not change this: a rank's threads wait for
    the slowest of them, and the CPU still comes out of the same cores.)"""
    import torch.distributed as dist

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            host = f.read().strip()
    except OSError:
        import socket
        host = socket.gethostname()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    mine = (host, tuple(cores))
    everyone = [mine]
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
    return core_share(everyone)


def core_share(ranks: list[tuple[str, tuple[int, ...]]]) -> float:
    """`host_core_share` from every rank's (host, cores it may run on)."""
    load: dict[tuple[str, int], float] = {}
    for host, cores in ranks:
        for c in cores:
            load[(host, c)] = load.get((host, c), 0.0) + 1.0 / len(cores)
    return max([1.0] + list(load.values()))


def queued_latency_from_extra_s(extra_s: float, latency_s: float, world_size: int) -> float:
    """Per-message queued latency from `measure_queued_extra` (all 2(n-1) ring steps), within [0, latency_s]."""
    return min(max(extra_s / (2 * (max(world_size, 2) - 1)), 0.0), latency_s)


def default_sizes(bandwidth_bps: float, world_size: int, points: int = 8, largest_s: float = 0.08) -> list[int]:
    """Geometric sizes from 4 KiB up to what takes about `largest_s` on the nominal link."""
    n = max(world_size, 2)
    top = largest_s * bandwidth_bps / 8 / (2 * (n - 1) / n)
    top = int(min(MAX_BYTES, max(16 * MIN_BYTES, top)))
    ratio = (top / MIN_BYTES) ** (1 / (points - 1))
    sizes = sorted({int(MIN_BYTES * ratio**k) // 4 * 4 for k in range(points)})
    return sizes


def probe_cluster(cluster: "EmulatedCluster", sizes_bytes: list[int] | None = None, reps: int = 5,
                  nproc_per_node: int = 1, timeout_s: float = 300.0, out=None) -> tuple[ClusterSpec, AlphaBetaFit]:
    """Measure all-reduce times on a started cluster and fit a ClusterSpec (workers = world size)."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise CaramelError(f"reps must be a positive integer, got {reps!r}")
    world = cluster.workers * nproc_per_node
    if world < 2:
        raise CaramelError(f"probing needs at least 2 workers in total, got {world}")
    nominal = min(cluster.bandwidth_bps)
    sizes = sorted(set(sizes_bytes)) if sizes_bytes else default_sizes(nominal, world)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 4 for s in sizes):
        raise CaramelError(f"probe sizes must be integers of at least 4 bytes, got {sizes}")
    with tempfile.TemporaryDirectory(prefix="caramel-probe-") as tmp:
        result_path = os.path.join(tmp, "probe.json")
        cmd = [sys.executable, "-m", "caramel.topology.probe", "--out", result_path, "--reps", str(reps),
               "--sizes", ",".join(str(s) for s in sizes)]
        rc = cluster.run(cmd, nproc_per_node=nproc_per_node, timeout_s=timeout_s, out=out)
        if rc != 0 or not os.path.exists(result_path):
            raise CaramelError(f"the probe job failed (exit code {rc}); see the worker output above")
        with open(result_path) as f:
            measured = json.load(f)
    return spec_from_measured(measured, {"source": "caramel cluster probe", "cluster": cluster.info(),
                                         "nominal_bandwidth_bps": nominal}, reps)


def spec_from_measured(measured: dict[str, Any], meta: dict[str, Any], reps: int) -> tuple[ClusterSpec, AlphaBetaFit]:
    """The ClusterSpec fitted to `measure_in_job`'s results (`meta` joins the spec's meta)."""
    world = measured["world_size"]
    fit = fit_alpha_beta(measured["sizes_bytes"], measured["mean_times_s"], world)
    meta = {**meta,
            "probe": {"sizes_bytes": fit.sizes_bytes, "times_s": fit.times_s, "summary": "mean", "reps": reps,
                      "fastest_times_s": measured["times_s"],
                      "median_times_s": measured["median_times_s"], "outliers": fit.outliers,
                      "max_rel_error": fit.max_rel_error, "backend": measured.get("backend")}}
    queued_s, cpu_s = None, 0.0
    if "queued_extra_s" in measured:
        queued_s = queued_latency_from_extra_s(measured["queued_extra_s"], fit.latency_s, world)
        # the pause on a compute: the CPU time, times the ranks each shared core carries
        cpu_s = max(measured.get("queued_cpu_s", 0.0), 0.0) * measured.get("core_share", 1.0)
        meta["probe"]["queued"] = {k: measured[k] for k in ("queued_extra_s", "queued_cpu_s", "queued_piece_bytes",
                                                             "queued_pieces", "queued_sized_for_latency_s", "core_share")
                                   if k in measured}
    spec = ClusterSpec.uniform(world, fit.bandwidth_bps, fit.latency_s, meta=meta, queued_latency_s=queued_s,
                               collective_cpu_s=cpu_s)
    return spec, fit


def measure_in_job(sizes: list[int], reps: int, warmup: int, device: Any, backend: str) -> dict[str, Any]:
    """Time all-reduces of `sizes` bytes on the default group (every rank calls this at the same
    point; every rank returns the same numbers: the slowest rank's time per repetition), and with
    gloo what a queued collective adds (`measure_queued_extra`). `spec_from_measured` fits them."""
    import torch
    import torch.distributed as dist

    fastest, medians, means, actual = [], [], [], []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        samples = []
        for k in range(warmup + reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if k >= warmup:
                samples.append(time.perf_counter() - t0)
        # the slowest rank's time is the collective's time
        local = torch.tensor(samples, dtype=torch.float64, device=device)
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        slowest = local.cpu().tolist()
        fastest.append(min(slowest))
        medians.append(statistics.median(slowest))
        means.append(statistics.fmean(slowest))
        actual.append(t.numel() * 4)
    queued: dict[str, Any] = {}
    if backend == "gloo":
        # every rank holds the same (slowest-rank) means, so every rank fits and sizes the pieces
        # alike (a failed fit skips the measurement on every rank; the caller reports the fit's
        # error); on a one-thread group like the engine's, whose collectives run in issue order
        from caramel.distributed import gloo_group

        # pieces sized from the larger of the fitted latency and the smallest size's mean time:
        # a fit that puts alpha too low makes pieces too short to hide the next one's fixed
        # cost behind, and what each adds then overstates the queued latency
        # (docs/results/notes.md, "Probe piece size")
        n = dist.get_world_size()
        try:
            fit = fit_alpha_beta(actual, means, n)
            smallest_s = means[actual.index(min(actual))]
            sized_for_s = max(fit.latency_s, smallest_s / (2 * (n - 1)))
            piece = queued_piece_bytes(sized_for_s, fit.bandwidth_bps, n)
        except CaramelError:
            piece = None
        if piece is not None:
            group = gloo_group("probe-queued", threads=1)
            m = measure_queued_extra(group, piece)
            extra = torch.tensor([m.extra_s, m.cpu_s], dtype=torch.float64)
            dist.all_reduce(extra, op=dist.ReduceOp.MAX)
            queued = {"queued_extra_s": float(extra[0]), "queued_cpu_s": float(extra[1]), "queued_piece_bytes": piece,
                      "queued_pieces": QUEUED_PIECES, "queued_sized_for_latency_s": sized_for_s,
                      "core_share": host_core_share()}
    return {"world_size": dist.get_world_size(), "backend": backend, "sizes_bytes": actual, "times_s": fastest,
            "median_times_s": medians, "mean_times_s": means, **queued}


def _worker_main(argv: list[str]) -> int:
    """Runs on every rank under torchrun: time all-reduces; rank 0 writes the fastest, median and mean times."""
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m caramel.topology.probe")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from caramel.distributed import init_distributed

    info = init_distributed(timeout_s=120)
    measured = measure_in_job(sizes, args.reps, args.warmup, torch.device(info.device), info.backend)
    if dist.get_rank() == 0:
        from caramel.jsonio import atomic_write_text
        atomic_write_text(args.out, json.dumps(measured))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
