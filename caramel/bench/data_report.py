"""The data bench's report: the measured inputs of the I/O model, the per-mode summary (step
time and its parts, speedup with its interval, remote bytes, hit rate by tier, the model's
prediction) and the table."""
from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from typing import Any

import torch

from caramel.bench.data_contention import (alone_floor_s, contention_factor, epoch_start_excess_s, round_epoch_starts,
                                           round_inputs)
from caramel.bench.data_overhead import round_overheads, round_read_spreads
from caramel.data.cache import ShardCache
from caramel.data.format import DatasetIndex, decode_sample
from caramel.data.io_model import DataLoadModel
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.data.transport import PIPE_MAX_BYTES, WorkerCollate, received
from caramel.errors import CaramelError
from caramel.stats import median, paired_ratio_interval

# /5: the read under load is `request_s_under_load` in each calibration, timed only inside rank 0's
# window over its first, unscored loaded pass (`request_s_under_load_reads`: 0 when none finished
# there, the term off for that round), charged to range reads only (the plain loader: not to the
# shard fetches of cached and locality), and not measured with --network cluster
# (`request_probe` says so). In /4 records the calibrations' `request_overhead_s` is the read over
# the whole calibration, charged to every mode's worker sequence (in the first /4 run, 6cf7612's,
# the store's serial overhead: see docs/results/data-bench-data-side.md).
# /4: each round's calibration carries `request_overhead_s`, the range read timed under its load
# (data_overhead), charged to each read in its worker's sequence for that round (rows:
# `request_s_under_load`, the rounds' median, and *_overhead_alone, the model without it, as in /3).
# /3: predicted_step_s and prediction_error are the median of each round's prediction from the
# calibration right before it (the one calibration before the modes moved to *_one_calibration)
# and each row has its own contention; in /2 they were the one calibration's, one factor per run
REPORT_FORMAT = "caramel.data-bench/7"  # /7: every rank's wait and all-reduce; /6 and before load as they are


def measure_local_costs(url: str, index: DatasetIndex, batch_size: int, workdir: str) -> dict[str, float]:
    """The model's local inputs, each measured on its own on this machine: decoding one sample
    from memory, reading one shard back from the disk cache (checksum included), and one batch's
    collate and trip from a loader worker to this process, by pipe and by shared memory."""
    info = index.shards[0]
    data = Store(url).read_shard(info)
    samples = [decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "bench") for p in range(info.num_samples)]
    t0, reps = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        for p in range(info.num_samples):
            decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "bench")
        reps += info.num_samples
    decode_s = (time.perf_counter() - t0) / reps
    cache = ShardCache(os.path.join(workdir, "measure-cache"), info.nbytes)
    cache.put(info, data)
    t0, reads = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        cache.get(info)
        reads += 1
    disk_s = (time.perf_counter() - t0) / reads
    return {"local_s_per_sample": decode_s, "disk_s_per_read": disk_s,
            "batch_s_pipe": _batch_trip_s(samples, batch_size, WorkerCollate()),
            "batch_s_shared": _batch_trip_s(samples, batch_size, None)}


def _batch_trip_s(samples: list, batch_size: int, collate) -> float:
    """Seconds per batch through a one-worker DataLoader over samples already decoded in memory."""
    batches = 60
    items = [samples[i % len(samples)] for i in range(batches * batch_size)]
    kwargs = {"collate_fn": collate} if collate is not None else {}
    loader = torch.utils.data.DataLoader(items, batch_size=batch_size, num_workers=1, persistent_workers=True,
                                         multiprocessing_context="fork", **kwargs)
    for _ in loader:  # the first pass starts the worker
        pass
    t0 = time.perf_counter()
    for b in loader:
        received(b)
    return (time.perf_counter() - t0) / batches


