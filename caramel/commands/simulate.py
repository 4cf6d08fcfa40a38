"""`caramel simulate`: predict step time for planners side by side on a (possibly imaginary) cluster.

    caramel simulate --profile P.json --workers 64 --bandwidth 10gbit --planner fifo,caramel --json OUT

Each (planner or plan file) x overlap mode is one record: the plan is made for the cluster and
simulated; the table shows step time, compute, communication, exposed communication and the
lower bound any schedule could reach. `--json OUT` writes `caramel.simulation/1` with the records;
`--trace-dir DIR` writes each record's predicted timeline (`caramel.trace/1`).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.plan.plan import OVERLAPS, Plan
from caramel.strategies import STRATEGIES
from caramel.strategies.planners import make_plan
from caramel.sim.bounds import lower_bound
from caramel.commands.common import (add_cluster_arguments, add_option_argument, add_profile_arguments,
                                    cluster_from_args, load_profile, parse_options)
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import simulate
from caramel.units import format_bytes, format_rate, parse_duration_arg_s, parse_rate_bps, parse_size_bytes

KIND = "simulation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_profile_arguments(parser)
    add_cluster_arguments(parser)
    parser.add_argument("--planner", default=None,
                        help="comma-separated planners to compare (default fifo,fusion,caramel without --strategy)")
    parser.add_argument("--strategy", action="append", default=[], metavar="NAME[:key=value,...]",
                        help="simulate a strategy with its options, as parallelize runs it (repeatable; e.g. ddp, "
                             "caramel:overlap=forward); with --strategy, --planner runs only when given")
    parser.add_argument("--plan", action="append", default=[], metavar="PLAN.json",
                        help="also simulate this plan file as is (repeatable)")
    parser.add_argument("--overlap", default="forward",
                        help=f"comma-separated overlap modes: {', '.join(OVERLAPS)} (default forward)")
    parser.add_argument("--iterations", type=int, default=4, help="steps to unroll (default 4)")
    parser.add_argument("--comm-model", choices=("message", "closed"), default="message",
                        help="collectives as message-level steps with link sharing, or closed forms")
    parser.add_argument("--compute-slowdown", type=float, default=None, metavar="F",
                        help="compute runs F times slower while a collective is in flight (CPU contention; "
                             "default: the cluster spec's compute_slowdown, 1 unless it says)")
    add_option_argument(parser)
    data = parser.add_argument_group("data loading (caramel.data.io_model; --data-sample-bytes turns it on, and "
                                     "the other --data-* flags need it; times with their unit: s, ms or us)")
    data.add_argument("--data-sample-bytes", help="bytes per sample: 150kb, 3mb")
    data.add_argument("--data-batch", type=int, help="samples per rank per step (default 32)")
    data.add_argument("--data-bandwidth", help="the store's link, shared by all ranks (default 1gbit)")
    data.add_argument("--data-latency", help="per request to the store (default 1ms)")
    data.add_argument("--data-hit-rate", type=float, help="share of samples read from the local cache (default 0)")
    data.add_argument("--data-request-bytes", help="bytes per store request (a shard: 64mb); default one sample (range reads)")
    data.add_argument("--data-loader-workers", type=int, help="prefetching workers per rank (default 2; 0: serial)")
    data.add_argument("--data-local-per-sample", help="local read + decode time per sample: 50us (default 0)")
    data.add_argument("--data-memory-hit-rate", type=float,
                      help="share of samples from the loader's memory tier, part of --data-hit-rate (default 0)")
    data.add_argument("--data-disk-per-read", help="one shard read from the disk cache: 2ms (default 0)")
    data.add_argument("--data-batch-overhead", help="per batch in a loader worker, collate and transport: 300us (default 0)")
    data.add_argument("--data-contention", type=float,
                      help="the step's compute side runs this much longer beside busy loader workers "
                           "(>= 1; `caramel bench --data` measures it; default 1)")
    data.add_argument("--data-misses-last", action="store_true", default=None,
                      help="the sampler reads cached shards first (locality): an epoch's misses fall in its last "
                           "1 - hit rate of the steps")
    data.add_argument("--data-read-under-load", metavar="DURATION",
                      help="a range read's time on the cores under the training load, added to the store's latency "
                           "in each loader worker's sequence of reads: 1.2ms (`caramel bench --data` records it as "
                           "request_s_under_load; not with --data-request-bytes: shard fetches are not charged it; "
                           "default 0: not charged)")
    data.add_argument("--data-epoch-steps", type=int, metavar="N",
                      help="steps per epoch of a loader that starts each epoch empty (torch's DataLoader: a new "
                           "iterator each epoch): the epoch pays workers x min(data, compute side) once, spread "
                           "over N steps (default: not charged)")
    data.add_argument("--data-epoch-start", metavar="DURATION",
                      help="what a warm loader's epoch start (a new iterator over its workers) costs beside the "
                           "load over data in memory, beyond as many steady steps: `caramel bench --data` records "
                           "each round's as epoch_start_s_rounds and shows their median as 'restart ms' (the sum of "
                           "a calibration's restart_step_s less as many steady step_s, not restart_step_s itself); "
                           "what it adds beyond the workers' batches from memory joins the epoch's edge; needs "
                           "--data-epoch-steps (default 0: not charged)")
    parser.add_argument("--trace-dir", metavar="DIR", help="write each record's predicted trace here")
    parser.add_argument("--json", metavar="OUT", help="write the records (caramel.simulation/1)")


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    cluster = cluster_from_args(args)
    if args.compute_slowdown is not None:  # the flag overrides what the spec says, for every model below
        cluster.compute_slowdown = args.compute_slowdown
        cluster.validate("--compute-slowdown")
    planner_text = args.planner if args.planner is not None else ("" if args.strategy else "fifo,fusion,caramel")
    planners = [p.strip() for p in planner_text.split(",") if p.strip()]
    strategies = [STRATEGIES.spec(text) for text in args.strategy]
    overlaps = [o.strip() for o in args.overlap.split(",") if o.strip()]
    for o in overlaps:
        if o not in OVERLAPS:
            raise CaramelError(f"--overlap {o!r} is not a mode; expected one of {', '.join(OVERLAPS)}")
    if not planners and not args.plan and not strategies:
        raise CaramelError("--planner is empty and no --plan or --strategy was given; nothing to simulate")
    options = parse_options(args.option)
    plans = [(f"file:{Path(p).name}", Plan.load(p)) for p in args.plan]
    comm = CommModel(cluster, args.comm_model)
    data_model = _data_model(args, cluster.world_size)  # checked before the simulations run

    records: list[dict[str, Any]] = []
    traces = []
    chosen: list[str] = []  # what a strategy chose itself (a pipeline's replicas=auto)
    for spec in strategies:
        result = spec.simulate(profile, cluster, args.iterations)
        bound = lower_bound(profile, cluster, result.overlap, comm=comm)
        records.append(_record(spec.name, result.overlap, cluster, result, bound.step_time_s, None, args))
        traces.append(result.trace)
        auto = (result.meta or {}).get("replicas_auto")
        if auto:
            records[-1]["chosen"] = {"replicas": auto["counts"], "microbatches": auto["microbatches"],
                                     "boundaries": result.meta["boundaries"],
                                     "predicted_slowest_stage_s": auto["predicted_slowest_stage_s"]}
            chosen.append(f"{spec.name}: chose replicas {'+'.join(map(str, auto['counts']))}, "
                          f"{auto['microbatches']} microbatches, cut before {result.meta['boundaries']} "
                          f"(slowest stage {1e3 * auto['predicted_slowest_stage_s']:.1f} ms per step)")
    for overlap in (overlaps if planners or plans else []):
        bound = lower_bound(profile, cluster, overlap, comm=comm)
        todo = [(name, None) for name in planners] + plans
        for label, plan in todo:
            if plan is None:
                plan = make_plan(label, profile, cluster, overlap=overlap, comm_model=args.comm_model, **options)
            result = simulate(profile, cluster, plan, overlap=overlap, iterations=args.iterations,
                              trace=bool(args.trace_dir), comm=comm, compute_slowdown=args.compute_slowdown)
            records.append(_record(label, overlap, cluster, result, bound.step_time_s, plan, args))
            traces.append(result.trace)

    if data_model is not None:
        for rec in records:
            rec["data"] = data_model.describe()
            rec["data_time_s"] = data_model.data_time_s()
            rec["step_time_with_data_s"] = data_model.step_time_s(rec["step_time_s"])
            rec["bottleneck"] = data_model.bottleneck(rec["step_time_s"])
    _print_table(profile.model, cluster, records)
    for line in chosen:
        print(line)
    if data_model is not None:
        _print_data(data_model, records)
    if args.trace_dir:
        out = Path(args.trace_dir)
        for rec, trace in zip(records, traces):
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{rec['planner']}-{rec['overlap']}-w{rec['workers']}")
            trace.save(out / f"{name}.trace.json")
        print(f"predicted traces: {out}/")
    if args.json:
        write_json(args.json, {"format": format_tag(KIND), "model": profile.model, "cluster": cluster.to_dict(),
                               "iterations": args.iterations, "comm_model": comm.describe(), "records": records})
        print(f"wrote {args.json}")
    return 0


# The --data-* flags' defaults: None in argparse, so that a flag given without
# --data-sample-bytes is refused rather than silently ignored.
_DATA_DEFAULTS: dict[str, Any] = {
    "data_batch": 32, "data_bandwidth": "1gbit", "data_latency": "1ms", "data_hit_rate": 0.0,
    "data_request_bytes": None, "data_loader_workers": 2, "data_local_per_sample": "0", "data_memory_hit_rate": 0.0,
    "data_disk_per_read": "0", "data_batch_overhead": "0", "data_contention": 1.0, "data_misses_last": False,
    "data_read_under_load": "0", "data_epoch_steps": None, "data_epoch_start": "0",
}
_DATA_DURATIONS = ("data_latency", "data_local_per_sample", "data_disk_per_read", "data_batch_overhead",
                   "data_read_under_load", "data_epoch_start")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _data_model(args: argparse.Namespace, ranks: int):
    """The I/O model the --data-* flags describe, or None without --data-sample-bytes. Every
    duration is checked first (with its unit, `parse_duration_arg_s`); then
    a --data-* flag given without --data-sample-bytes is an error, not ignored."""
    given = [dest for dest in _DATA_DEFAULTS if getattr(args, dest, None) is not None]
    v = {dest: getattr(args, dest) if dest in given else default for dest, default in _DATA_DEFAULTS.items()}
    times_s = {dest: parse_duration_arg_s(v[dest], _flag(dest)) for dest in _DATA_DURATIONS}
    if not args.data_sample_bytes:
        if given:
            raise CaramelError(f"{_flag(given[0])} needs --data-sample-bytes (it turns the data model on); "
                               "without it the --data-* flags would be ignored")
        return None
    if v["data_epoch_steps"] is not None and v["data_epoch_steps"] < 1:
        raise CaramelError(f"--data-epoch-steps {v['data_epoch_steps']}: expected a number of steps >= 1")
    if v["data_epoch_steps"] is not None and v["data_loader_workers"] == 0:
        # serial loading pays every batch's loading in full: no prefetch to refill, so no edge to charge
        raise CaramelError("--data-epoch-steps needs loader workers (--data-loader-workers >= 1): "
                           "with 0 the loading is serial and an epoch's start costs nothing extra")
    if times_s["data_epoch_start"] and v["data_epoch_steps"] is None:
        raise CaramelError("--data-epoch-start is charged once per epoch: it needs --data-epoch-steps")
    if times_s["data_read_under_load"] and v["data_request_bytes"]:
        raise CaramelError("--data-read-under-load times one sample's range read; shard fetches "
                           "(--data-request-bytes) are not charged it, as in `caramel bench --data`")
    from caramel.data.io_model import DataLoadModel

    return DataLoadModel(
        sample_bytes=parse_size_bytes(args.data_sample_bytes), batch_size=v["data_batch"], ranks=ranks,
        store_bandwidth_bps=parse_rate_bps(v["data_bandwidth"]),
        store_latency_s=times_s["data_latency"], hit_rate=v["data_hit_rate"],
        request_bytes=parse_size_bytes(v["data_request_bytes"]) if v["data_request_bytes"] else None,
        loader_workers=v["data_loader_workers"],
        local_s_per_sample=times_s["data_local_per_sample"],
        memory_hit_rate=v["data_memory_hit_rate"],
        disk_s_per_read=times_s["data_disk_per_read"],
        batch_overhead_s=times_s["data_batch_overhead"],
        contention=v["data_contention"],
        remote_steps_share=max(1.0 - v["data_hit_rate"], 1e-9) if v["data_misses_last"] else 1.0,
        worker_request_s=times_s["data_read_under_load"], epoch_steps=v["data_epoch_steps"],
        epoch_start_s=times_s["data_epoch_start"])


def _print_data(model, records: list[dict[str, Any]]) -> None:
    print(f"data: {model.ranks} ranks x {model.batch_size} samples of {format_bytes(model.sample_bytes)}, "
          f"hit rate {model.hit_rate:.0%}, store {format_rate(model.store_bandwidth_bps)} shared, "
          f"{model.store_latency_s * 1e3:g} ms/request"
          + (f" + {model.worker_request_s * 1e3:g} ms a read under load" if model.worker_request_s else "")
          + f", {model.loader_workers} loader workers: "
          f"{model.data_time_s() * 1e3:.2f} ms of loading per step"
          + (f", epoch edge over {model.epoch_steps} steps" if model.epoch_steps else ""))
    for r in records:
        print(f"  {r['planner']} {r['overlap']}: step {r['step_time_with_data_s'] * 1e3:.2f} ms with data "
              f"({r['step_time_s'] * 1e3:.2f} ms without); bottleneck: {r['bottleneck']}")


def _record(label: str, overlap: str, cluster, result, bound_s: float, plan: Plan | None, args) -> dict[str, Any]:
    return {
        "planner": label, "overlap": overlap, "workers": cluster.world_size,
        "bandwidth_bps": cluster.bandwidth_bps, "latency_s": cluster.latency_s,
        "queued_latency_s": cluster.queued_latency_s, "collective_cpu_s": cluster.collective_cpu_s,
        "collective": cluster.collective, "topology": cluster.topology,
        "buckets": len(plan.buckets) if plan is not None else None, "items": result.num_items,
        "step_time_s": result.step_time_s, "compute_time_s": result.compute_time_s,
        "comm_time_s": result.comm_time_s, "exposed_comm_s": result.exposed_comm_s,
        "wait_time_s": result.wait_time_s, "link_utilization": result.link_utilization,
        "lower_bound_s": bound_s, "plan_fingerprint": plan.fingerprint if plan is not None else None,
        "critical_path": result.critical_path, "compute_slowdown": cluster.compute_slowdown,
    }


def _print_table(model: str, cluster, records: list[dict[str, Any]]) -> None:
    queued = (f" ({cluster.effective_queued_latency_s * 1e6:g} us queued)" if cluster.queued_latency_s is not None else "")
    print(f"model {model}, {cluster.world_size} workers, {format_rate(cluster.bandwidth_bps)}, "
          f"latency {cluster.latency_s * 1e6:g} us{queued}, {cluster.collective} on {cluster.topology}")
    head = ("planner", "overlap", "items", "step ms", "compute ms", "comm ms", "exposed ms", "bound ms", "speedup")
    rows = []
    base: dict[str, float] = {}
    for r in records:
        base.setdefault(r["overlap"], r["step_time_s"])
        speedup = base[r["overlap"]] / r["step_time_s"] if r["step_time_s"] > 0 else 1.0
        rows.append((r["planner"], r["overlap"], str(r["items"]), f"{r['step_time_s'] * 1e3:.2f}",
                     f"{r['compute_time_s'] * 1e3:.2f}", f"{r['comm_time_s'] * 1e3:.2f}",
                     f"{r['exposed_comm_s'] * 1e3:.2f}", f"{r['lower_bound_s'] * 1e3:.2f}", f"{speedup:.2f}x"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) if i >= 2 else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths))))
    for row in rows:
        print("  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print("speedup: versus the first row of the same overlap mode; bound: best step time any schedule could reach")
