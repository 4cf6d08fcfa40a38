"""Thin, careful wrappers over `ip` and `tc`: namespaces, veth pairs, a bridge, shaping.

Nothing here decides *what* to create; `EmulatedCluster` does, and records every object in its
state file before creating it. `destroy()` removes exactly the objects it is given, and treats
"already gone" as success, so teardown is idempotent and safe to call from signal handlers,
atexit and `caramel cluster cleanup` alike.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from caramel.errors import CaramelError

# The benchmarking range (RFC 2544): never a user's real network.
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
SUBNETS_PER_BENCH_NET = 512  # /24s in a /15
CMD_TIMEOUT_S = 20.0


class ClusterError(CaramelError):
    """The host could not build or tear down the emulated cluster (an `ip`/`tc` command failed)."""


@dataclass
class Support:
    """Whether this host can make network namespaces, and if not, why (one line)."""

    ok: bool
    reason: str = ""


def support() -> Support:
    """Root and iproute2 (`ip`, `tc`) are needed; anything else is reported, not raised."""
    if os.name != "posix" or not os.path.isdir("/proc/self/ns"):
        return Support(False, "network namespaces need Linux")
    if os.geteuid() != 0:
        return Support(False, f"network namespaces need root (running as uid {os.geteuid()})")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return Support(False, f"iproute2 is missing ({', '.join(missing)} not found on PATH)")
    return Support(True)


DUMP_RETRIES = 5  # `ip link show` again when the kernel says the dump was interrupted


def sh(args: list[str], *, check: bool = True, timeout_s: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one ip/tc command; a failure raises ClusterError with the command and its message."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(args)}` did not finish within {timeout_s:g} s") from None
    except FileNotFoundError:
        raise ClusterError(f"`{args[0]}` not found; the emulated cluster needs iproute2") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise ClusterError(f"`{' '.join(args)}` failed: {msg[-1] if msg else f'exit code {proc.returncode}'}")
    return proc


def list_netns() -> list[str]:
    """Names of the named network namespaces on this host (`ip netns list`)."""
    out = sh(["ip", "netns", "list"]).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())


def list_links(netns: str | None = None) -> list[str]:
    """Interface names in the host namespace (or in `netns`), without the `@peer` suffix."""
    cmd = ["ip", "-o", "link", "show"] if netns is None else ["ip", "-n", netns, "-o", "link", "show"]
    for _ in range(DUMP_RETRIES):
        proc = sh(cmd, check=False)
        # a netlink dump that raced with another process adding or deleting links may miss some
        # (older iproute2 warns and exits 0, newer fails): ask again
        if "interrupted" not in proc.stderr.lower():
            break
    if proc.returncode != 0:
        proc = sh(cmd)  # still failing: raise it with its message
    names = []
    for line in proc.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return sorted(names)


def netns_pids(netns: str) -> list[int]:
    """Processes living in a named namespace (empty when it does not exist)."""
    proc = sh(["ip", "netns", "pids", netns], check=False)
    if proc.returncode != 0:
        return []
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def host_subnets_in_use() -> set[int]:
    """Indices (0..511) of the 198.18.0.0/15 /24s that already have an address or route on the host."""
    used: set[int] = set()
    texts = [sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout,
             sh(["ip", "-4", "route", "show", "table", "all"], check=False).stdout]
    for text in texts:
        for token in text.replace("/", " ").split():
            try:
                addr = ipaddress.ip_address(token)
            except ValueError:
                continue
            if addr in BENCH_NET:
                used.add(subnet_index(addr))
    return used


def subnet_index(addr: ipaddress.IPv4Address) -> int:
    return (int(addr) - int(BENCH_NET.network_address)) >> 8


def subnet_address(index: int, host: int) -> str:
    """Address `host` (1..254) of the `index`-th /24 of 198.18.0.0/15."""
    assert 0 <= index < SUBNETS_PER_BENCH_NET and 1 <= host <= 254
    return str(ipaddress.ip_address(int(BENCH_NET.network_address) + (index << 8) + host))


TBF_QUEUE_S = 0.05  # 50 ms of queue: enough for TCP to keep the link full, small enough not to bloat latency


def tbf_args(bandwidth_bps: float, burst_bytes: int) -> list[str]:
    return ["tbf", "rate", f"{int(bandwidth_bps)}bit", "burst", str(int(burst_bytes)), "latency", f"{TBF_QUEUE_S * 1e3:g}ms"]


def receive_buffer_cap_bytes(bandwidth_bps: float, mtu: int) -> int:
    """The most a TCP receive buffer may grow to on links of `bandwidth_bps`: half the shaper's
    queue, at least 4 MTUs.

    A flow can have no more in flight than its receiver's buffer, so at this cap up to two flows
    into one egress (two process groups, or gloo's two threads) never overflow its tbf queue. At
    rates where 4 MTUs exceed half the queue (below about 11.5 Mbit/s at MTU 9000) that floor
    wins, and a queue can still overflow. Uncapped (Linux lets a buffer grow to 6 MB), a
    collective's bytes overflow a slow link's queue, and a drop at its tail waits for a loss
    probe at twice the queue-inflated round trip, so step times come to depend on the plan
    (docs/results/cluster.md, "Receive buffers"). The buffer holds 25 ms at this rate, more than
    a receiving thread waits for a core; on links faster than `bandwidth_bps`, or with an
    emulated round trip above a few ms (netem), it holds less and can limit a flow below the
    link's rate.
    """
    assert bandwidth_bps > 0 and mtu > 0
    return max(int(bandwidth_bps / 8 * TBF_QUEUE_S / 2), 4 * mtu)


TCP_RMEM = "/proc/sys/net/ipv4/tcp_rmem"


def cap_receive_buffer(netns: str, max_bytes: int) -> bool:
    """Cap TCP receive-buffer autotuning in `netns` at `max_bytes`. False when it cannot be
    set there: /proc/sys read-only (an unprivileged container), or a kernel older than 4.15
    where net.ipv4.tcp_rmem is not per namespace, so the write would change the host's own
    setting (then the host's value is put back). Sockets already grown past the cap keep their
    size."""
    assert max_bytes > 0
    host_before = Path(TCP_RMEM).read_text()
    line = f"{min(4096, max_bytes)} {min(131072, max_bytes)} {max_bytes}"
    ok = sh(["ip", "netns", "exec", netns, "sh", "-c", f"echo '{line}' > {TCP_RMEM}"], check=False).returncode == 0
    if Path(TCP_RMEM).read_text() != host_before:
        Path(TCP_RMEM).write_text(host_before)
        return False
    return ok


def receive_buffer_max_bytes(netns: str) -> int | None:
    """The namespace's tcp_rmem maximum, for checks and tests."""
    proc = sh(["ip", "netns", "exec", netns, "cat", TCP_RMEM], check=False)
    return int(proc.stdout.split()[2]) if proc.returncode == 0 else None


def shape(dev: str, netns: str | None, bandwidth_bps: float, burst_bytes: int,
          latency_s: float = 0.0, netem: bool = False) -> None:
    """Set (or change) the egress shaping of `dev`: tbf at the rate, under netem delay when asked."""
    tc = ["tc"] if netns is None else ["tc", "-n", netns]
    if latency_s > 0 and netem:
        sh(tc + ["qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{latency_s * 1e6:.0f}us"])
        sh(tc + ["qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:"] + tbf_args(bandwidth_bps, burst_bytes))
    else:
        sh(tc + ["qdisc", "replace", "dev", dev, "root", "handle", "1:"] + tbf_args(bandwidth_bps, burst_bytes))


def qdisc_rate_bps(dev: str, netns: str | None = None) -> float | None:
    """The tbf rate currently on `dev` (from `tc -j qdisc show`), for checks and tests."""
    import json

    tc = ["tc", "-j"] if netns is None else ["tc", "-j", "-n", netns]
    proc = sh(tc + ["qdisc", "show", "dev", dev], check=False)
    if proc.returncode != 0:
        return None
    for q in json.loads(proc.stdout or "[]"):
        if q.get("kind") == "tbf":
            return float(q["options"]["rate"]) * 8  # tc -j reports bytes per second
    return None


def kill_netns_processes(netns: str, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process inside a namespace we own, so deleting it frees it."""
    pids = netns_pids(netns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if pids:
                time.sleep(0.05)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


ETC_NETNS = "/etc/netns"
_OWN_NETNS_RE = re.compile(r"crm[0-9a-f]{6}-[a-z0-9]+")


def write_etc_hosts(netns_name: str, text: str) -> None:
    """/etc/netns/<ns>/hosts, which `ip netns exec` shows to processes in that namespace as /etc/hosts."""
    assert _OWN_NETNS_RE.fullmatch(netns_name), netns_name
    d = os.path.join(ETC_NETNS, netns_name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "hosts"), "w") as f:
        f.write(text)


def remove_etc(netns_name: str) -> str | None:
    """Remove /etc/netns/<ns> for one of our namespaces; a message if that fails."""
    if not _OWN_NETNS_RE.fullmatch(netns_name):
        return f"refusing to remove {ETC_NETNS}/{netns_name}: not a Caramel namespace name"
    try:
        shutil.rmtree(os.path.join(ETC_NETNS, netns_name))
    except FileNotFoundError:
        pass
    except OSError as e:
        return f"{ETC_NETNS}/{netns_name}: {e}"
    try:
        os.rmdir(ETC_NETNS)  # only succeeds when empty: no other namespace (ours or not) uses it
    except OSError:
        pass
    return None


def destroy(resources: list[dict]) -> list[str]:
    """Remove the given objects (newest first); return one message per object that could not be removed.

    `resources` entries are `{"kind": "netns"|"link"|"etc", "name": ...}` as recorded at creation
    ("etc" is the /etc/netns/<name> directory of a namespace).
    Objects that are already gone count as removed.
    """
    problems: list[str] = []
    present_ns = set(list_netns())
    present_links = set(list_links())
    # Processes first (a namespace with live processes outlives `ip netns del`), then links, then namespaces.
    for r in reversed(resources):
        if r["kind"] == "netns" and r["name"] in present_ns:
            kill_netns_processes(r["name"])
    for r in reversed(resources):
        if r["kind"] == "link" and r["name"] in present_links:
            proc = sh(["ip", "link", "del", r["name"]], check=False)
            if proc.returncode != 0 and r["name"] in list_links():
                problems.append(f"link {r['name']}: {proc.stderr.strip()}")
    for r in reversed(resources):
        if r["kind"] == "netns" and r["name"] in present_ns:
            proc = sh(["ip", "netns", "del", r["name"]], check=False)
            if proc.returncode != 0 and r["name"] in list_netns():
                problems.append(f"netns {r['name']}: {proc.stderr.strip()}")
    for r in reversed(resources):
        if r["kind"] == "etc":
            msg = remove_etc(r["name"])
            if msg:
                problems.append(msg)
    return problems
