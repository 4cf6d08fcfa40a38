"""The data-loading benchmark's commands: `caramel bench --data URL` on an existing store, and
`caramel data-bench` on a generated one.

    caramel data make /srv/ds --samples 512 --sample-bytes 16kb --samples-per-shard 16
    caramel bench --data /srv/ds --workers 2 --rounds 3 --data-epochs 3 --store-rate 100mbit
    caramel bench --data http://10.0.0.1:8000 --workers 2        # a store over a real (or tc-shaped) link
    caramel bench --data /srv/ds --network cluster --store-rate 100mbit   # served from a cluster host, tc link
    caramel data-bench --ranks 2 --epochs 3 --rounds 3 --cache-share 1 --markdown OUT.md

A local directory is served on loopback by `caramel.data.serve` behind an emulated link (rate
and per-request latency); an http(s)/s3 URL is read as it is. Each mode runs the same epochs;
the table gives step times and their parts, the speedup over the plain loader with its 95%
interval, remote bytes, hit rate and the I/O model's prediction (docs/data.md).
"""
from __future__ import annotations

import argparse
import json

from caramel.bench.calibration_window import CalibrationWindow, parse_calibration_window
from caramel.bench.data_bench import MODES, DataBenchConfig, is_local, run_data_bench
from caramel.bench.data_report import format_rows
from caramel.bench.provenance import code_version
from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_text
from caramel.units import parse_duration_arg_s, parse_rate_bps, parse_size_bytes


def _at_least(value: int, minimum: int, flag: str, why: str = "") -> int:
    if value < minimum:
        raise CaramelError(f"{flag} must be >= {minimum}{why}, got {value}")
    return value


