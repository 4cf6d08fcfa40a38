"""Shared pieces for the cluster tests: host snapshots, skip reasons, a tiny TCP throughput meter.

Other engineers may run their own emulated clusters on this host at the same time, so host
snapshots compare everything *except* other clusters' `crm*` objects, and separately check that
nothing named after the cluster under test remains.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from caramel.cluster import netns

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CLUSTER_NAME = re.compile(r"crm[0-9a-f]{6}")


def root_skip_reason() -> str | None:
    sup = netns.support()
    return None if sup.ok else f"emulated cluster tests need root and iproute2: {sup.reason}"


needs_root = pytest.mark.skipif(root_skip_reason() is not None, reason=root_skip_reason() or "")


def host_objects() -> dict[str, set[str]]:
    """Namespaces, host links and /etc/netns entries on this host."""
    etc = set(os.listdir(netns.ETC_NETNS)) if os.path.isdir(netns.ETC_NETNS) else set()
    return {"netns": set(netns.list_netns()), "links": set(netns.list_links()), "etc": etc}


def foreign(objs: dict[str, set[str]]) -> dict[str, set[str]]:
    """Objects that are not any Caramel cluster's (must never change)."""
    return {k: {n for n in v if not _CLUSTER_NAME.match(n)} for k, v in objs.items()}


def named(objs: dict[str, set[str]], prefix: str) -> set[str]:
    """Every object whose name starts with `prefix`."""
    return {n for v in objs.values() for n in v if n.startswith(prefix)}


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# A sender/receiver pair without torch, so it starts in milliseconds: the receiver listens in one
# namespace, the sender pushes `nbytes` and the receiver prints the rate it saw, in bits/s.
TCP_METER = r"""
import socket, sys, time
mode = sys.argv[1]
if mode == "recv":
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[2], int(sys.argv[3]))); srv.listen(1)
    print("LISTENING", flush=True)
    conn, _ = srv.accept(); total = 0; t0 = None
    while True:
        buf = conn.recv(1 << 20)
        if not buf:
            break
        if t0 is None:
            t0 = time.perf_counter()
        total += len(buf)
    print(f"RATE {total * 8 / (time.perf_counter() - t0)}", flush=True)
else:
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=30)
    data = b"x" * (1 << 16); left = int(sys.argv[4])
    while left > 0:
        n = s.send(data[: min(left, len(data))]); left -= n
    s.close()
"""


def tcp_rate_bps(cluster, src: int, dst: int, nbytes: int, port: int = 5201) -> float:
    """Throughput from worker `src` to worker `dst` over the emulated links, in bits/s."""
    recv = cluster.exec(dst, [sys.executable, "-c", TCP_METER, "recv", cluster.address(dst), str(port)],
                        stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "LISTENING"
        send = cluster.exec(src, [sys.executable, "-c", TCP_METER, "send", cluster.address(dst), str(port), str(nbytes)])
        assert send.wait(timeout=60) == 0
        out, _ = recv.communicate(timeout=30)
    finally:
        for p in (recv,):
            if p.poll() is None:
                p.kill()
                p.wait()
    line = [ln for ln in out.splitlines() if ln.startswith("RATE")]
    assert line, out
    return float(line[0].split()[1])


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def qdisc_drops(dev: str, ns: str | None = None) -> int:
    """Packets the tbf on `dev` has dropped so far."""
    import json

    cmd = ["tc", "-s", "-j"] + (["-n", ns] if ns else []) + ["qdisc", "show", "dev", dev]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return sum(q.get("drops", 0) for q in out if q.get("kind") == "tbf")
