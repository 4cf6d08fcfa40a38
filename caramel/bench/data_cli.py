"""`caramel data-bench`: plain remote reads vs a shard cache vs the locality-aware sampler.

    caramel data-bench --ranks 2 --epochs 3 --rounds 3 --store-rate 100mbit --cache-share 1 --markdown OUT.md

A generated data set is served on loopback by `caramel.data.serve` behind an emulated link
(rate and per-request latency); each mode runs the same epochs; the table gives step times,
the speedup over remote reads with its 95% interval, remote bytes, hit rate and the I/O
model's prediction (docs/data.md).
"""
from __future__ import annotations

import argparse
import json

from caramel.bench.data_bench import MODES, DataBenchConfig, format_rows, run_data_bench
from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_text
from caramel.units import parse_duration_s, parse_rate_bps, parse_size_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DataBenchConfig()
    p.add_argument("--ranks", type=int, default=d.ranks, help=f"rank processes (default {d.ranks})")
    p.add_argument("--samples", type=int, default=d.samples, help=f"samples in the data set (default {d.samples})")
    p.add_argument("--sample-bytes", default=str(d.sample_bytes), help=f"bytes per sample (default {d.sample_bytes})")
    p.add_argument("--samples-per-shard", type=int, default=d.samples_per_shard)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per rank per step")
    p.add_argument("--loader-workers", type=int, default=d.loader_workers, help="prefetching workers per rank")
    p.add_argument("--epochs", type=int, default=d.epochs, help="epochs per mode per round (the first is cold)")
    p.add_argument("--rounds", type=int, default=d.rounds, help="rounds (each mode once per round, fresh caches)")
    p.add_argument("--compute", default="4ms", help="stand-in compute per step (a sleep; default 4ms)")
    p.add_argument("--store-rate", default="100mbit", help="the store's link, shared by all ranks (default 100mbit)")
    p.add_argument("--store-latency", default="2ms", help="per request (default 2ms)")
    p.add_argument("--cache-share", type=float, default=d.cache_share,
                   help="cache budget per rank as a share of its 1/W of the data (default 1)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated among {', '.join(MODES)}")
    p.add_argument("--json", metavar="OUT", help="write the report (caramel.data-bench/1)")
    p.add_argument("--markdown", metavar="OUT", help="write the table as markdown")


def run(args: argparse.Namespace) -> int:
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    for m in modes:
        if m not in MODES:
            raise CaramelError(f"--modes: {m!r} is not a mode; expected among {', '.join(MODES)}")
    if args.ranks < 1 or args.epochs < 2 or args.rounds < 1 or args.cache_share < 0:
        raise CaramelError("--ranks >= 1, --epochs >= 2 (the first is cold), --rounds >= 1, --cache-share >= 0 expected")
    cfg = DataBenchConfig(ranks=args.ranks, samples=args.samples, sample_bytes=parse_size_bytes(args.sample_bytes),
                          samples_per_shard=args.samples_per_shard, batch_size=args.batch_size,
                          loader_workers=args.loader_workers, epochs=args.epochs, rounds=args.rounds,
                          compute_s=parse_duration_s(args.compute), store_rate_bps=parse_rate_bps(args.store_rate),
                          store_latency_s=parse_duration_s(args.store_latency), cache_share=args.cache_share, modes=modes)
    report = run_data_bench(cfg)
    print(format_rows(report))
    print(f"local read+decode {report['local_s_per_sample'] * 1e6:.0f} us/sample, request overhead "
          f"{report['request_overhead_s'] * 1e3:.2f} ms (measured; the model's inputs)")
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1, sort_keys=True) + "\n")
    if args.markdown:
        atomic_write_text(args.markdown, format_rows(report, markdown=True) + "\n")
    return 0
