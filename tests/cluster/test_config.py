"""Cluster input checks, command parsing, state files and the alpha-beta fit: no root, no processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from caramel.cluster.config import ClusterConfig, auto_mtu, new_prefix
from caramel.cluster.launch import normalize_exit_code, torchrun_target
from caramel.topology.probe import core_share, default_sizes, fit_alpha_beta
from caramel.cluster.state import ClusterState, StateStore, pid_start_time
from caramel.errors import CaramelError, FormatError

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(workers=0), "workers"),
    (dict(workers=251), "workers"),
    (dict(workers="two"), "workers"),
    (dict(workers=True), "workers"),
    (dict(workers=2, bandwidth_bps="fast"), "bandwidth 'fast'"),
    (dict(workers=2, bandwidth_bps=0), "bandwidth"),
    (dict(workers=2, bandwidth_bps="-1mbit"), "bandwidth"),
    (dict(workers=2, bandwidth_bps="100bit"), "too low"),
    (dict(workers=2, latency_s="soon"), "latency_s 'soon' is not understood"),
    (dict(workers=2, latency_s="20s"), "latency_s '20s' is 20 s, not a plausible link latency"),
    (dict(workers=2, latency_s="2"), "latency_s '2' has no unit"),  # not read as 2 s
    (dict(workers=2, latency_s="2m"), "(not 'm')"),
    (dict(workers=2, latency_s=-0.001), "latency_s must be a finite number of seconds >= 0"),
    (dict(workers=2, latency_s=float("inf")), "latency_s must be a finite number"),
    (dict(workers=2, latency_s=True), "latency_s must be a number of seconds or a duration with its unit"),
    (dict(workers=2, latency_s=11), "latency_s 11 is 11 s"),
    (dict(workers=2, prefix="eth0"), "prefix 'eth0'"),
    (dict(workers=2, prefix="crm12345G"), "prefix"),
    (dict(workers=2, fallback="maybe"), "fallback 'maybe'"),
    (dict(workers=2, burst_bytes=10), "burst_bytes"),
])
def test_bad_config_names_the_input(kwargs, needle):
    with pytest.raises(CaramelError) as e:
        ClusterConfig(**kwargs)
    assert needle in str(e.value)


def test_config_normalizes_and_names_fit_ifnamsiz():
    cfg = ClusterConfig(workers="3", bandwidth_bps="250mbit", latency_s="2ms", state_dir="/tmp/x")
    assert cfg.workers == 3 and cfg.bandwidth_bps == 250e6 and cfg.latency_s == pytest.approx(0.002)
    for latency, seconds in (("50us", 50e-6), ("0.5s", 0.5), (0.002, 0.002), (3, 3.0), ("0", 0.0), (0, 0.0)):
        assert ClusterConfig(workers=2, latency_s=latency, state_dir="/tmp/x").latency_s == pytest.approx(seconds)
    assert cfg.prefix.startswith("crm") and len(cfg.prefix) == 9
    big = ClusterConfig(workers=250, prefix=cfg.prefix)
    names = [big.bridge] + [big.host_veth(i) for i in range(250)] + [big.worker_veth(i) for i in range(250)]
    assert max(len(n) for n in names) <= 15
    assert len(set(names)) == len(names)
    assert new_prefix() != new_prefix()


def test_burst_covers_timer_resolution():
    cfg = ClusterConfig(workers=2, mtu=9000)
    assert cfg.burst_for(10e6) == 9014                   # small rates: one full jumbo frame
    assert cfg.burst_for(10e9) == int(10e9 / 8 * 0.001)  # large rates: 1 ms of traffic (timer slack)
    small = ClusterConfig(workers=2, mtu=1500)
    assert small.burst_for(10e6) == 8 * 1024             # a few full 1500-byte packets
    assert ClusterConfig(workers=2, mtu=1500, burst_bytes=4000).burst_for(10e9) == 4000


@pytest.mark.parametrize("rate, mtu", [("50mbit", 9000),       # 1 ms is 6250 bytes: never below jumbo frames
                                       ("100mbit", 12486),     # 1 ms of traffic, less the Ethernet header
                                       ("500mbit", 62486),
                                       ("1gbit", 65535)])      # never above what a veth takes
def test_auto_mtu_is_the_largest_frame_within_the_burst(rate, mtu):
    cfg = ClusterConfig(workers=2, bandwidth_bps=rate)
    assert cfg.mtu == mtu == auto_mtu(cfg.bandwidth_bps)
    assert ClusterConfig(workers=2, bandwidth_bps=rate, mtu="auto").mtu == mtu
    # from 9000 bytes up to where one frame is 1 ms, the bucket is what it was at 9000
    assert cfg.burst_for(cfg.bandwidth_bps) == ClusterConfig(workers=2, bandwidth_bps=rate, mtu=9000).burst_for(
        cfg.bandwidth_bps)


@pytest.mark.parametrize("mtu", [100, 70000, "big", "Auto ", 1.5, True])
def test_bad_mtu_is_refused_naming_the_field(mtu):
    with pytest.raises(CaramelError, match="mtu must be 'auto' or an integer"):
        ClusterConfig(workers=2, mtu=mtu)


def test_burst_must_hold_one_packet_at_the_mtu():
    with pytest.raises(CaramelError, match="at least 9014"):
        ClusterConfig(workers=2, mtu=9000, burst_bytes=4000)
    with pytest.raises(CaramelError, match="at least 62500"):
        ClusterConfig(workers=2, bandwidth_bps="500mbit", burst_bytes=9014)


def test_torchrun_target_forms(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert torchrun_target(["python", str(script), "--lr", "0.1"]) == [str(script), "--lr", "0.1"]
    assert torchrun_target([str(script)]) == [str(script)]
    assert torchrun_target(["python3", "-m", "pkg.mod", "x"]) == ["-m", "pkg.mod", "x"]
    assert torchrun_target(["python", "-c", "pass"]) == ["--no-python", sys.executable, "-c", "pass"]
    assert torchrun_target(["true"])[0] == "--no-python"


@pytest.mark.parametrize("cmd, needle", [
    ([], "empty"),
    (["python"], "without a script"),
    (["python", "-m"], "module name"),
    (["python", "/no/such/train.py"], "/no/such/train.py"),
    (["/no/such/train.py"], "does not exist"),
    (["no-such-program-xyz"], "no-such-program-xyz"),
])
def test_torchrun_target_rejects(cmd, needle):
    with pytest.raises(CaramelError) as e:
        torchrun_target(cmd)
    assert needle in str(e.value)


def test_exit_codes():
    assert normalize_exit_code(0) == 0
    assert normalize_exit_code(3) == 3
    assert normalize_exit_code(-9) == 137
    assert normalize_exit_code(-15) == 143


def test_state_roundtrip_and_malformed(tmp_path):
    store = StateStore(str(tmp_path))
    st = store.claim("crm00aa11", 2, 1e8, host_used=set(range(511)), num_subnets=512)
    assert st.subnet_index == 511  # the only free /24
    st.resources.append({"kind": "netns", "name": "crm00aa11-w0"})
    store.save(st)
    states, problems = store.load_all()
    assert problems == [] and states[0] == st and states[0].owner_alive()
    with pytest.raises(CaramelError, match="already in use"):
        store.claim("crm00aa11", 2, 1e8, host_used=set(), num_subnets=512)
    with pytest.raises(CaramelError, match="no free /24"):
        store.claim("crm00aa22", 2, 1e8, host_used=set(range(511)), num_subnets=512)
    (tmp_path / "crmbadbad.json").write_text('{"format": "caramel.cluster-state/1", "resources": [{"kind": "disk"}]}')
    states, problems = store.load_all()
    assert len(states) == 1 and len(problems) == 1 and "crmbadbad.json" in problems[0]
    with pytest.raises(FormatError):
        ClusterState.from_dict({"format": "caramel.cluster-state/1"}, "x")


def test_owner_liveness_uses_start_time():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert pid_start_time(proc.pid) is None
    me = ClusterState("crm000001", os.getpid(), pid_start_time(os.getpid()), 0, 1, 1e9)
    assert me.owner_alive()
    me.pid_start += 1  # same pid, different process: a recycled pid is not the owner
    assert not me.owner_alive()


def test_fit_recovers_exact_alpha_beta():
    n, alpha, bw = 4, 80e-6, 2.5e8
    sizes = [4096 * 4**k for k in range(7)]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * 8 * s / bw for s in sizes]
    fit = fit_alpha_beta(sizes, times, n)
    assert fit.latency_s == pytest.approx(alpha, rel=1e-9)
    assert fit.bandwidth_bps == pytest.approx(bw, rel=1e-9)
    assert fit.max_rel_error < 1e-9


def test_fit_rejects_unfittable():
    with pytest.raises(CaramelError, match="at least 2 workers"):
        fit_alpha_beta([1, 2], [1.0, 2.0], 1)
    with pytest.raises(CaramelError, match="do not grow"):
        fit_alpha_beta([1000, 2000, 4000], [0.3, 0.2, 0.1], 2)
    with pytest.raises(CaramelError, match="two different sizes"):
        fit_alpha_beta([1000, 1000], [0.1, 0.1], 2)


def test_fit_clamps_negative_latency_to_zero():
    sizes = [1000, 2000, 4000]
    fit = fit_alpha_beta(sizes, [s * 1e-6 - 1e-5 for s in sizes], 2)
    assert fit.latency_s == 0.0 and fit.bandwidth_bps > 0


def test_default_sizes_scale_with_bandwidth():
    slow, fast = default_sizes(10e6, 2), default_sizes(10e9, 2)
    assert slow == sorted(slow) and fast == sorted(fast)
    assert slow[0] == fast[0] == 4096
    assert slow[-1] < fast[-1] <= 64 * 1024 * 1024
    assert all(s % 4 == 0 for s in slow + fast)


def test_fit_drops_a_noisy_size_and_reports_it():
    n, alpha, bw = 2, 50e-6, 8e7
    sizes = [4096 * 2**k for k in range(8)]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * 8 * s / bw for s in sizes]
    times[3] *= 4  # a descheduled rank
    fit = fit_alpha_beta(sizes, times, n)
    assert fit.outliers == [(sizes[3], times[3])]
    assert fit.bandwidth_bps == pytest.approx(bw, rel=1e-9) and fit.latency_s == pytest.approx(alpha, rel=1e-6)
    assert fit.times_s == times  # the report keeps every measurement


def test_fit_keeps_mild_noise():
    sizes = [4096 * 2**k for k in range(6)]
    times = [1e-4 + 8 * s / 1e8 for s in sizes]
    times = [t * (1.1 if k % 2 else 0.95) for k, t in enumerate(times)]
    assert fit_alpha_beta(sizes, times, 2).outliers == []


def test_queued_probe_pieces_and_latency():
    from caramel.topology.probe import QUEUED_MAX_BYTES, QUEUED_MIN_BYTES, queued_latency_from_extra_s, queued_piece_bytes

    # a lone collective on 2 workers: 2 steps of 1 ms; a piece takes 2 of them (4 ms) at 500 Mbit/s
    assert queued_piece_bytes(1e-3, 500e6, 2) == 250_000
    assert queued_piece_bytes(1e-6, 500e6, 2) == QUEUED_MIN_BYTES
    # capped: 4 MiB take 3.4 ms at 10 Gbit/s, more than a lone collective (2 ms)
    assert queued_piece_bytes(1e-3, 10e9, 2) == QUEUED_MAX_BYTES
    # at 100 Gbit/s they take 0.34 ms: the next piece's latency would not hide behind one; no probe
    assert queued_piece_bytes(1e-3, 100e9, 2) is None
    assert queued_piece_bytes(1e-3, 500e6, 4) % 4 == 0
    # per message over the 2(n-1) steps, never negative (noise), never above the lone latency
    assert queued_latency_from_extra_s(0.6e-3, 1e-3, 4) == pytest.approx(1e-4)
    assert queued_latency_from_extra_s(-0.2e-3, 1e-3, 2) == 0.0
    assert queued_latency_from_extra_s(5e-3, 1e-3, 2) == 1e-3


def test_receive_buffer_cap_is_half_the_shaper_queue():
    from caramel.cluster.netns import receive_buffer_cap_bytes

    assert receive_buffer_cap_bytes(1e9, 9000) == 3_125_000  # 50 ms of 1 Gbit/s is 6.25 MB
    assert receive_buffer_cap_bytes(50e6, 9000) == 156_250
    assert receive_buffer_cap_bytes(1e6, 9000) == 36_000  # never below 4 full frames


def test_core_share_counts_the_ranks_on_each_core():
    # four workers on the same two cores of one host: two per core
    assert core_share([("boot-a", (0, 1))] * 4) == 2.0
    # two of them: a core each, never below one
    assert core_share([("boot-a", (0, 1))] * 2) == 1.0
    assert core_share([("boot-a", tuple(range(8)))] * 2) == 1.0
    # the most loaded core counts: two hosts, or two disjoint core sets of one host
    assert core_share([("boot-a", (0, 1))] * 2 + [("boot-b", (0, 1))] * 6) == 3.0
    assert core_share([("boot-a", (0,)), ("boot-a", (1,))]) == 1.0
    # affinities that overlap: core 1 carries half of the first, half of the second and all of
    # the third rank
    assert core_share([("boot-a", (0, 1)), ("boot-a", (1, 2)), ("boot-a", (1,))]) == 2.0
