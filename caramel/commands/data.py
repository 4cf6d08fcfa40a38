"""`caramel data`: make a data set in the sharded format, and serve a directory over http
behind an emulated link (the store for `caramel bench --data URL`, e.g. inside one of
`caramel cluster`'s network namespaces).

    caramel data make /srv/ds --samples 512 --sample-bytes 16kb --samples-per-shard 16
    caramel data make /srv/digits --workload digits        # the training split, for caramel train --data
    caramel data serve /srv/ds --host 0.0.0.0 --port 8000 --rate 100mbit --latency 2ms
"""
from __future__ import annotations

import argparse
import math
import time

from caramel.errors import CaramelError
from caramel.units import parse_duration_arg_s, parse_rate_bps, parse_size_bytes

RANDOM_DEFAULTS = {"samples": 512, "sample_bytes": "16kb", "seed": 0}  # `make` without --workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    make = sub.add_parser("make", help="write a random data set (uint8 samples and their indices), or a "
                                       "workload's training split (--workload), to DIR")
    make.add_argument("directory", metavar="DIR")
    # the options of one kind of set default to None, so that one given for the other kind is refused
    make.add_argument("--samples", type=int, help=f"random set: samples (default {RANDOM_DEFAULTS['samples']})")
    make.add_argument("--sample-bytes", help=f"random set: bytes per sample (default {RANDOM_DEFAULTS['sample_bytes']})")
    make.add_argument("--samples-per-shard", type=int, default=16, help="samples per shard file (default 16)")
    make.add_argument("--seed", type=int, help="random set: seed of its bytes (default 0)")
    make.add_argument("--workload", choices=("digits", "char_gpt"),
                      help="write this caramel train workload's training split (input, target) instead of random "
                           "samples, for `caramel train --data DIR` (--samples, --sample-bytes and --seed do not apply)")
    make.add_argument("--val-fraction", type=float,
                      help="--workload: the share held out for validation, as caramel train's --val-fraction (default 0.1)")
    make.add_argument("--seq-len", type=int, help="--workload char_gpt: tokens per sample (default 64)")
    make.add_argument("--text-bytes", type=int,
                      help="--workload char_gpt: bytes of standard-library source (default 2000000)")
    serve = sub.add_parser("serve", help="serve DIR over http (GET, HEAD, byte ranges) behind an emulated link")
    serve.add_argument("directory", metavar="DIR")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    serve.add_argument("--rate", help="the link's rate shared by all clients, e.g. 100mbit (default: unshaped)")
    serve.add_argument("--latency", default="0", help="delay before each response, with its unit (s, ms, us): 2ms (default 0)")
    serve.add_argument("--seconds", type=float, help="stop after this long (default: until interrupted)")


def run(args: argparse.Namespace) -> int:
    if args.data_command == "make":
        _refuse_unused(args)
    if args.data_command == "make" and args.workload:
        index = _make_workload_store(args)
        print(f"{args.directory}: {args.workload} training split, {index.num_samples} samples in "
              f"{len(index.shards)} shards, {index.nbytes} bytes")
        return 0
    if args.data_command == "make":
        from caramel.data.format import write_random_dataset

        given = {k: getattr(args, k) for k in RANDOM_DEFAULTS if getattr(args, k) is not None}
        o = {**RANDOM_DEFAULTS, **given}
        index = write_random_dataset(args.directory, o["samples"], parse_size_bytes(o["sample_bytes"]),
                                     args.samples_per_shard, o["seed"])
        print(f"{args.directory}: {index.num_samples} samples in {len(index.shards)} shards, {index.nbytes} bytes")
        return 0
    if args.data_command == "serve":
        from caramel.data.serve import serve_directory
        from caramel.data.store import Store

        if args.seconds is not None and not (math.isfinite(args.seconds) and args.seconds > 0):
            raise CaramelError(f"--seconds must be a positive number of seconds, got {args.seconds:g}")
        latency_s = parse_duration_arg_s(args.latency, "--latency")
        rate = parse_rate_bps(args.rate) if args.rate else None
        Store(args.directory).index()  # a directory without a data set is named now, not on the first request
        with serve_directory(args.directory, args.host, args.port, rate, latency_s) as server:
            print(f"serving {args.directory} at {server.url}", flush=True)
            try:
                time.sleep(args.seconds) if args.seconds is not None else _forever()
            except KeyboardInterrupt:
                pass
            print(f"served {server.requests_served} requests, {server.bytes_served} bytes")
        return 0
    raise CaramelError("caramel data: expected an action, make or serve")


def _make_workload_store(args: argparse.Namespace):
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.store_data import write_workload_store

    split = {k: getattr(args, k) for k in ("val_fraction", "seq_len", "text_bytes") if getattr(args, k) is not None}
    cfg = apply_dict(TrainConfig(), {"run": {"workload": args.workload}, "data": split}, "caramel data make")
    return write_workload_store(args.directory, cfg, args.samples_per_shard)


def _refuse_unused(args: argparse.Namespace) -> None:
    """A `make` option the chosen kind of set does not read is an error, not silently ignored."""
    unused = (tuple(RANDOM_DEFAULTS) if args.workload else ("val_fraction", "seq_len", "text_bytes"))
    if args.workload != "char_gpt" and args.workload:
        unused += ("seq_len", "text_bytes")
    given = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k in unused if getattr(args, k) is not None]
    if given:
        kind = f"--workload {args.workload} (its training split)" if args.workload else "a random set (no --workload)"
        raise CaramelError(f"caramel data make: {', '.join(given)}: not used for {kind}; drop "
                           f"{'them' if len(given) > 1 else 'it'}")


def _forever() -> None:
    while True:
        time.sleep(3600)
