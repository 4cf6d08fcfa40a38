"""Command-line pieces shared by `caramel simulate` and `caramel plan`: where the profile comes
from, which cluster to assume, and planner options given as `--option key=value`."""
from __future__ import annotations

import argparse
import re
from typing import Any

from caramel.topology.spec import COLLECTIVES, TOPOLOGIES, ClusterSpec, WorkerSpec
from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.options import parse_value
from caramel.units import parse_duration_arg_s, parse_rate_bps

SYNTHETIC_HELP = "resnet50 (ResNet-50 shapes) or chainN (N equal-ish layers, e.g. chain200)"


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", metavar="P.json", help="a ModelProfile file (caramel profile --json OUT)")
    src.add_argument("--synthetic", metavar="NAME", help=f"a built-in synthetic profile: {SYNTHETIC_HELP}")


def add_cluster_arguments(parser: argparse.ArgumentParser, default_workers: int = 8) -> None:
    g = parser.add_argument_group("cluster (a --cluster file, or flags; flags override the file; "
                                  "times with their unit: s, ms or us)")
    g.add_argument("--cluster", metavar="SPEC.json", help="a ClusterSpec file (caramel cluster probe --json OUT)")
    g.add_argument("--workers", type=int, help=f"number of workers (default {default_workers})")
    g.add_argument("--bandwidth", help="link rate per worker, tc syntax: 100mbit, 10gbit (default 1gbit)")
    g.add_argument("--latency", help="per-message latency: 50us, 1ms (default 50us)")
    g.add_argument("--queued-latency", help="per-message latency of a collective queued behind another "
                   "(ClusterSpec.queued_latency_s): 20us; default: the file's, else the same as --latency")
    g.add_argument("--collective-cpu", help="pause each collective makes in a worker's compute, its CPU time "
                   "times the ranks per shared core (ClusterSpec.collective_cpu_s): 300us; default: the file's, else 0")
    g.add_argument("--collective", choices=COLLECTIVES, help="all-reduce algorithm (default ring)")
    g.add_argument("--topology", choices=TOPOLOGIES, help="network topology (default switch)")
    g.add_argument("--servers", type=int, help="parameter servers for --collective ps (default 1)")
    parser.set_defaults(_default_workers=default_workers)


def load_profile(args: argparse.Namespace) -> ModelProfile:
    """The profile named by --profile or --synthetic."""
    if args.profile:
        return ModelProfile.load(args.profile)
    from caramel.sim.synthetic import resnet50_profile, synthetic_profile

    name = args.synthetic.strip().lower()
    if name == "resnet50":
        return resnet50_profile()
    m = re.fullmatch(r"chain(\d+)", name)
    if m and int(m.group(1)) >= 1:
        return synthetic_profile(int(m.group(1)), name=name)
    raise CaramelError(f"--synthetic {args.synthetic!r} is not known; expected {SYNTHETIC_HELP}")


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    """A ClusterSpec from --cluster and/or the flags."""
    spec = ClusterSpec.load(args.cluster) if args.cluster else None
    workers = args.workers if args.workers is not None else (None if spec else args._default_workers)
    if workers is not None and workers < 1:
        raise CaramelError(f"--workers must be a positive integer, got {workers}")
    if args.servers is not None and args.servers < 1:
        raise CaramelError(f"--servers must be a positive integer, got {args.servers}")
    bandwidth = parse_rate_bps(args.bandwidth) if args.bandwidth is not None else (spec.bandwidth_bps if spec else 1e9)
    latency = parse_duration_arg_s(args.latency, "--latency") if args.latency is not None else (spec.latency_s if spec else 50e-6)
    queued = (parse_duration_arg_s(args.queued_latency, "--queued-latency") if getattr(args, "queued_latency", None) is not None
              else (spec.queued_latency_s if spec else None))
    cpu = (parse_duration_arg_s(args.collective_cpu, "--collective-cpu") if getattr(args, "collective_cpu", None) is not None
           else (spec.collective_cpu_s if spec else 0.0))
    if spec is not None and (workers is None or workers == spec.world_size):
        worker_list = spec.workers
    else:
        worker_list = [WorkerSpec(f"w{i}") for i in range(workers)]
    return ClusterSpec(
        workers=worker_list,
        bandwidth_bps=bandwidth,
        latency_s=latency,
        topology=args.topology or (spec.topology if spec else "switch"),
        collective=args.collective or (spec.collective if spec else "ring"),
        num_servers=args.servers or (spec.num_servers if spec else 1),
        meta=dict(spec.meta) if spec else {},
        queued_latency_s=queued,
        collective_cpu_s=cpu,
        compute_slowdown=spec.compute_slowdown if spec else 1.0,
        reduce_cpu=spec.reduce_cpu if spec else "none",
        reduce_buckets=spec.reduce_buckets if spec else "layers",
        **(spec.sharing_on(len(worker_list)) if spec else {}),
    )


def add_option_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="planner option, e.g. bucket_cap_mb=5 (repeatable)")


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings to a dict; values become int, float or bool where they read as one."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CaramelError(f"--option {pair!r} must look like key=value, e.g. bucket_cap_mb=5")
        out[key.strip()] = parse_value(value)
    return out
