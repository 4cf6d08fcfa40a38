"""`caramel profile`: per-parameter sizes, gradient-ready and first-use times, transfer windows,
and the windows with deferred weight gradients (`--defer K`; `caramel.plan.compute_schedule`)."""
from __future__ import annotations

import argparse

import torch

from caramel.errors import CaramelError
from caramel.models import get_model
from caramel.plan.compute_schedule import (deferrable_modules, deferred_profile, max_k, memory_cap_bytes, schedule_for,
                                           undeferred_peak_bytes)
from caramel.profile.branches import find_branches
from caramel.profile.profiler import profile_model
from caramel.units import format_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="zoo model name (mlp, resnet18, vgg16, gpt2, ...) or path/to/file.py:factory")
    parser.add_argument("--batch-size", type=int, default=None, help="per-worker batch size (samples); default: the model's own")
    parser.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads (default 1, as one worker per core)")
    parser.add_argument("--json", metavar="OUT", help="write the ModelProfile (caramel.profile/1 JSON) here")
    parser.add_argument("--small-batch", type=int, default=None, metavar="N",
                        help="also time every module on N samples (below the batch), so a pipeline's microbatches "
                             "get a fixed cost per call in `caramel simulate`/`plan` (default: one size only)")
    parser.add_argument("--top", type=int, default=10, help="show the N largest parameters (default 10)")
    parser.add_argument("--defer", type=int, default=None, metavar="K",
                        help="show the windows with the weight gradients of the K splittable modules nearest the input "
                             "deferred (default: as many as fit 10%% of the estimated peak memory)")
    parser.add_argument("--no-split-tied", dest="split_tied", action="store_false",
                        help="profile a tied embedding's weight with its whole gradient, as parallelize(split_tied=False) "
                             "trains it (default: the embedding's rows apart, the weight ready early)")
    parser.add_argument("--dropout-table", metavar="OUT",
                        help="instead of the profile: measure the cost-versus-accuracy table of structured dropout "
                             "(balance='dropout') and write it here (caramel.dropout-table/1 JSON)")
    parser.add_argument("--dropout-fractions", default=None,
                        help="with --dropout-table: the fractions of units dropped (default 0,0.125,0.25,0.5)")
    parser.add_argument("--dropout-train-steps", type=int, default=None,
                        help="with --dropout-table: SGD steps trained per fraction before the held-out loss (default 30)")


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise CaramelError(f"--steps must be >= 1, got {args.steps}")
    if args.threads < 1:
        raise CaramelError(f"--threads must be >= 1, got {args.threads}")
    if args.batch_size is not None and args.batch_size < 1:
        raise CaramelError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.defer is not None and args.defer < 0:
        raise CaramelError(f"--defer must be >= 0, got {args.defer}")
    if not args.dropout_table:
        for flag, value in (("--dropout-fractions", args.dropout_fractions), ("--dropout-train-steps", args.dropout_train_steps)):
            if value is not None:
                raise CaramelError(f"{flag} is only for measuring a dropout table: add --dropout-table OUT, or drop {flag}")
    torch.set_num_threads(args.threads)
    factory = get_model(args.model)
    if args.dropout_table:
        return _dropout_table(args, factory)
    w = factory(batch_size=args.batch_size) if args.batch_size else factory()
    prof = profile_model(w.model, w.inputs, w.targets, w.loss_fn, steps=args.steps, warmup=args.warmup, name=w.name,
                         split_tied=args.split_tied, small_batch_size=args.small_batch)
    print(f"model {prof.model}: {len(prof.params)} parameters, {format_bytes(prof.total_grad_bytes())} of gradients, batch {prof.batch_size}")
    if prof.small_batch_size:
        print(f"modules also timed at batch {prof.small_batch_size} (a fixed cost per microbatch for pipelines)")
    print(f"forward {prof.forward_time_s * 1e3:.2f} ms, backward {prof.backward_time_s * 1e3:.2f} ms, "
          f"optimizer {prof.optimizer_time_s * 1e3:.2f} ms (median of {prof.steps_measured} steps)")
    splittable = deferrable_modules(prof)
    k = max_k(prof) if args.defer is None else args.defer
    if k > len(splittable):
        raise CaramelError(f"--defer {k}: model {prof.model} has {len(splittable)} modules whose weight gradients "
                           f"can be deferred")
    schedule = schedule_for(prof, k)
    deferred = deferred_profile(prof, schedule)
    print(f"deferred weight gradients: {k} of {len(splittable)} splittable modules"
          + (f" ({', '.join(schedule.modules[:4])}{', ...' if k > 4 else ''})" if k else "")
          + f", {format_bytes(schedule.extra_bytes)} extra memory (cap {format_bytes(memory_cap_bytes(prof))}: 10% of "
          f"an estimated peak of {format_bytes(undeferred_peak_bytes(prof))})")
    print(print_windows(prof, deferred, args.top))
    # the blocks `branch_order="auto"` may reorder, kept in the profile for `caramel plan`/`simulate`
    branches = find_branches(w.model)
    prof.meta.update(branches=[b.to_dict() for b in branches.blocks], branches_reason=branches.reason)
    print(f"\nindependent branches: {branches.reason}" if branches.reason else
          f"\nindependent branches: {len(branches.blocks)} blocks, {len(branches.reorderable())} reorderable"
          + "".join(f"\n  block {i}: {len(b.branches)} branches ({', '.join(br[0] for br in b.branches)})"
                    + (f", fixed: {b.fixed}" if b.fixed else "") for i, b in enumerate(branches.blocks[:8])))
    if args.json:
        prof.save(args.json)
        print(f"\nwrote {args.json}")
    return 0


