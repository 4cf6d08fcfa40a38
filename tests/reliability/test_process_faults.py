"""A worker killed (SIGKILL) or frozen (SIGSTOP) mid-run: every other worker must exit non-zero,
in time, with the engine's message naming the failed collective.

Workers are plain processes on loopback started by `experiments.faults.harness.LocalJob` (not
torchrun, whose agent would stop the survivors itself and hide what Caramel does). The
collective timeout is 10 s (CARAMEL_TIMEOUT_S).
"""
import signal

import pytest

from experiments.faults.process import ENGINE_MESSAGE, signal_experiment
from experiments.faults.result import MatrixConfig

CFG = MatrixConfig(timeout_s=10.0, kill_limit_s=60.0)
# These tests turn the periodic plan check off so that the failing collective is always a
# gradient one; test_sigkill_during_the_plan_check_names_the_collective covers the check's own.
NO_CHECK = ["--check-every", "0"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("at_step", [3, 17])
def test_sigkilled_worker_makes_the_others_fail_within_60_s(at_step):
    raw = signal_experiment(signal.SIGKILL, CFG, at_step=at_step, worker_args=NO_CHECK)
    assert raw["hung"] == [], f"rank 0 still running {CFG.kill_limit_s} s after rank 1 was killed"
    assert raw["exit_codes"][0] not in (0, None)
    assert raw["exit_codes"][1] == -signal.SIGKILL
    assert raw["exit_after_s"][0] <= CFG.kill_limit_s
    msg = raw["messages"][0]
    assert ENGINE_MESSAGE in msg and "rank 0" in msg and "step" in msg, msg


@pytest.mark.timeout(180)
def test_sigstopped_worker_is_detected_by_the_configured_timeout():
    raw = signal_experiment(signal.SIGSTOP, CFG, at_step=8, limit_s=CFG.timeout_s + 50, worker_args=NO_CHECK)
    assert raw["hung"] == [], "rank 0 still waiting 60 s after rank 1 froze, with a 10 s timeout"
    assert raw["exit_codes"][0] not in (0, None)
    # nothing can notice a silent peer before the timeout; the slack covers teardown on a busy 2-core host
    assert CFG.timeout_s * 0.9 <= raw["exit_after_s"][0] <= CFG.timeout_s + 50
    msg = raw["messages"][0]
    assert ENGINE_MESSAGE in msg and "timeout 10 s" in msg, msg


@pytest.mark.timeout(180)
def test_sigkill_during_the_plan_check_names_the_collective():
    # --check-every 1: a plan check after every step, while the gradient collective of the next
    # step is only issued after backward; the survivor is most often blocked in the check.
    hits = []
    for at_step in (4, 9, 14):
        raw = signal_experiment(signal.SIGKILL, CFG, at_step=at_step, worker_args=["--check-every", "1"])
        assert raw["exit_codes"][0] not in (0, None)
        hits.append(raw["messages"][0])
    # whichever collective the survivor was blocked in, the error names it and the rank
    assert all("rank 0" in m and ENGINE_MESSAGE in m and "failed" in m for m in hits), hits
