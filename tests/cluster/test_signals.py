"""A process that owns a cluster is interrupted (SIGINT), terminated (SIGTERM) or killed (SIGKILL):
nothing is left behind, or, after SIGKILL, `cleanup` removes exactly the dead cluster."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from caramel.cluster.config import new_prefix
from caramel.cluster.leftovers import cleanup_dead, dead_states, inventory
from tests.cluster.cluster_helpers import REPO, foreign, host_objects, named, needs_root, python_env

pytestmark = [needs_root, pytest.mark.root, pytest.mark.timeout(120)]

# Owns a 2-worker cluster, starts a long-lived process inside worker 0's namespace (as a job
# would), reports its pid, then waits to be signalled.
OWNER = r"""
import sys, time
from caramel.cluster.config import ClusterConfig
from caramel.cluster.emulated import EmulatedCluster
prefix, state_dir = sys.argv[1], sys.argv[2]
with EmulatedCluster(ClusterConfig(workers=2, bandwidth_bps="50mbit", prefix=prefix, state_dir=state_dir, quiet=True)) as c:
    job = c.exec(0, ["sleep", "600"])
    print("READY", job.pid, flush=True)
    time.sleep(600)
"""


def _sigint_default() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and a child
    # inherits that: the owner would never see the Ctrl-C these tests send.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_owner(tmp_path, prefix):
    proc = subprocess.Popen([sys.executable, "-c", OWNER, prefix, str(tmp_path)], cwd=REPO, env=python_env(),
                            preexec_fn=_sigint_default,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise AssertionError(f"owner did not start: {line} {proc.stderr.read()}")
    return proc, int(line[1])


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig, expected_rc", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)])
def test_signal_tears_down_everything(tmp_path, sig, expected_rc):
    prefix = new_prefix()
    before = host_objects()
    owner, job_pid = _start_owner(tmp_path, prefix)
    assert {f"{prefix}-w0", f"{prefix}-w1"} <= host_objects()["netns"]
    owner.send_signal(sig)
    try:
        _, err = owner.communicate(timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
    # SIGINT becomes KeyboardInterrupt (Python then exits by SIGINT); SIGTERM keeps its default meaning.
    assert owner.returncode == expected_rc, err
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err
    after = host_objects()
    assert named(after, prefix) == set()
    assert foreign(after) == foreign(before)
    assert _gone(job_pid), "the process inside the namespace survived teardown"
    assert not (tmp_path / f"{prefix}.json").exists()


def test_sigkill_leaves_state_that_cleanup_removes(tmp_path):
    prefix = new_prefix()
    before = host_objects()
    owner, job_pid = _start_owner(tmp_path, prefix)
    try:
        records, _ = inventory(str(tmp_path))
        mine = [r for r in records if r.prefix == prefix]
        assert mine and mine[0].status == "running"
        assert cleanup_dead(str(tmp_path)) == ([], [])  # a live owner's cluster is never touched
        assert {f"{prefix}-w0", f"{prefix}-w1"} <= host_objects()["netns"]
        owner.kill()
        owner.wait(timeout=10)
        assert [s.prefix for s in dead_states(str(tmp_path))] == [prefix]
        assert named(host_objects(), prefix)  # SIGKILL cannot be caught: leftovers remain
        assert cleanup_dead(str(tmp_path), dry_run=True) == ([prefix], [])
        assert named(host_objects(), prefix)
        assert cleanup_dead(str(tmp_path)) == ([prefix], [])
    finally:
        if owner.poll() is None:
            owner.kill()
        cleanup_dead(str(tmp_path))
    after = host_objects()
    assert named(after, prefix) == set()
    assert foreign(after) == foreign(before)
    assert _gone(job_pid)
    assert not (tmp_path / f"{prefix}.json").exists()


# Owns a cluster and runs a real 2-node torchrun job whose workers report their pids and sleep.
OWNER_RUN = r"""
import sys
from caramel.cluster.config import ClusterConfig
from caramel.cluster.emulated import EmulatedCluster
prefix, state_dir, script = sys.argv[1], sys.argv[2], sys.argv[3]
with EmulatedCluster(ClusterConfig(workers=2, bandwidth_bps="50mbit", prefix=prefix, state_dir=state_dir, quiet=True)) as c:
    sys.exit(c.run(["python", script]))
"""


@pytest.mark.timeout(150)
def test_ctrl_c_during_a_torchrun_job_leaves_no_process(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint('WORKER_UP', os.getpid(), os.getppid(), flush=True)\ntime.sleep(600)\n")
    prefix = new_prefix()
    before = host_objects()
    owner = subprocess.Popen([sys.executable, "-c", OWNER_RUN, prefix, str(tmp_path), str(script)], cwd=REPO,
                             preexec_fn=_sigint_default,
                             env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, seen = set(), []
    try:
        while len(pids) < 4:  # each worker and its torchrun agent
            line = owner.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
            if "WORKER_UP" in line:
                pid, ppid = line.split("WORKER_UP")[1].split()
                pids |= {int(pid), int(ppid)}
        owner.send_signal(signal.SIGINT)
        rest, _ = owner.communicate(timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert owner.returncode == -signal.SIGINT, "".join(seen) + rest
    assert all(_gone(p) for p in pids), pids
    after = host_objects()
    assert named(after, prefix) == set()
    assert foreign(after) == foreign(before)
