"""`caramel plan`: make a communication plan from a profile and a cluster.

    caramel plan --profile P.json --planner caramel --workers 8 --bandwidth 1gbit --json PLAN.json

The plan (`caramel.plan/1`) goes to `--json OUT`; `caramel train`/`parallelize(plan=...)` use it
as is. A summary (buckets, collectives, predicted step time, fingerprint) is printed.
"""
from __future__ import annotations

import argparse

from caramel.strategies.planners import make_plan
from caramel.commands.common import (add_cluster_arguments, add_option_argument, add_profile_arguments,
                                    cluster_from_args, load_profile, parse_options)
from caramel.plan.plan import OVERLAPS
from caramel.sim.simulate import simulate
from caramel.units import format_bytes, format_rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_profile_arguments(parser)
    parser.add_argument("--planner", default="caramel", help="fifo, fusion or caramel (default caramel)")
    add_cluster_arguments(parser)
    parser.add_argument("--overlap", choices=OVERLAPS, default="forward",
                        help="overlap mode the plan is for (default forward)")
    add_option_argument(parser)
    parser.add_argument("--json", metavar="OUT", help="write the plan here (caramel.plan/1)")


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    cluster = cluster_from_args(args)
    options = parse_options(args.option)
    plan = make_plan(args.planner, profile, cluster, overlap=args.overlap, **options)
    if plan.predicted_step_time_s is None:
        plan.predicted_step_time_s = simulate(profile, cluster, plan, overlap=args.overlap, trace=False).step_time_s
    print(f"plan {args.planner} for {profile.model} on {cluster.world_size} workers, "
          f"{format_rate(cluster.bandwidth_bps)}, overlap {args.overlap}")
    print(f"  buckets {len(plan.buckets)}, collectives {plan.num_items()}, gradients {format_bytes(plan.total_bytes())}")
    sizes = sorted(b.bytes for b in plan.buckets)
    print(f"  bucket sizes: min {format_bytes(sizes[0])}, median {format_bytes(sizes[len(sizes) // 2])}, max {format_bytes(sizes[-1])}")
    if "order" in plan.options:
        print(f"  issue order: {plan.options['order']}; candidates: {plan.options.get('candidates_evaluated')}"
              + (", each also simulated over the input spread" if plan.options.get("spread_step_time_s") is not None else ""))
    print(f"  predicted step time {plan.predicted_step_time_s * 1e3:.2f} ms; fingerprint {plan.fingerprint}")
    if plan.options.get("spread_step_time_s") is not None:
        spread = plan.options["input_spread"]
        print(f"  chosen for its mean over compute and bandwidth each x{1 / (1 + spread):.2f}..x{1 + spread:.2f}: "
              f"{plan.options['spread_step_time_s'] * 1e3:.2f} ms (input_spread={spread:g}; 0 plans for the inputs exactly)")
    if args.json:
        plan.save(args.json)
        print(f"wrote {args.json}")
    return 0