def _dropout_table(args: argparse.Namespace, factory) -> int:
    from caramel.profile.dropout_table import check_fractions, measure_table
    fractions = check_fractions(args.dropout_fractions or "0,0.125,0.25,0.5")
    train_steps = 30 if args.dropout_train_steps is None else args.dropout_train_steps
    if train_steps < 1:
        raise CaramelError(f"--dropout-train-steps must be >= 1, got {train_steps}")
    table = measure_table(args.model, factory, args.batch_size, fractions, time_steps=args.steps,
                          train_steps=train_steps)
    print(f"model {table.model}: {len(table.groups)} droppable groups ({', '.join(table.groups)})")
    print("fraction  time ratio  held-out loss  increase")
    for e in table.entries:
        print(f"{e.fraction:8.3f}  {e.time_ratio:10.3f}  {e.val_loss:13.4f}  {e.loss_increase:+8.4f}")
    table.save(args.dropout_table)
    print(f"wrote {args.dropout_table}")
    return 0


def print_windows(prof, deferred, top: int) -> str:
    """The `top` largest parameters: ready time, first use and window, without and with deferral."""
    windows = {w.param: w for w in prof.windows("forward")}
    after = {w.param: w for w in deferred.windows("forward")}
    ready_after = {p.index: p.ready_time_s for p in deferred.params}
    lines = [f"\n{'parameter':40s} {'bytes':>10s} {'ready ms':>9s} {'first use ms':>12s} {'window ms':>10s} "
             f"{'deferred: ready ms':>18s} {'window ms':>10s}"]
    ms = lambda t: f"{t * 1e3:.2f}" if t is not None else "-"  # noqa: E731
    for p in sorted(prof.trainable(), key=lambda p: -p.bytes)[:top]:
        lines.append(f"{p.name[:40]:40s} {format_bytes(p.bytes):>10s} {ms(p.ready_time_s):>9s} "
                     f"{ms(p.first_use_time_s):>12s} {windows[p.index].length_s * 1e3:>10.2f} "
                     f"{ms(ready_after[p.index]):>18s} {after[p.index].length_s * 1e3:>10.2f}")
    return "\n".join(lines)
