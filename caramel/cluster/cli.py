"""`caramel cluster`: run, probe, list and clean up emulated clusters.

    caramel cluster run --workers 2 --bandwidth 1gbit [--nproc-per-node K] -- python train.py --lr 0.1
    caramel cluster probe --workers 2 --bandwidth 500mbit --json cluster.json
    caramel cluster list [--json OUT]
    caramel cluster cleanup [--dry-run] [--json OUT]
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.units import format_rate, parse_duration_arg_s, parse_duration_s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")

    def cluster_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workers", "-n", required=True, help="number of emulated nodes (network namespaces)")
        p.add_argument("--bandwidth", "-b", default="1gbit", help="link rate per worker, tc syntax (e.g. 1gbit, 500mbit); default 1gbit")
        p.add_argument("--latency", default="0", help="added one-way latency with its unit (s, ms, us): 1ms; needs netem in the kernel, else reported as not emulated")
        p.add_argument("--mtu", default="auto",
                       help="link MTU in bytes, or auto (default): the largest frame within 1 ms of traffic at the rate, "
                            "9000-65535 (less per-packet kernel work on the host's own cores)")
        p.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (default 1)")
        p.add_argument("--fallback", choices=("local", "error"), default="local",
                       help="without root or iproute2: 'local' runs plain workers on loopback (default), 'error' stops")
        p.add_argument("--state-dir", default=None, help="where cluster state files live (default /run/caramel)")
        p.add_argument("--timeout", default=None, help="stop the job after this long (e.g. 10m); exit code 124")

    run = sub.add_parser("run", help="run a command as a multi-node torchrun job on an emulated cluster",
                         description="Build the cluster, run `torchrun ... CMD` in every namespace, tear everything down.")
    cluster_options(run)
    run.add_argument("--max-restarts", type=int, default=0,
                     help="restart all nodes together up to this many times after a failure (c10d rendezvous; default 0)")
    run.add_argument("--ps-servers", type=int, default=0, metavar="N",
                     help="of the workers x nproc-per-node ranks, the last N are dedicated parameter servers of the "
                          "script's `ps` strategy (sets CARAMEL_PS_SERVERS=N; the last node(s) here; default 0)")
    run.add_argument("--json", metavar="OUT", help="write the cluster description and exit code here")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python train.py [args...]")

    probe = sub.add_parser("probe", help="fit latency and bandwidth from real all-reduces; write a ClusterSpec",
                           description="Time all-reduces over a sweep of sizes and fit t = 2(n-1)a + 2(n-1)/n*S/B.")
    cluster_options(probe)
    probe.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes (default: 4 KiB .. ~80 ms of traffic)")
    probe.add_argument("--reps", type=int, default=5, help="timed repetitions per size (default 5)")
    probe.add_argument("--json", metavar="OUT", help="write the fitted caramel.cluster/1 ClusterSpec here")

    lst = sub.add_parser("list", help="show Caramel clusters (running, dead, orphaned) on this host")
    lst.add_argument("--state-dir", default=None)
    lst.add_argument("--json", metavar="OUT")

    clean = sub.add_parser("cleanup", help="remove what dead clusters left behind (only ours, only dead owners)")
    clean.add_argument("--state-dir", default=None)
    clean.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    clean.add_argument("--json", metavar="OUT")
    parser.set_defaults(_parser=parser)


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "cluster_command", None)
    if action is None:
        args._parser.print_help()
        return 2
    return {"run": _run, "probe": _probe, "list": _list, "cleanup": _cleanup}[action](args)


def _config(args: argparse.Namespace):
    from caramel.cluster.config import ClusterConfig

    if args.nproc_per_node < 1:
        raise CaramelError(f"--nproc-per-node must be a positive integer, got {args.nproc_per_node}")
    return ClusterConfig(workers=args.workers, bandwidth_bps=args.bandwidth,
                         latency_s=parse_duration_arg_s(args.latency, "--latency"),
                         mtu=args.mtu, fallback=args.fallback, state_dir=args.state_dir)


def _timeout(args: argparse.Namespace) -> float | None:
    return None if args.timeout is None else parse_duration_s(args.timeout)


def _run(args: argparse.Namespace) -> int:
    from caramel.cluster.emulated import EmulatedCluster
    from caramel.cluster.launch import torchrun_target

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    config = _config(args)
    timeout_s = _timeout(args)
    torchrun_target(cmd)  # a missing script fails here, before the host is touched
    if args.max_restarts < 0:
        raise CaramelError(f"--max-restarts must be an integer >= 0, got {args.max_restarts}")
    env = _ps_servers_env(args.ps_servers, config.workers * args.nproc_per_node)
    start = time.time()
    with EmulatedCluster(config) as cluster:
        print(f"caramel cluster: {cluster.describe()}", file=sys.stderr)
        rc = cluster.run(cmd, nproc_per_node=args.nproc_per_node, env=env, timeout_s=timeout_s,
                         max_restarts=args.max_restarts)
        info = cluster.info()
    if args.json:
        write_json(args.json, {"format": format_tag("cluster-run"), "cluster": info, "command": cmd,
                               "nproc_per_node": args.nproc_per_node, "exit_code": rc, "wall_s": time.time() - start})
    if rc != 0:
        print(f"caramel cluster: job failed with exit code {rc}", file=sys.stderr)
    return rc


def _ps_servers_env(servers: int, ranks: int) -> dict[str, str] | None:
    """CARAMEL_PS_SERVERS for the job's ranks: the last `servers` of them only serve (`ps`)."""
    from caramel.strategies.ps.server import SERVERS_ENV

    if servers == 0:
        return None
    if not 0 < servers < ranks:
        raise CaramelError(f"--ps-servers {servers}: the job has {ranks} ranks (--workers x --nproc-per-node) and "
                           f"at least one must be a worker; expected 0 to {ranks - 1}")
    return {SERVERS_ENV: str(servers)}


