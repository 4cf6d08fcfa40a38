"""`caramel plan`: make a communication plan from a profile and a cluster.

    caramel plan --profile P.json --planner caramel --workers 8 --bandwidth 1gbit --json PLAN.json

The plan (`caramel.plan/1`) goes to `--json OUT`; `caramel train`/`parallelize(plan=...)` use it
as is. A summary (buckets, collectives, predicted step time, fingerprint) is printed.

    caramel plan --profile P.json --workers 4 --bandwidth 300mbit --strategy auto [--approximate]

recommends a strategy instead: every candidate (`caramel.strategies.recommend`) simulated on the
profile and cluster, ranked; `--json OUT` then writes `caramel.recommendation/1`.
"""
from __future__ import annotations

import argparse

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.strategies.planners import make_plan
from caramel.strategies.recommend import candidates, predict, recommend
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
    parser.add_argument("--strategy", metavar="auto", help="auto: recommend the fastest strategy by simulation "
                        "instead of making a bucket plan")
    parser.add_argument("--candidates", metavar="SPEC,SPEC", help="with --strategy auto: the strategies to compare, "
                        "';'-separated specs (default: ddp, caramel, ps and synchronous pipelines for the world size)")
    parser.add_argument("--approximate", action="store_true", help="with --strategy auto: also recommend strategies "
                        "that train a different model than DDP (gossip, ssp/asp, async PipeDream, lossy compression)")
    parser.add_argument("--json", metavar="OUT", help="write the plan here (caramel.plan/1), or with --strategy auto "
                        "the ranking (caramel.recommendation/1)")


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    cluster = cluster_from_args(args)
    if args.strategy is not None or args.candidates is not None or args.approximate:
        return _recommend(args, profile, cluster)
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


def _recommend(args: argparse.Namespace, profile, cluster) -> int:
    """`--strategy auto`: rank the candidates by their simulated step and name the fastest."""
    if args.strategy != "auto":
        raise CaramelError(f"--strategy {args.strategy!r}: plan recommends with --strategy auto; to simulate one "
                           "strategy use `caramel simulate --strategy SPEC`"
                           if args.strategy is not None else "--candidates and --approximate need --strategy auto")
    specs = ([c.strip() for c in args.candidates.split(";") if c.strip()] if args.candidates
             else candidates(cluster.world_size, approximate=args.approximate))
    if not specs:
        raise CaramelError("--candidates is empty; expected ';'-separated strategy specs, e.g. ddp;caramel;ps")
    preds = predict(profile, cluster, specs)
    best = recommend(preds, approximate=args.approximate)
    print(f"strategies for {profile.model} on {cluster.world_size} workers, {format_rate(cluster.bandwidth_bps)} "
          f"(simulated, fastest first)")
    ranked = sorted(preds, key=lambda p: (p.step_time_s is None, p.step_time_s or 0.0))
    width = max(len(p.strategy) for p in preds)
    for p in ranked:
        mark = "*" if best is not None and p.strategy == best.strategy else " "
        what = f"{p.step_time_s * 1e3:9.2f} ms" if p.step_time_s is not None else f"  not modelled: {p.error}"
        note = "" if p.exact else "  (approximate: trains a different model than DDP)"
        if p.ignores:
            note += f"  (not ranked: its simulator ignores the cluster's {', '.join(p.ignores)})"
        print(f" {mark} {p.strategy.ljust(width)} {what}{note}")
    if best is None:
        raise CaramelError("no candidate could be simulated on this profile and cluster (see the reasons above)")
    print(f"recommended: {best.strategy}")
    if args.json:
        write_json(args.json, {"format": format_tag("recommendation"), "model": profile.model,
                               "cluster": cluster.to_dict(), "approximate": args.approximate,
                               "recommended": best.strategy, "predictions": [p.to_dict() for p in preds]})
        print(f"wrote {args.json}")
    return 0