def request_overhead_s(directory: str) -> float:
    """Median time of one range read from an unshaped server: the per-request CPU cost on this machine."""
    with serve_directory(directory) as server:
        store = Store(server.url)
        info = store.index().shards[0]
        times = []
        for p in range(min(20, info.num_samples * 4)):
            t0 = time.perf_counter()
            store.read_sample_bytes(info, p % info.num_samples)
            times.append(time.perf_counter() - t0)
    return median(times)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def predict(cfg, mode: str, index: DatasetIndex, costs: dict[str, float], hit: float, memory_hit: float,
            samples_per_disk_read: float = 1.0, amplification: float = 1.0, contention: float = 1.0,
            byte_hit_rate: float = 0.0, cpu_count: int | None = None) -> DataLoadModel:
    """The I/O model of one mode: its measured hit rates by tier and the costs measured on their own.
    `cpu_count` is the cores of the host that ran the bench (this host's when None): a replay
    predicts with the recording host's, since the workers' local work shares its cores.
    The plain loader's batches travel by shared memory, caramel.data's small ones by pipe. The
    locality sampler reads the cached shards first, so its epoch's misses (1 - the byte hit rate
    of its steps) come last; the other modes spread them over the epoch. Every mode's epoch
    starts its loader empty (`epoch_steps`)."""
    shard_bytes = index.nbytes / len(index.shards)
    return DataLoadModel(sample_bytes=index.nbytes / index.num_samples, batch_size=cfg.batch_size, ranks=cfg.ranks,
                         store_bandwidth_bps=cfg.store_rate_bps or 1e12, store_latency_s=cfg.store_latency_s,
                         hit_rate=min(hit, 1.0), memory_hit_rate=min(memory_hit, hit, 1.0),
                         request_bytes=None if mode == "remote" else shard_bytes,
                         loader_workers=cfg.loader_workers, local_s_per_sample=costs["local_s_per_sample"],
                         request_overhead_s=costs["request_overhead_s"], disk_s_per_read=costs["disk_s_per_read"],
                         batch_overhead_s=batch_trip_s(cfg, mode, index, costs),
                         samples_per_disk_read=max(samples_per_disk_read, 1.0), fetch_amplification=max(amplification, 1.0),
                         cores_per_rank=max((cpu_count or os.cpu_count() or 1) / cfg.ranks, 1.0), contention=contention,
                         remote_steps_share=max(1.0 - byte_hit_rate, 1e-9) if mode == "locality" else 1.0,
                         epoch_steps=epoch_steps(cfg, index))


