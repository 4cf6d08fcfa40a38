"""`caramel cluster ...`: bad input is one line and exit 2 with no change to the host; run, list, cleanup."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from caramel.cli import main
from caramel.cluster import netns
from caramel.cluster.state import ClusterState, StateStore, pid_start_time
from tests.cluster.cluster_helpers import REPO, foreign, have, host_objects, needs_root, python_env

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("argv, needle", [
    (["--workers", "2", "--bandwidth", "fast", "--", "python", "{script}"], "bandwidth 'fast' is not understood"),
    (["--workers", "0", "--", "python", "{script}"], "workers must be between 1 and 250, got 0"),
    (["--workers", "two", "--", "python", "{script}"], "workers must be a positive integer, got 'two'"),
    (["--workers", "2", "--", "python", "/no/such/train.py"], "training script '/no/such/train.py' does not exist"),
    (["--workers", "2", "--nproc-per-node", "0", "--", "python", "{script}"], "--nproc-per-node must be a positive integer"),
    (["--workers", "2"], "command is empty"),
    (["--workers", "2", "--mtu", "70000", "--", "python", "{script}"], "mtu must be 'auto' or an integer number of bytes"),
    (["--workers", "2", "--timeout", "soon", "--", "python", "{script}"], "duration 'soon'"),
    (["--workers", "2", "--ps-servers", "2", "--", "python", "{script}"], "--ps-servers 2: the job has 2 ranks"),
    (["--workers", "2", "--ps-servers", "-1", "--", "python", "{script}"], "expected 0 to 1"),
    (["--workers", "2", "--latency", "0.001", "--", "python", "{script}"], "--latency '0.001' has no unit"),
])
def test_bad_run_input_is_one_line_and_changes_nothing(tmp_path, capsys, argv, needle):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    state = tmp_path / "state"
    before = host_objects() if have("ip") else None
    argv = [a.replace("{script}", str(script)) for a in argv]
    rc = main(["cluster", "run", "--state-dir", str(state)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("caramel cluster: error: ") and needle in err[0], err
    assert not state.exists()
    if before is not None:
        assert foreign(host_objects()) == foreign(before)


@pytest.mark.parametrize("argv, needle", [
    (["--workers", "2", "--reps", "0"], "--reps must be a positive integer"),
    (["--workers", "2", "--sizes", "4096,x"], "--sizes '4096,x' must be comma-separated byte counts"),
    (["--workers", "2", "--sizes", "4096"], "at least two different sizes"),
    (["--workers", "1"], "at least 2 processes"),
    (["--workers", "2", "--latency", "1m"], "--latency '1m': expected a duration >= 0 in s, ms, us"),
])
def test_bad_probe_input_is_one_line_and_changes_nothing(tmp_path, capsys, argv, needle):
    state = tmp_path / "state"
    before = host_objects() if have("ip") else None
    rc = main(["cluster", "probe", "--state-dir", str(state)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not state.exists()
    if before is not None:
        assert foreign(host_objects()) == foreign(before)


def test_bad_input_exit_code_through_the_real_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "caramel.cli", "cluster", "probe", "--workers", "2", "--bandwidth", "1 fast"],
                          cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "caramel cluster: error: bandwidth '1 fast' has unknown unit 'fast'; expected one of bit, kbit, mbit, gbit, "
        "tbit, bps, kbps, mbps, gbps, tbps (e.g. 1gbit or 500mbit)"]
    assert "Traceback" not in proc.stderr


def test_list_and_cleanup_without_root_say_so(monkeypatch, capsys):
    monkeypatch.setattr(netns, "support", lambda: netns.Support(False, "network namespaces need root (running as uid 1000)"))
    assert main(["cluster", "list"]) == 2
    assert main(["cluster", "cleanup"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["caramel cluster: error: cannot inspect network namespaces: network namespaces need root "
                   "(running as uid 1000); run as root with iproute2 installed"] * 2


@needs_root
@pytest.mark.root
def test_list_and_cleanup_touch_only_dead_clusters(tmp_path, capsys):
    store = StateStore(str(tmp_path))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    # A dead owner whose objects are already gone, and a live one (this test) that must be left alone.
    dead = ClusterState("crm0dead01", done.pid, 12345, 3, 2, 1e8, resources=[{"kind": "netns", "name": "crm0dead01-w0"}])
    live = ClusterState("crm0a11e01", os.getpid(), pid_start_time(os.getpid()), 4, 2, 1e8)
    store.save(dead)
    store.save(live)
    assert main(["cluster", "list", "--state-dir", str(tmp_path), "--json", str(tmp_path / "list.json")]) == 0
    listed = {c["prefix"]: c["status"] for c in json.loads((tmp_path / "list.json").read_text())["clusters"]}
    assert listed["crm0dead01"] == "dead" and listed["crm0a11e01"] == "running"
    assert main(["cluster", "cleanup", "--state-dir", str(tmp_path), "--dry-run"]) == 0
    assert store.path("crm0dead01").exists()
    assert main(["cluster", "cleanup", "--state-dir", str(tmp_path), "--json", str(tmp_path / "clean.json")]) == 0
    report = json.loads((tmp_path / "clean.json").read_text())
    assert report["format"] == "caramel.cluster-cleanup/1" and report["cleaned"] == ["crm0dead01"]
    assert not store.path("crm0dead01").exists() and store.path("crm0a11e01").exists()
    out = capsys.readouterr().out
    assert "would remove dead cluster crm0dead01" in out and "removed dead cluster crm0dead01" in out


@needs_root
@pytest.mark.root
@pytest.mark.timeout(150)
def test_cli_run_with_several_processes_per_node(tmp_path, capfd):
    script = tmp_path / "ranks.py"
    script.write_text("import os\nprint('hello', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['GLOO_SOCKET_IFNAME'],"
                      " os.environ['CARAMEL_PS_SERVERS'])\n")
    before = host_objects()
    rc = main(["cluster", "run", "--workers", "2", "--bandwidth", "50mbit", "--nproc-per-node", "2", "--ps-servers", "1",
               "--state-dir", str(tmp_path / "state"), "--timeout", "120s", "--json", str(tmp_path / "run.json"),
               "--", "python", str(script)])
    out = capfd.readouterr().out
    assert rc == 0, out
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["exit_code"] == 0 and info["format"] == "caramel.cluster-run/1"
    ifaces = info["cluster"]["interfaces"]
    for rank in range(4):
        assert f"[rank{rank}] hello {rank} 4 {ifaces[rank // 2]} 1" in out, out  # the last rank is the ps server
    assert foreign(host_objects()) == foreign(before)
    assert not any(n.startswith(info["cluster"]["prefix"]) for v in host_objects().values() for n in v)
