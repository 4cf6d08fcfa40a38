"""`caramel profile`: per-parameter sizes, gradient-ready and first-use times, transfer windows."""
from __future__ import annotations

import argparse

import torch

from caramel.errors import CaramelError
from caramel.models import get_model
from caramel.profile.profiler import profile_model
from caramel.units import format_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="zoo model name (mlp, resnet18, vgg16, gpt2, ...) or path/to/file.py:factory")
    parser.add_argument("--batch-size", type=int, default=None, help="per-worker batch size (samples); default: the model's own")
    parser.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads (default 1, as one worker per core)")
    parser.add_argument("--json", metavar="OUT", help="write the ModelProfile (caramel.profile/1 JSON) here")
    parser.add_argument("--top", type=int, default=10, help="show the N largest parameters (default 10)")
    parser.add_argument("--no-split-tied", dest="split_tied", action="store_false",
                        help="profile a tied embedding's weight with its whole gradient, as parallelize(split_tied=False) "
                             "trains it (default: the embedding's rows apart, the weight ready early)")


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise CaramelError(f"--steps must be >= 1, got {args.steps}")
    if args.threads < 1:
        raise CaramelError(f"--threads must be >= 1, got {args.threads}")
    if args.batch_size is not None and args.batch_size < 1:
        raise CaramelError(f"--batch-size must be >= 1, got {args.batch_size}")
    torch.set_num_threads(args.threads)
    factory = get_model(args.model)
    w = factory(batch_size=args.batch_size) if args.batch_size else factory()
    prof = profile_model(w.model, w.inputs, w.targets, w.loss_fn, steps=args.steps, warmup=args.warmup, name=w.name,
                         split_tied=args.split_tied)
    print(f"model {prof.model}: {len(prof.params)} parameters, {format_bytes(prof.total_grad_bytes())} of gradients, batch {prof.batch_size}")
    print(f"forward {prof.forward_time_s * 1e3:.2f} ms, backward {prof.backward_time_s * 1e3:.2f} ms, "
          f"optimizer {prof.optimizer_time_s * 1e3:.2f} ms (median of {prof.steps_measured} steps)")
    windows = {w.param: w for w in prof.windows("forward")}
    print(f"\n{'parameter':40s} {'bytes':>10s} {'ready ms':>9s} {'first use ms':>12s} {'window ms':>10s}")
    for p in sorted(prof.trainable(), key=lambda p: -p.bytes)[:args.top]:
        win = windows[p.index]
        ready = f"{p.ready_time_s * 1e3:.2f}" if p.ready_time_s is not None else "-"
        use = f"{p.first_use_time_s * 1e3:.2f}" if p.first_use_time_s is not None else "-"
        print(f"{p.name[:40]:40s} {format_bytes(p.bytes):>10s} {ready:>9s} {use:>12s} {win.length_s * 1e3:>10.2f}")
    if args.json:
        prof.save(args.json)
        print(f"\nwrote {args.json}")
    return 0
