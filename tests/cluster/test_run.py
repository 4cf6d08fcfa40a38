"""Real torchrun jobs on the emulated cluster: a shaped all-reduce, failure propagation, the probe fit,
and the local fallback."""
from __future__ import annotations

import io
import json
import re

import pytest

from caramel.cluster import netns
from caramel.cluster.config import ClusterConfig
from caramel.cluster.emulated import EmulatedCluster
from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from tests.cluster.cluster_helpers import foreign, have, host_objects, named, needs_root

# Every rank all-reduces 4 MB three times and prints the bus bandwidth it saw: 2(n-1)/n * bits / time;
# then rank 1 fails with exit code 3 (one job instead of two: each torchrun start costs seconds).
ALLREDUCE = r"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
t = torch.ones(1_000_000)
dist.all_reduce(t)
times = []
for _ in range(3):
    dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(t); times.append(time.perf_counter() - t0)
bus = 2 * (n - 1) / n * t.numel() * 4 * 8 / sorted(times)[1]
print(f"BUSBW {bus:.0f} SUM {t[0].item():g} IF {os.environ.get('GLOO_SOCKET_IFNAME')} OMP {os.environ.get('OMP_NUM_THREADS')}")
dist.destroy_process_group()
raise SystemExit(3 if rank == 1 else 0)  # the job's exit code must be the failing worker's
"""

# Rank 1 fails with exit code 3 after rank 0 has had time to print and finish (torchrun stops the
# other local workers, and their log tailers, as soon as one fails).
FAIL_ON_RANK1 = ("import os, sys, time; r = os.environ['RANK']; print('rank', r, 'of', os.environ['WORLD_SIZE'], flush=True); "
                 "r == '1' and time.sleep(2); sys.exit(3 if r == '1' else 0)")


@needs_root
@pytest.mark.root
@pytest.mark.timeout(180)
def test_shaped_two_worker_allreduce_runs_at_the_shaped_rate(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    cfg = ClusterConfig(workers=2, bandwidth_bps="100mbit", state_dir=str(tmp_path / "state"), quiet=True)
    before = host_objects()
    out = io.StringIO()
    with EmulatedCluster(cfg) as c:
        rc = c.run(["python", str(script)], out=out, timeout_s=150, failure_grace_s=2)
    text = out.getvalue()
    lines = re.findall(r"^\[rank(\d)\] BUSBW (\d+) SUM (\S+) IF (\S+) OMP (\S+)$", text, re.M)
    assert sorted(r for r, *_ in lines) == ["0", "1"], text
    for rank, bus, total, ifname, omp in lines:
        # 16 = 1 * 2 ranks ** 4 all-reduces: every all-reduce really summed both ranks.
        assert float(total) == 16 and ifname == cfg.worker_veth(int(rank)) and omp == "1"
        assert 0.5 * 100e6 < float(bus) < 1.1 * 100e6, text
    assert rc == 3, text
    after = host_objects()
    assert named(after, cfg.prefix) == set() and foreign(after) == foreign(before)


@needs_root
@pytest.mark.root
@pytest.mark.timeout(180)
def test_probe_cli_fits_the_shaped_bandwidth(tmp_path):
    from caramel.cli import main

    out = tmp_path / "spec.json"
    rc = main(["cluster", "probe", "--workers", "2", "--bandwidth", "80mbit", "--reps", "3",
               "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    assert rc == 0
    spec = ClusterSpec.load(out)
    assert json.loads(out.read_text())["format"] == "caramel.cluster/1"
    assert spec.world_size == 2
    assert 0.5 * 80e6 < spec.bandwidth_bps < 2 * 80e6, spec.meta["probe"]
    assert 0 <= spec.latency_s < 5e-3
    assert spec.meta["nominal_bandwidth_bps"] == 80e6
    assert len(spec.meta["probe"]["sizes_bytes"]) == len(spec.meta["probe"]["times_s"]) >= 5
    # back-to-back pieces on the 80 Mbit/s link, sized for the fit; the spec's queued latency is
    # what each extra piece added, per message of the 2 ring steps, within [0, latency]
    from caramel.topology.probe import queued_piece_bytes

    queued = spec.meta["probe"]["queued"]
    assert queued["queued_pieces"] == 16
    # sized for the larger of the fitted latency and the smallest size's mean time (per message)
    probe = spec.meta["probe"]
    smallest = probe["times_s"][probe["sizes_bytes"].index(min(probe["sizes_bytes"]))] / 2
    assert queued["queued_sized_for_latency_s"] == pytest.approx(max(spec.latency_s, smallest))
    assert queued["queued_piece_bytes"] == queued_piece_bytes(queued["queued_sized_for_latency_s"], spec.bandwidth_bps, 2)
    assert spec.queued_latency_s == pytest.approx(min(max(queued["queued_extra_s"] / 2, 0.0), spec.latency_s))
    # the CPU time each extra piece added to the slowest rank's process (never negative in the
    # spec), times the workers per core of the cores the two share on this host
    import os

    assert queued["core_share"] == max(1.0, 2 / len(os.sched_getaffinity(0)))
    assert spec.collective_cpu_s == pytest.approx(max(queued["queued_cpu_s"], 0.0) * queued["core_share"])
    assert 0 < spec.collective_cpu_s < 0.1, queued


@pytest.mark.timeout(120)
def test_local_fallback_runs_plain_workers(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(netns, "support", lambda: netns.Support(False, "network namespaces need root (running as uid 1000)"))
    with pytest.raises(CaramelError, match="need root.*fallback 'local'"):
        EmulatedCluster(ClusterConfig(workers=2, fallback="error", state_dir=str(tmp_path))).start()
    before = host_objects() if have("ip") else None
    out = io.StringIO()
    with EmulatedCluster(ClusterConfig(workers=2, state_dir=str(tmp_path))) as c:
        assert c.mode == "local" and c.address(1) == "127.0.0.1"
        with pytest.raises(CaramelError, match="set_bandwidth needs the emulated cluster"):
            c.set_bandwidth(0, "10mbit")
        rc = c.run(["python", "-c", FAIL_ON_RANK1], out=out, timeout_s=100, failure_grace_s=5)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["caramel cluster: network namespaces need root (running as uid 1000); falling back to 2 plain "
                   "local workers on loopback (torchrun --standalone), without bandwidth shaping"]
    assert rc == 3, out.getvalue()
    assert "[rank0] rank 0 of 2" in out.getvalue() and "[rank1] rank 1 of 2" in out.getvalue(), out.getvalue()
    assert list(tmp_path.iterdir()) == []  # no state, nothing created
    if before is not None:
        assert foreign(host_objects()) == foreign(before)