def add_loading_arguments(p, modes_flag: str = "--modes", epochs_flag: str = "--epochs") -> None:
    """The options of how the ranks load (shared by `bench --data` and `data-bench`)."""
    d = DataBenchConfig()
    p.add_argument("--loader-workers", type=int, default=d.loader_workers, help="prefetching workers per rank")
    p.add_argument(epochs_flag, dest="data_epochs", type=int, default=d.epochs,
                   help=f"epochs per mode per round (the first is cold; default {d.epochs})")
    p.add_argument("--compute", default="4ms", help="stand-in compute per step (a sleep), with its unit (s, ms, us; default 4ms)")
    p.add_argument("--store-rate", help="a served directory's emulated link, shared by all ranks (default 100mbit); "
                   "for a URL, the link's known rate, used by the model only")
    p.add_argument("--store-latency", help="per request, of a served directory's emulated link, with its unit "
                   f"(s, ms, us; default {d.store_latency_s * 1e3:g}ms); refused for a URL")
    p.add_argument("--cache-share", type=float, default=d.cache_share,
                   help="disk cache per rank as a share of its 1/W of the data (default 1)")
    p.add_argument("--memory-share", type=float,
                   help="memory tier per loader worker, same unit (default: as --cache-share; 0: none)")
    p.add_argument(modes_flag, dest="data_modes", default=",".join(MODES),
                   help=f"comma-separated among {', '.join(MODES)}")
    p.add_argument("--calibration-window", metavar="STEPS|DURATION",
                   help=f"each contention calibration's window: a whole number of steps (default {d.calibration_steps}) "
                   "or a duration of steps alone with its unit (1.5s, 800ms), converted to steps once per run")
    p.add_argument("--calibration-sub-windows", type=int, metavar="K",
                   help="the calibration's loaded step as the median of K consecutive parts' means "
                   f"(default {d.calibration_sub_windows}: the mean of the window)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`caramel data-bench`: a generated data set."""
    d = DataBenchConfig()
    p.add_argument("--ranks", type=int, default=d.ranks, help=f"rank processes (default {d.ranks})")
    p.add_argument("--samples", type=int, default=d.samples, help=f"samples in the data set (default {d.samples})")
    p.add_argument("--sample-bytes", default=str(d.sample_bytes), help=f"bytes per sample (default {d.sample_bytes})")
    p.add_argument("--samples-per-shard", type=int, default=d.samples_per_shard)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per rank per step")
    p.add_argument("--rounds", type=int, default=d.rounds, help="rounds (each mode once per round, fresh caches)")
    add_loading_arguments(p)
    p.add_argument("--json", metavar="OUT", help="write the report (caramel.data-bench/7)")
    p.add_argument("--markdown", metavar="OUT", help="write the table as markdown")


def config_from(args: argparse.Namespace, ranks: int, batch_size: int, rounds: int, url: str | None,
                ranks_flag: str = "--ranks", epochs_flag: str = "--epochs", **generated) -> DataBenchConfig:
    """The bench configuration from the shared options; one CaramelError naming a bad one."""
    modes = tuple(m.strip() for m in args.data_modes.split(",") if m.strip())
    for m in modes:
        if m not in MODES:
            raise CaramelError(f"data modes: {m!r} is not a mode; expected among {', '.join(MODES)}")
    _at_least(ranks, 1, ranks_flag)
    _at_least(args.data_epochs, 2, epochs_flag, " (the first is cold)")
    _at_least(rounds, 1, "--rounds")
    _at_least(batch_size, 1, "--batch-size")
    if not args.cache_share >= 0:
        raise CaramelError(f"--cache-share must be >= 0, got {args.cache_share}")
    if args.memory_share is not None and args.memory_share < 0:
        raise CaramelError(f"--memory-share must be >= 0, got {args.memory_share}")
    if args.loader_workers < 0:
        raise CaramelError(f"--loader-workers must be >= 0, got {args.loader_workers}")
    served = url is None or is_local(url)
    rate = parse_rate_bps(args.store_rate) if args.store_rate else (DataBenchConfig().store_rate_bps if served else None)
    latency_s = DataBenchConfig().store_latency_s if served else 0.0
    if args.store_latency is not None:
        latency_s = parse_duration_arg_s(args.store_latency, "--store-latency")
        if not served:  # the delay is the emulated link's: a store at a URL has its own, which this cannot set
            raise CaramelError(f"--store-latency {args.store_latency!r} applies to a served directory (its emulated "
                               f"link); the store at {url} is not one: omit it")
    window = calibration_window_from(args)
    cfg = DataBenchConfig(ranks=ranks, batch_size=batch_size, rounds=rounds, loader_workers=args.loader_workers,
                          epochs=args.data_epochs, compute_s=parse_duration_arg_s(args.compute, "--compute"), store_rate_bps=rate,
                          store_latency_s=latency_s,
                          cache_share=args.cache_share, memory_share=args.memory_share, modes=modes,
                          calibration_steps=window.steps, calibration_seconds=window.seconds,
                          calibration_sub_windows=window.sub_windows, **generated)
    try:
        window.check_time(cfg.compute_s, cfg.timeout_s)
    except CaramelError as e:
        raise CaramelError(f"--calibration-window {args.calibration_window or window.steps} with --compute "
                           f"{args.compute}: {e}") from None
    return cfg


def calibration_window_from(args: argparse.Namespace) -> CalibrationWindow:
    """`--calibration-window` and `--calibration-sub-windows` as a checked window (defaults: 40 steps, the mean)."""
    d = DataBenchConfig()
    steps, seconds = d.calibration_steps, None
    if args.calibration_window is not None:
        steps, seconds = parse_calibration_window(args.calibration_window)
        steps = d.calibration_steps if steps is None else steps
    sub = d.calibration_sub_windows if args.calibration_sub_windows is None else args.calibration_sub_windows
    try:
        return CalibrationWindow(steps, seconds, sub)
    except CaramelError as e:
        raise CaramelError(f"--calibration-window {args.calibration_window or steps} with --calibration-sub-windows "
                           f"{sub}: {e}") from None


def report(cfg: DataBenchConfig, url: str | None, json_out: str | None, markdown_out: str | None) -> int:
    result = run_data_bench(cfg, url)
    result["code"] = code_version()  # which checkout made the record, for replays against later models
    print(format_rows(result))
    c = result["measured_costs"]
    print(f"the model's inputs, measured alone: decode {c['local_s_per_sample'] * 1e6:.0f} us/sample, disk read "
          f"{c['disk_s_per_read'] * 1e3:.2f} ms/shard, batch trip {c['batch_s_pipe'] * 1e3:.2f} ms by pipe and "
          f"{c['batch_s_shared'] * 1e3:.2f} ms by shared memory, compute+all-reduce "
          f"{(c['compute_comm_s'] or 0) * 1e3:.2f} ms, request overhead {c['request_overhead_s'] * 1e3:.2f} ms; "
          f"remote bytes from the {result['remote_bytes_from']}")
    if c.get("loaded"):
        lo = c["loaded"]
        print(f"beside busy loader workers (before the modes): step {lo['step_s'] * 1e3:.2f} ms (wait "
              f"{lo['wait_s'] * 1e3:.2f}, compute {lo['compute_s'] * 1e3:.2f}, all-reduce {lo['sync_s'] * 1e3:.2f}): "
              f"the contention of one calibration x{result['contention']:.2f}")
    for r in result["rows"]:
        cals = [c for c in r.get("calibrations", []) if c.get("loaded")]
        if cals:
            steps = ", ".join(f"{c['loaded']['step_s'] * 1e3:.2f}/{c['alone_s'] * 1e3:.2f}" for c in cals)
            print(f"{r['mode']}: beside its own loader right before each round, step/alone {steps} ms: "
                  f"contention x{r['contention']:.2f} (the rounds' median)")
        probed = [c for c in r.get("calibrations", []) if "request_s_under_load_reads" in c]
        if probed:
            reads = ", ".join((f"{c['request_s_under_load'] * 1e3:.2f}" if c["request_s_under_load"] is not None
                               else "none (term off)") + f" ({c['request_s_under_load_reads']} reads)" for c in probed)
            print(f"{r['mode']}: range read under each round's calibration load {reads} ms, "
                  f"alone {result['measured_costs']['request_overhead_s'] * 1e3:.2f} ms"
                  + ("" if r.get("request_s_under_load_charged") else " (not charged: shard fetches)"))
    if json_out:
        atomic_write_text(json_out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    if markdown_out:
        atomic_write_text(markdown_out, format_rows(result, markdown=True) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    cfg = config_from(args, args.ranks, args.batch_size, args.rounds, None, samples=args.samples,
                      sample_bytes=parse_size_bytes(args.sample_bytes), samples_per_shard=args.samples_per_shard)
    return report(cfg, None, args.json, args.markdown)


def run_bench_data(args: argparse.Namespace) -> int:
    """`caramel bench --data URL`: the bench's --workers ranks, --batch-size, --rounds on that store
    (unset: the data bench's defaults; 0 is refused, not taken for unset)."""
    d = DataBenchConfig()
    cfg = config_from(args, d.ranks if args.workers is None else args.workers,
                      d.batch_size if args.batch_size is None else args.batch_size,
                      d.rounds if args.rounds is None else args.rounds, args.data, ranks_flag="--workers",
                      epochs_flag="--data-epochs", timeout_s=args.timeout,
                      network="cluster" if args.network == "cluster" else "loopback")  # auto: loopback, as before
    return report(cfg, args.data, args.json, args.markdown)
