"""Building and tearing down the emulated cluster on the real host (root + iproute2)."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

from caramel.cluster import netns
from caramel.cluster.config import ClusterConfig, auto_mtu, new_prefix
from caramel.cluster.emulated import EmulatedCluster
from caramel.errors import CaramelError
from tests.cluster.cluster_helpers import foreign, host_objects, named, needs_root, qdisc_drops, tcp_rate_bps

pytestmark = [needs_root, pytest.mark.root, pytest.mark.timeout(120)]


def _config(tmp_path, **kw) -> ClusterConfig:
    kw.setdefault("workers", 2)
    kw.setdefault("bandwidth_bps", "100mbit")
    return ClusterConfig(state_dir=str(tmp_path / "state"), quiet=True, **kw)


def test_setup_and_teardown_leave_host_as_before(tmp_path):
    cfg = _config(tmp_path, workers=3, bandwidth_bps="200mbit")
    before = host_objects()
    with EmulatedCluster(cfg) as c:
        during = host_objects()
        assert {cfg.netns(i) for i in range(3)} <= during["netns"]
        assert {cfg.bridge} | {cfg.host_veth(i) for i in range(3)} <= during["links"]
        assert os.path.exists(tmp_path / "state" / f"{cfg.prefix}.json")
        addrs = [ipaddress.ip_address(c.address(i)) for i in range(3)]
        assert all(a in ipaddress.ip_network("198.18.0.0/15") for a in addrs)
        assert len({ipaddress.ip_network(f"{a}/24", strict=False) for a in addrs}) == 1
        for i in range(3):
            # Shaped in both directions: host side (towards the worker) and worker side (from it).
            assert netns.qdisc_rate_bps(cfg.host_veth(i)) == 200e6
            assert netns.qdisc_rate_bps(cfg.worker_veth(i), cfg.netns(i)) == 200e6
            inside = subprocess.run(["ip", "-n", cfg.netns(i), "-br", "addr"], capture_output=True, text=True).stdout
            assert f"{c.address(i)}/24" in inside and "lo" in inside
            lo = subprocess.run(["ip", "-n", cfg.netns(i), "link", "show", "lo"], capture_output=True, text=True).stdout
            assert "UP" in lo
        assert c.info()["latency_emulated"] is False
    after = host_objects()
    assert named(after, cfg.prefix) == set()
    assert foreign(after) == foreign(before)
    assert not os.path.exists(tmp_path / "state" / f"{cfg.prefix}.json")


def test_set_bandwidth_changes_measured_rate(tmp_path):
    cfg = _config(tmp_path, bandwidth_bps="200mbit", mtu=auto_mtu(20e6))  # the slowest rate's MTU
    with EmulatedCluster(cfg) as c:
        # receive buffers hold half of a 50 ms queue at the slowest worker's rate
        assert [netns.receive_buffer_max_bytes(cfg.netns(i)) for i in range(2)] == [625_000] * 2
        fast = tcp_rate_bps(c, 0, 1, nbytes=5_000_000)
        c.set_bandwidth(1, "20mbit")  # cut worker 1's link to a tenth
        assert netns.qdisc_rate_bps(cfg.host_veth(1)) == 20e6
        assert netns.qdisc_rate_bps(cfg.worker_veth(1), cfg.netns(1)) == 20e6
        assert netns.qdisc_rate_bps(cfg.host_veth(0)) == 200e6
        assert [netns.receive_buffer_max_bytes(cfg.netns(i)) for i in range(2)] == [62_500] * 2
        drops = qdisc_drops(cfg.host_veth(1))
        slow = tcp_rate_bps(c, 0, 1, nbytes=1_000_000, port=5202)
        # 1 MB into a 125 KB queue: the capped window never overflows it (uncapped: 28 drops)
        assert qdisc_drops(cfg.host_veth(1)) == drops
        c.set_bandwidth(1, 200e6)
        assert [netns.receive_buffer_max_bytes(cfg.netns(i)) for i in range(2)] == [625_000] * 2
        restored = tcp_rate_bps(c, 1, 0, nbytes=5_000_000, port=5203)
        assert c.bandwidth_bps == [200e6, 200e6]
    assert 0.6 * 200e6 < fast < 1.1 * 200e6, fast
    assert 0.6 * 20e6 < slow < 1.1 * 20e6, slow
    assert 0.6 * 200e6 < restored < 1.1 * 200e6, restored


_UDP_RECV = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 5301)); s.settimeout(10)
print("LISTENING", flush=True)
print("GOT", len(s.recv(65536)), flush=True)
"""
_UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: never fragment
for _ in range(3):  # the first may wait for ARP
    s.sendto(b"x" * int(sys.argv[2]), (sys.argv[1], 5301)); time.sleep(0.2)
