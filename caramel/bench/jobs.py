"""One launch function for bench jobs: the emulated cluster when it can shape links, else loopback.

`launch_job()` starts `python -m caramel.bench.harness JOB OUT` on N workers and waits, under
the cluster's supervisor: a wall-clock limit, the others stopped shortly after one worker fails,
every worker's process group killed on timeout or Ctrl-C. On the emulated
cluster (network namespaces, links shaped with tc) the bandwidth is real; on loopback
(plain local processes) it is not shaped at all, and every record says so in `network`.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caramel.errors import CaramelError
from caramel.jsonio import read_json, write_json

HARNESS_MODULE = "caramel.bench.harness"
NETWORKS = ("auto", "cluster", "loopback")
LOOPBACK = "loopback (unshaped)"


@dataclass
class LaunchResult:
    returncode: int
    raw: dict[str, Any] | None
    network: str
    log_tail: str
    trace_applied: list[dict[str, Any]] | None = None
    """with a bandwidth trace: the rate changes the controller made (`TraceController.applied`)"""


def _emulated_cluster_class():
    """The emulated cluster's class when that part of Caramel is installed, else None."""
    try:
        from caramel.cluster.emulated import EmulatedCluster
    except ImportError:
        return None
    return EmulatedCluster


def choose_network(requested: str, bandwidth: str | None) -> str:
    """`cluster` or `loopback`: the cluster whenever a bandwidth is asked for (it falls back by itself)."""
    if requested not in NETWORKS:
        raise CaramelError(f"--network {requested!r}: expected one of {', '.join(NETWORKS)}")
    if requested == "loopback" or bandwidth is None:
        if requested == "cluster":
            raise CaramelError("--network cluster needs --bandwidth (the rate to shape each link to)")
        return "loopback"
    if _emulated_cluster_class() is None:
        if requested == "cluster":
            raise CaramelError("--network cluster: the emulated cluster (caramel.cluster.emulated) is not installed")
        return "loopback"
    return "cluster"


def launch_job(job: dict[str, Any], workers: int, bandwidth: str | None, network: str,
               timeout_s: float, log=None, strict: bool = False, mtu: int | str = "auto",
               slow_link: list | None = None, trace: list[dict[str, Any]] | None = None,
               nproc_per_node: int = 1) -> LaunchResult:
    """Run one bench job on `workers` workers (hosts, each with `nproc_per_node` ranks on one
    shaped link; cluster only); returns rank 0's raw results (None on failure).

    On the cluster, `strict` makes a host that cannot build namespaces an error instead of a
    fallback to loopback, and `mtu` is the links' MTU (`ClusterConfig.mtu`; the network's
    description names the one used). `slow_link` `[rank, factor]` shapes that worker's link at
    `bandwidth` / factor (cluster only: on loopback there is no link to slow). `trace`: the
    resolved phases of a bandwidth trace (`BandwidthTrace.resolve`), applied to the links during
    the measured rounds; it needs the emulated cluster, and `bandwidth` should be phase 0's rate.
    """
    log = log if log is not None else sys.stderr
    with tempfile.TemporaryDirectory(prefix="caramel-bench-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "raw.json"
        target = ["-m", HARNESS_MODULE, str(job_path), str(out_path)]
        applied = None
        if trace is not None:
            if network != "cluster":
                raise CaramelError("a bandwidth trace changes the emulated cluster's links; it cannot run on "
                                   f"{network} (use --network cluster, as root)")
            job = dict(job, bandwidth_trace={"phases": trace, "marker": str(Path(tmp) / "trace-start")})
        if network == "cluster":
            rc, tail, net, applied = _run_on_cluster(job, job_path, workers, bandwidth, target, timeout_s, log,
                                                     strict or trace is not None or nproc_per_node > 1, mtu,
                                                     slow_link, nproc_per_node)
        else:
            if nproc_per_node > 1:
                raise CaramelError(f"{nproc_per_node} ranks per host need the emulated cluster (hosts sharing a "
                                   f"shaped link); this job runs on {LOOPBACK}")
            if slow_link:
                raise CaramelError(f"a slow link ({slow_link}) needs the emulated cluster; this job runs on {LOOPBACK}")
            net = LOOPBACK
            write_json(job_path, dict(job, network=net))
            rc, tail = _run_loopback(workers, target, timeout_s, log)
        raw = read_json(out_path, "bench_raw") if rc == 0 and out_path.exists() else None
        return LaunchResult(rc, raw, net, tail, applied)


def _run_loopback(workers: int, target: list[str], timeout_s: float, log) -> tuple[int, str]:
    """The workers as plain local processes on 127.0.0.1."""
    from caramel.cluster.local import run_local

    rc, nodes = run_local(workers, target, timeout_s, out=log, threads=1)
    return rc, "".join(nodes[0].lines[-40:])


def _run_on_cluster(job: dict[str, Any], job_path: Path, workers: int, bandwidth: str | None, target: list[str],
                    timeout_s: float, log, strict: bool, mtu: int | str,
                    slow_link: list | None = None, nproc_per_node: int = 1) -> tuple[int, str, str, list | None]:
    from caramel.bench.hetero import link_rates_bps
    from caramel.cluster.config import ClusterConfig, auto_mtu
    from caramel.units import format_rate, parse_rate_bps

    cls = _emulated_cluster_class()
    assert cls is not None and bandwidth is not None, "choose_network() returned cluster without a cluster or a rate"
    rates = link_rates_bps(parse_rate_bps(bandwidth), workers, slow_link)
    if slow_link and str(mtu).strip() == "auto":
        mtu = auto_mtu(min(rates))  # ClusterConfig's advice for a link slowed later: the slowest rate's MTU
    config = ClusterConfig(workers=workers, bandwidth_bps=bandwidth, fallback="error" if strict else "local", mtu=mtu)
    from caramel.cluster.local import worker_env

    env = {k: v for k, v in worker_env(threads=1).items() if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED")}
    with cls(config) as cluster:
        net = f"netns+tc {bandwidth} (mtu {config.mtu})" if cluster.mode == "netns" else LOOPBACK
        if nproc_per_node > 1:
            net += f", {nproc_per_node} ranks per host"
        if slow_link:
            cluster.set_bandwidth(slow_link[0], rates[slow_link[0]])  # an error on the loopback fallback
            net += f", worker {slow_link[0]}'s link {format_rate(rates[slow_link[0]])}"
        write_json(job_path, dict(job, network=net))
        controller = None
        if job.get("bandwidth_trace"):
            from caramel.bench.trace_control import TraceController

            def set_rate(bps: float) -> None:  # a slow link stays that many times slower than the others
                for i, r in enumerate(link_rates_bps(bps, workers, slow_link)):
                    cluster.set_bandwidth(i, r)
            spec = job["bandwidth_trace"]
            controller = TraceController(spec["phases"], spec["marker"], set_rate, log=log)
            controller.start()
        try:
            rc = cluster.run([sys.executable] + target, nproc_per_node=nproc_per_node, env=env, timeout_s=timeout_s,
                             out=log)
        finally:
            if controller is not None:
                controller.stop()
                controller.join(timeout=30.0)
    return int(rc), "", net, controller.applied if controller is not None else None