def epoch_steps(cfg, index: DatasetIndex) -> int:
    """Steps of one of the bench's epochs: each starts its loader empty (a new iterator after the
    ranks' barrier), so the model charges its edge over these."""
    return max(index.num_samples // cfg.ranks // cfg.batch_size, 1)


def batch_trip_s(cfg, mode: str, index: DatasetIndex, costs: dict[str, Any]) -> float:
    """One batch's trip alone by the mode's transport: the plain loader's by shared memory,
    caramel.data's small batches by pipe."""
    pipe = mode != "remote" and cfg.batch_size * index.nbytes / index.num_samples <= PIPE_MAX_BYTES
    return costs["batch_s_pipe"] if pipe else costs["batch_s_shared"]


def round_models(model: DataLoadModel, calibrations: list[dict[str, Any]],
                 rounds: list[tuple[float, float]], read_spreads: bool = False) -> list[tuple[DataLoadModel, float]]:
    """Each round's model and its compute + all-reduce alone: `model` with the round's contention
    (`rounds`, from `round_inputs`), its read time under load (range reads only: the probe times
    one sample's read, not a whole shard's fetch; 0 where a round had no probe read) and its
    measured restart of a warm loader (0 in records before it). The one place the bench and its
    replay (experiments/data_model_repredict.py) charge a round's terms. With `read_spreads` the
    reads' mean and SCV where the probe kept them (`round_read_spreads`; the link queue scaled by
    their spread): not the default, as the fresh runs did not support it (docs/data.md, "The
    knee's queue")."""
    if model.request_bytes is not None:
        reads: list[tuple[float, float | None]] = [(0.0, None)] * len(calibrations)
    elif read_spreads:
        reads = round_read_spreads(calibrations)
    else:
        reads = [(o, None) for o in round_overheads(calibrations)]
    starts = round_epoch_starts(calibrations)
    return [(replace(model, contention=c, worker_request_s=o, worker_request_scv=v, epoch_start_s=e), a)
            for (c, a), (o, v), e in zip(rounds, reads, starts)]


def measured_contention(cfg, index: DatasetIndex, costs: dict[str, Any]) -> float:
    """The contention factor of the one calibration before the modes (torch's DataLoader over
    samples in memory): its step against compute + all-reduce alone plus the batch's trip alone by
    the transport it used. The model with one calibration per run, reported beside each mode's own."""
    loaded = costs.get("loaded")
    if not loaded:
        return 1.0
    pipe = cfg.batch_size * index.nbytes / index.num_samples <= PIPE_MAX_BYTES
    return contention_factor(loaded["step_s"], costs.get("compute_comm_s"),
                             costs["batch_s_pipe"] if pipe else costs["batch_s_shared"])


def _by_rank(per_epoch: list[list[float]], steady: list[int]) -> list[float] | None:
    """Each rank's median over the `steady` epochs of `per_epoch` ([epoch][rank]); None when not kept."""
    if not per_epoch:
        return None
    return [median([per_epoch[i][k] for i in steady]) for k in range(len(per_epoch[0]))]


def summarize(cfg, results: dict[str, Any], index: DatasetIndex, costs: dict[str, float],
              budget: tuple[int, int], source: str, served: bool) -> dict[str, Any]:
    sample_bytes = index.nbytes / index.num_samples
    per_epoch = len(next(iter(results.values())).epoch_step_s)
    steady = [i for i in range(per_epoch) if i % cfg.epochs >= 1]
    first = [i for i in range(per_epoch) if i % cfg.epochs == 0]
    samples_per_epoch = index.num_samples // cfg.ranks // cfg.batch_size * cfg.batch_size * cfg.ranks
    rows = []
    single = measured_contention(cfg, index, costs)
    floor = alone_floor_s(costs.get("compute_comm_s"), [c for r in results.values() for c in r.calibrations])
    base = results.get("remote")
    ref = [_mean(base.epoch_step_s[i]) for i in steady] if base is not None else None
    for mode, r in results.items():
        epoch_means = [_mean(r.epoch_step_s[i]) for i in steady]
        remote = _mean([r.epoch_remote_bytes[i] for i in steady])
        tiers = {k: _mean([r.epoch_tiers[i][k] for i in steady]) for k in r.epoch_tiers[0]}
        # by bytes, as the store sees it (a shard fetched this epoch and then served from memory is no hit)
        hit = max(0.0, 1.0 - remote / (samples_per_epoch * sample_bytes))
        memory_share = tiers["memory_hits"] / samples_per_epoch
        per_read = tiers["disk_hits"] / tiers["disk_reads"] if tiers.get("disk_reads") else 1.0
        # the model takes the samples' hit rate and how many bytes each missed sample cost the store
        sample_hit = 1.0 - tiers["misses"] / samples_per_epoch
        amplification = remote / (tiers["misses"] * sample_bytes) if tiers["misses"] else 1.0
        model = predict(cfg, mode, index, costs, min(max(sample_hit, 0.0), 1.0), min(memory_share, max(sample_hit, 0.0)),
                        per_read, amplification, single, hit)
        compute_comm_start = costs["compute_comm_s"] if costs.get("compute_comm_s") is not None else cfg.compute_s
        # each round predicted with the factor of the calibration right before it (against the run's
        # floor of steps alone), the mode's step the median over rounds; without them, the one calibration
        rounds = round_inputs(r.calibrations, batch_trip_s(cfg, mode, index, costs), floor if floor else cfg.compute_s)
        if not any(c.get("loaded") for c in r.calibrations):
            rounds = [(single, a) for _, a in rounds]
        models = round_models(model, r.calibrations, rounds)
        per_round = [m.step_time_s(a) for m, a in models]
        # the model without the read under load: each round's other terms kept
        overhead_alone = [replace(m, worker_request_s=model.worker_request_s).step_time_s(a) for m, a in models]
        probed = [c["request_s_under_load"] for c in r.calibrations if c.get("request_s_under_load") is not None]
        one_calibration = model  # one calibration per run, before the modes: the model before the rounds' own
        alone = replace(model, contention=1.0, remote_steps_share=1.0)  # the model before both terms, for comparison
        row = {"mode": mode, "step_s_epoch1": median([_mean(r.epoch_step_s[i]) for i in first]),
               "step_s_steady": median(epoch_means), "epoch_means_steady_s": epoch_means,
               # rank 0's every step, per epoch of every round: where in an epoch the time goes (its start)
               "epoch_step_s": r.epoch_step_s,
               "wait_s_steady": median([r.epoch_wait_s[i] for i in steady]),
               "sync_s_steady": median([r.epoch_sync_s[i] for i in steady]),
               # every rank's, by rank (rank 0's as above): which rank reached the all-reduce late
               "wait_s_steady_ranks": _by_rank(r.epoch_wait_s_ranks, steady),
               "sync_s_steady_ranks": _by_rank(r.epoch_sync_s_ranks, steady),
               "remote_bytes_per_epoch_steady": remote,
               "remote_bytes_per_epoch_first": _mean([r.epoch_remote_bytes[i] for i in first]),
               "requests_per_epoch_steady": _mean([r.epoch_requests[i] for i in steady]),
               "tiers_per_epoch_steady": tiers, "hit_rate_steady": hit,
               "memory_share_steady": memory_share, "samples_per_disk_read": per_read,
               "sample_hit_rate_steady": sample_hit, "fetch_amplification": amplification,
               "predicted_step_s": median(per_round) if per_round else model.step_time_s(compute_comm_start),
               "predicted_step_s_rounds": per_round,
               # each round's warm-loader restart the model takes (`epoch_start_excess_s`, 0: not timed),
               # the value `caramel simulate --data-epoch-start` takes
               "epoch_start_s_rounds": [m.epoch_start_s for m, _ in models], "predicted_data_s": model.data_time_s(),
               "request_s_under_load": median(probed) if probed else None,
               "request_s_under_load_charged": model.request_bytes is None and bool(probed),
               "rounds_without_probe_reads": sum(1 for c in r.calibrations if c.get("request_s_under_load_reads") == 0),
               "predicted_step_s_overhead_alone": median(overhead_alone) if overhead_alone else None,
               "predicted_step_s_before": alone.step_time_s(compute_comm_start),
               "predicted_step_s_one_calibration": one_calibration.step_time_s(compute_comm_start),
               "contention": median([c for c, _ in rounds]) if rounds else single,
               "compute_comm_s": median([a for _, a in rounds]) if rounds else compute_comm_start,
               "calibrations": r.calibrations}
        row["prediction_error"] = row["predicted_step_s"] / row["step_s_steady"] - 1.0
        row["prediction_error_one_calibration"] = row["predicted_step_s_one_calibration"] / row["step_s_steady"] - 1.0
        row["prediction_error_before"] = row["predicted_step_s_before"] / row["step_s_steady"] - 1.0
        if row["predicted_step_s_overhead_alone"] is not None:
            row["prediction_error_overhead_alone"] = row["predicted_step_s_overhead_alone"] / row["step_s_steady"] - 1.0
        if ref is not None:
            row["speedup_vs_remote"] = median(ref) / median(epoch_means)
            row["speedup_ci95"] = paired_ratio_interval(ref, epoch_means, per_round=1)
            base_remote = _mean([base.epoch_remote_bytes[i] for i in steady])
            row["remote_bytes_cut"] = 1.0 - remote / max(base_remote, 1)
        rows.append(row)
    return {"format": REPORT_FORMAT, "config": asdict(cfg), "source": source,
            "remote_bytes_from": "server" if served else "loader workers' counters",
            "measured_costs": costs, "contention": single, "compute_comm_floor_s": floor,
            "local_s_per_sample": costs["local_s_per_sample"],
            "request_overhead_s": costs["request_overhead_s"],
            "request_probe": ("off: with --network cluster the store's server runs on the cluster's store host, "
                              "which the bench's probe cannot time; the read-under-load term is 0"
                              if cfg.network == "cluster" else "rank 0's first, unscored loaded pass"),
            "encoded_sample_bytes": sample_bytes, "data_bytes": index.nbytes, "num_samples": index.num_samples,
            "cache_budget_bytes_per_rank": budget[0], "memory_budget_bytes_per_worker": budget[1],
            "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows}


def stored_records(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data-bench records of a results file by name: a record itself ("" its name), or a
    `caramel.data-bench-runs/1` container, whose runs (a list or a dict by name) are records or
    hold one under "record" beside their command and notes."""
    if "rows" in document:
        return {"": document}
    runs = document.get("runs")
    if not isinstance(runs, (list, dict)):
        raise CaramelError(f"not a data-bench record nor a runs container (format {document.get('format')!r}): "
                           f"expected 'rows' or 'runs'")
    named = runs.items() if isinstance(runs, dict) else ((str(k), run) for k, run in enumerate(runs))
    return {name: run.get("record", run) for name, run in named}


def stored_records_of(paths: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every data-bench record of the results files at `paths` (`stored_records`), named by where it
    is: `path` for a record file, `path:name` for a run of a runs container."""
    for path in paths:
        with open(path) as f:
            named = stored_records(json.load(f))
        for name, record in named.items():
            yield (f"{path}:{name}" if name else path), record


def _cell(row: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    """`row[key]` times `scale` in `fmt`; "-" when the row (a record of an older format) lacks it."""
    return "-" if row.get(key) is None else fmt.format(row[key] * scale)


def _contention_cell(row: dict[str, Any], report: dict[str, Any]) -> str:
    """A row's contention, else the run's (a /2 record's one factor), else "-" (records before the term)."""
    factor = row.get("contention", report.get("contention"))
    return "-" if factor is None else f"x{factor:.2f}"


def _restart_cell(row: dict[str, Any]) -> str:
    """The rounds' median warm-loader restart the model takes, in ms (from the calibrations in
    records before `epoch_start_s_rounds`); "-" where no calibration timed one."""
    timed = [e for e in (epoch_start_excess_s(c.get("loaded")) for c in row.get("calibrations", [])) if e is not None]
    return f"{median(timed) * 1e3:.1f}" if timed else "-"


def format_rows(report: dict[str, Any], markdown: bool = False) -> str:
    """The side-by-side table (terminal or markdown) of a /5 record or an older one; "model error"
    is the model with each mode's calibrations (in a /2 record: the one calibration before the
    modes), "request ms" the rounds' median read time under load (/4 and /5), "restart ms" their
    median epoch start of a warm loader beyond its steady steps (`--data-epoch-start` of caramel
    simulate; records since the restart was timed), "overhead alone" the
    model without it (each read's work only the store's overhead measured alone), "one calib." with the one calibration
    before the modes, "before" without its contention and misses-last terms; a field a record
    lacks is "-"."""
    head = ["mode", "epoch 1 ms", "epochs 2+ ms", "wait ms", "sync ms", "speedup", "95% interval",
            "remote MB/epoch", "hit rate", "from memory", "bytes cut", "contention", "request ms", "restart ms",
            "model ms",
            "model error", "overhead alone", "one calib.", "before"]
    lines = []
    for r in report["rows"]:
        ci = r.get("speedup_ci95")
        ms = functools.partial(_cell, r, fmt="{:.1f}", scale=1e3)
        lines.append([r["mode"], ms("step_s_epoch1"), ms("step_s_steady"), ms("wait_s_steady"), ms("sync_s_steady"),
                      f"{r.get('speedup_vs_remote', float('nan')):.2f}x", f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-",
                      _cell(r, "remote_bytes_per_epoch_steady", "{:.2f}", 1e-6),
                      _cell(r, "hit_rate_steady", "{:.0%}"), _cell(r, "memory_share_steady", "{:.0%}"),
                      f"{r.get('remote_bytes_cut', 0.0):.0%}", _contention_cell(r, report),
                      _cell(r, "request_s_under_load", "{:.2f}", 1e3), _restart_cell(r), ms("predicted_step_s"),
                      _cell(r, "prediction_error", "{:+.0%}"), _cell(r, "prediction_error_overhead_alone", "{:+.0%}"),
                      _cell(r, "prediction_error_one_calibration", "{:+.0%}"),
                      _cell(r, "prediction_error_before", "{:+.0%}")])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(row) + " |" for row in lines])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [head] + lines)