"""


def _mtu(dev: str, ns: str | None = None) -> int:
    cmd = ["ip"] + (["-n", ns] if ns else []) + ["-j", "link", "show", dev]
    import json
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)[0]["mtu"]


@pytest.mark.parametrize("mtu", [9000, 1500, "auto"])
def test_links_carry_the_configured_mtu_and_full_frames_pass(tmp_path, mtu):
    cfg = _config(tmp_path, mtu=mtu)
    mtu = cfg.mtu  # auto: 12486 at 100 Mbit/s
    with EmulatedCluster(cfg) as c:
        for i in range(2):
            assert _mtu(cfg.host_veth(i)) == mtu
            assert _mtu(cfg.worker_veth(i), cfg.netns(i)) == mtu
        assert _mtu(cfg.bridge) == mtu
        assert c.info()["mtu"] == mtu
        # a full-size datagram, fragmentation forbidden, crosses the shaped links (tbf's burst holds it)
        recv = c.exec(1, [sys.executable, "-c", _UDP_RECV, c.address(1)], stdout=subprocess.PIPE, text=True)
        try:
            assert recv.stdout.readline().strip() == "LISTENING"
            send = c.exec(0, [sys.executable, "-c", _UDP_SEND, c.address(1), str(mtu - 28)])
            assert send.wait(timeout=30) == 0
            out, _ = recv.communicate(timeout=30)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
        assert out.strip() == f"GOT {mtu - 28}", out
        assert 0.6 * 100e6 < tcp_rate_bps(c, 0, 1, nbytes=2_000_000) < 1.1 * 100e6


def test_set_bandwidth_bad_input(tmp_path):
    with EmulatedCluster(_config(tmp_path)) as c:
        with pytest.raises(CaramelError, match="worker"):
            c.set_bandwidth(2, "10mbit")
        with pytest.raises(CaramelError, match="bandwidth 'slow'"):
            c.set_bandwidth(0, "slow")
        assert netns.qdisc_rate_bps(c.config.host_veth(0)) == 100e6


def test_two_clusters_do_not_collide_and_close_independently(tmp_path):
    a_cfg, b_cfg = _config(tmp_path), _config(tmp_path)
    assert a_cfg.prefix != b_cfg.prefix
    with EmulatedCluster(a_cfg) as a:
        with EmulatedCluster(b_cfg) as b:
            assert a.state.subnet_index != b.state.subnet_index
            assert tcp_rate_bps(b, 0, 1, nbytes=200_000) > 0
        objs = host_objects()
        assert named(objs, b_cfg.prefix) == set()
        assert {a_cfg.netns(0), a_cfg.netns(1)} <= objs["netns"]
        assert tcp_rate_bps(a, 1, 0, nbytes=200_000) > 0
    assert named(host_objects(), a_cfg.prefix) == set()


def test_teardown_on_exception_and_only_what_it_created(tmp_path):
    prefix = new_prefix()
    decoy = f"{prefix}-decoy"  # our naming pattern, but not created by the cluster
    netns.sh(["ip", "netns", "add", decoy])
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with EmulatedCluster(_config(tmp_path, prefix=prefix)):
                raise RuntimeError("boom")
        assert named(host_objects(), prefix) == {decoy}
    finally:
        netns.sh(["ip", "netns", "del", decoy], check=False)


def test_same_prefix_twice_is_refused_before_creating_anything(tmp_path):
    cfg = _config(tmp_path)
    with EmulatedCluster(cfg):
        # this cluster's objects and no other cluster's: tests on the other xdist worker may
        # build and remove clusters of their own meanwhile
        before = named(host_objects(), cfg.prefix), foreign(host_objects())
        with pytest.raises(CaramelError, match="already in use"):
            EmulatedCluster(ClusterConfig(workers=2, prefix=cfg.prefix, state_dir=cfg.state_dir, quiet=True)).start()
        assert (named(host_objects(), cfg.prefix), foreign(host_objects())) == before


def test_failed_setup_removes_partial_cluster(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    real_shape = netns.shape

    def failing_shape(dev, *a, **kw):
        if dev == cfg.host_veth(1):
            raise netns.ClusterError("simulated tc failure")
        return real_shape(dev, *a, **kw)

    monkeypatch.setattr(netns, "shape", failing_shape)
    before = host_objects()
    with pytest.raises(CaramelError, match="simulated tc failure"):
        EmulatedCluster(cfg).start()
    after = host_objects()
    assert named(after, cfg.prefix) == set()
    assert foreign(after) == foreign(before)


def test_receive_buffer_cap_is_best_effort(tmp_path, monkeypatch, capsys):
    """Where the namespaces' tcp_rmem cannot be set (read-only /proc/sys, a kernel before 4.15),
    the cluster still starts, says so once, and info() records that no cap is set."""
    calls = []

    def refused(ns, max_bytes):
        calls.append(ns)
        return False

    monkeypatch.setattr(netns, "cap_receive_buffer", refused)
    cfg = ClusterConfig(workers=2, bandwidth_bps="100mbit", state_dir=str(tmp_path / "state"))
    with EmulatedCluster(cfg) as c:
        assert c.info()["receive_buffer_cap_bytes"] is None
        c.set_bandwidth(0, "50mbit")
        assert netns.qdisc_rate_bps(cfg.worker_veth(0), cfg.netns(0)) == 50e6
    err = capsys.readouterr().err
    assert err.count("cannot cap TCP receive buffers") == 1
    assert calls  # it was tried


def test_cap_receive_buffer_leaves_the_host_setting_alone(tmp_path):
    before = open(netns.TCP_RMEM).read()
    with EmulatedCluster(_config(tmp_path, bandwidth_bps="20mbit")) as c:
        assert c.info()["receive_buffer_cap_bytes"] == 62_500
        assert open(netns.TCP_RMEM).read() == before
        inside = netns.sh(["ip", "netns", "exec", c.config.netns(0), "cat", netns.TCP_RMEM]).stdout.split()
        assert [int(x) for x in inside] == [4096, 62_500, 62_500]