def _probe(args: argparse.Namespace) -> int:
    from caramel.cluster.emulated import EmulatedCluster
    from caramel.topology.probe import probe_cluster

    config = _config(args)
    sizes = None
    if args.sizes:
        try:
            sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        except ValueError:
            raise CaramelError(f"--sizes {args.sizes!r} must be comma-separated byte counts, e.g. 4096,65536,1048576") from None
    timeout_s = _timeout(args) or 600.0
    # Everything probe_cluster() would reject, rejected before the host is touched.
    if args.reps < 1:
        raise CaramelError(f"--reps must be a positive integer, got {args.reps}")
    if sizes is not None and (len(set(sizes)) < 2 or min(sizes) < 4):
        raise CaramelError(f"--sizes {args.sizes!r} needs at least two different sizes of at least 4 bytes")
    if config.workers * args.nproc_per_node < 2:
        raise CaramelError(f"probing needs at least 2 processes in total, got --workers {config.workers} x --nproc-per-node {args.nproc_per_node}")
    with EmulatedCluster(config) as cluster:
        print(f"caramel cluster: {cluster.describe()}", file=sys.stderr)
        spec, fit = probe_cluster(cluster, sizes_bytes=sizes, reps=args.reps, nproc_per_node=args.nproc_per_node,
                                  timeout_s=timeout_s, out=sys.stderr)
    print(f"{'bytes':>12}  {'measured ms':>12}  {'fitted ms':>10}")
    for s, t in zip(fit.sizes_bytes, fit.times_s):
        print(f"{s:>12}  {t * 1e3:>12.3f}  {fit.predict_s(s) * 1e3:>10.3f}")
    print(f"fit: bandwidth {format_rate(fit.bandwidth_bps)} (nominal {format_rate(min(cluster.bandwidth_bps))}), "
          f"latency {fit.latency_s * 1e6:.1f} us, world size {fit.world_size}, max relative error {fit.max_rel_error:.0%}")
    if fit.outliers:
        print(f"left out of the fit as outliers (host noise): {', '.join(f'{b} B at {t * 1e3:.2f} ms' for b, t in fit.outliers)}")
    if spec.queued_latency_s is not None:
        q = spec.meta["probe"]["queued"]
        print(f"queued behind another collective: latency {spec.queued_latency_s * 1e6:.1f} us per message "
              f"({q['queued_pieces']} back-to-back pieces of {q['queued_piece_bytes']} B took "
              f"{q['queued_extra_s'] * 1e3:.3f} ms more each than one all-reduce of them all)")
        if spec.collective_cpu_s:
            share = q.get("core_share", 1.0)
            how = (f"what each of those pieces added to a worker's process CPU time ({q['queued_cpu_s'] * 1e3:.3f} ms), "
                   f"times the {share:g} workers per core that share this host's cores" if share > 1 else
                   "what each of those pieces added to a worker's process CPU time")
            print(f"compute pause per collective on each worker: {spec.collective_cpu_s * 1e3:.3f} ms ({how})")
    if args.json:
        spec.save(args.json)
        print(f"wrote {args.json}")
    return 0


def _state_dir(args: argparse.Namespace) -> str:
    from caramel.cluster.config import default_state_dir

    return args.state_dir or default_state_dir()


def _require_host_tools() -> None:
    from caramel.cluster import netns

    sup = netns.support()
    if not sup.ok:
        raise CaramelError(f"cannot inspect network namespaces: {sup.reason}; run as root with iproute2 installed")


def _list(args: argparse.Namespace) -> int:
    from caramel.cluster.leftovers import inventory

    _require_host_tools()
    records, problems = inventory(_state_dir(args))
    for p in problems:
        print(f"caramel cluster: unreadable state file: {p}", file=sys.stderr)
    if not records:
        print("no Caramel clusters on this host")
    for r in records:
        owner = f"pid {r.pid}" if r.pid is not None else "no state file"
        print(f"{r.prefix}  {r.status:<8} {owner:<14} namespaces: {', '.join(r.namespaces) or '-'}  links: {', '.join(r.links) or '-'}")
    if args.json:
        _write(args.json, "cluster-list", {"clusters": [r.to_dict() for r in records], "problems": problems})
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from caramel.cluster.leftovers import cleanup_dead, inventory

    _require_host_tools()
    state_dir = _state_dir(args)
    cleaned, problems = cleanup_dead(state_dir, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for prefix in cleaned:
        print(f"{verb} dead cluster {prefix}")
    records, _ = inventory(state_dir)
    orphans = [r.prefix for r in records if r.status == "orphan"]
    for prefix in orphans:
        print(f"left alone {prefix}: no state file, so it cannot be proven ours; remove it by hand if you are sure")
    for p in problems:
        print(f"caramel cluster: {p}", file=sys.stderr)
    if not cleaned and not orphans:
        print("nothing to clean up")
    if args.json:
        _write(args.json, "cluster-cleanup", {"cleaned": cleaned, "dry_run": args.dry_run, "orphans": orphans, "problems": problems})
    return 1 if problems else 0


def _write(path: str, kind: str, data: dict[str, Any]) -> None:
    data = dict(data)
    data["format"] = format_tag(kind)
    write_json(path, data)
