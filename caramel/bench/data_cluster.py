"""The data bench on the emulated cluster (`caramel bench --data DIR --network cluster`): the
store is a real `caramel data serve` process on its own host of a `caramel cluster`, behind a
tc-shaped link, and every rank runs in a host (network namespace) of its own, so every byte a
rank reads crosses the kernel's emulated network rather than the server's token bucket.

    bridge ── veth (tbf rank_rate) ── rank 0's namespace   (rank process, its loader workers)
          ── veth (tbf rank_rate) ── rank 1's namespace
          ── veth (tbf store_rate) ── store namespace: `ip netns exec ... caramel data serve DIR`

The store's link is shaped in both directions at `store_rate_bps`, with the MTU `auto_mtu`
picks for that rate (so its token bucket stays at 1 ms of traffic); the ranks' links at
`rank_rate_bps` (fast: the store's link is the one under test). The per-request delay is the
server's own (`--latency`, as on loopback), not netem, so the two runs differ in the link only.

The rank processes are spawned by the bench as on loopback and move themselves into their
namespace (`setns`) before anything else, so the bench's barrier and queue (pipes, not sockets)
still reach them; their loader workers, forked later, inherit the namespace. Leaving the block
stops the server (SIGINT: it prints what it served, the cross-check of the ranks' counts), and
the cluster's teardown kills whatever still runs in its namespaces and deletes them.
"""
from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from caramel.errors import CaramelError

STORE_PORT = 8000
READY_TIMEOUT_S = 60.0
CLONE_NEWNET = 0x40000000


@dataclass
class ClusterStore:
    """Where the store answers and where each rank lives."""

    url: str
    rank_hosts: list[tuple[str, str]]  # (namespace, interface) of each rank
    info: dict[str, Any]
    index_bytes: int
    served: dict[str, int] = field(default_factory=dict)  # the server's own totals, once it stopped


def enter_host(namespace: str, interface: str) -> None:
    """Move this process into `namespace` (a named one, /run/netns) and make gloo use `interface`.
    Called first thing in a spawned rank process: threads started earlier would stay behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    except OSError as e:
        raise CaramelError(f"cannot enter network namespace {namespace}: /run/netns/{namespace}: {e.strerror} "
                           f"(the bench's cluster was torn down, or never made)") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise CaramelError(f"cannot enter network namespace {namespace}: {os.strerror(err)}")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = interface


def log_tail(path: str | os.PathLike, lines: int = 5) -> str:
    """The last `lines` lines of the server's error log ('' when it wrote none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 64 * 1024))  # a long log: its end is what tells
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _wait_ready(proc: subprocess.Popen, timeout_s: float, log_path: str | os.PathLike) -> str:
    """The server's "serving DIR at URL" line; the end of its error log if it exits or stays silent."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("serving "):
                return line.strip()
            if line == "" and proc.poll() is not None:
                break
    proc.kill()
    proc.wait()
    tail = log_tail(log_path, 1)
    raise CaramelError(f"the store's server in the cluster did not start within {timeout_s:g} s: "
                       f"{tail or f'exit code {proc.poll()}'} (its log: {log_path})")


def _stop(proc: subprocess.Popen) -> dict[str, int]:
    """SIGINT the server (it prints its totals and exits); kill it if it does not."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    m = re.search(r"served (\d+) requests, (\d+) bytes", out or "")
    return {"requests": int(m.group(1)), "bytes": int(m.group(2))} if m else {}


@contextmanager
def cluster_store(directory: str, ranks: int, store_rate_bps: float, store_latency_s: float,
                  rank_rate_bps: float, log_path: str | os.PathLike) -> Iterator[ClusterStore]:
    """An emulated cluster of `ranks` rank hosts and one store host serving `directory`; the
    server's stderr goes to `log_path` (a pipe nobody reads while the bench runs could fill and
    block the server), and its tail is printed if the block fails."""
    from caramel.cluster.config import ClusterConfig, auto_mtu
    from caramel.cluster.emulated import EmulatedCluster

    assert store_rate_bps, "run_data_bench refuses --network cluster without --store-rate"
    config = ClusterConfig(workers=ranks + 1, bandwidth_bps=rank_rate_bps, fallback="error", quiet=True,
                           mtu=auto_mtu(min(store_rate_bps, rank_rate_bps)))
    with EmulatedCluster(config) as cluster:
        store_host = ranks
        cluster.set_bandwidth(store_host, store_rate_bps)
        address = cluster.address(store_host)
        argv = [sys.executable, "-m", "caramel.cli", "data", "serve", str(directory), "--host", address,
                "--port", str(STORE_PORT), "--latency", f"{store_latency_s * 1e3:g}ms"]
        with open(log_path, "w") as log:  # the child holds its own copy of the descriptor
            proc = cluster.exec(store_host, argv, stdout=subprocess.PIPE, stderr=log, text=True)
        store = ClusterStore(f"http://{address}:{STORE_PORT}",
                             [(config.netns(r), config.worker_veth(r)) for r in range(ranks)],
                             {**cluster.info(), "store_host": config.netns(store_host), "store_command": " ".join(argv)},
                             os.path.getsize(os.path.join(directory, "index.json")))
        try:
            _wait_ready(proc, READY_TIMEOUT_S, log_path)
            yield store
        except BaseException:
            tail = log_tail(log_path)
            if tail:
                print(f"the store's server log ({log_path}) ends:\n{tail}", file=sys.stderr, flush=True)
            raise
        finally:
            store.served = _stop(proc)


def cluster_report(store: ClusterStore, results: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """What the report says of the cluster run, once it is torn down: the hosts and links, the
    server's own totals beside what the ranks' loader workers counted (the server also sent
    each rank's index once per mode and round, which no worker counts), and any namespace of
    the cluster still there (none expected)."""
    from caramel.cluster.netns import list_netns

    counted = sum(sum(r.epoch_remote_bytes) for r in results.values())
    index_reads = cfg.ranks * cfg.rounds * len(cfg.modes)
    prefix = store.info["prefix"]
    return {"store_url": store.url, "store_host": store.info["store_host"], "store_command": store.info["store_command"],
            "store_rate_bps": cfg.store_rate_bps, "rank_rate_bps": cfg.rank_rate_bps, "mtu": store.info["mtu"],
            "latency": "per request in the server (--latency), as on loopback; no netem",
            "hosts": store.info.get("namespaces"), "addresses": store.info.get("addresses"),
            "server_totals": store.served, "counted_store_bytes": counted, "index_reads": index_reads,
            "index_bytes": store.index_bytes,
            "server_minus_counted_bytes": (store.served["bytes"] - counted - index_reads * store.index_bytes)
            if store.served else None,
            "namespaces_left": [ns for ns in list_netns() if ns.startswith(prefix)]}
