"""The slow ones: a torchrun restart after an external SIGKILL, and a link cut to a tenth on the
emulated cluster with replan="auto"."""
import pytest

from caramel.cluster.netns import support
from experiments.faults.network import CUT_AT, RESTORE_AT, bandwidth_experiment
from experiments.faults.restart import restart_experiment


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_torchrun_restart_after_sigkill_reaches_the_same_final_parameters():
    raw = restart_experiment(kill_after_checkpoint=10, victim=1)
    assert raw["rc_base"] == 0, raw["base_log_tail"]
    assert raw["killed_pid"] is not None, "rank 1's worker was never found to kill"
    assert raw["rc_hit"] == 0, raw["log_tail"]
    assert "resuming from" in raw["resumed_line"] and "ckpt-0000000" in raw["resumed_line"]
    assert raw["identical"] is True, f"final parameters differ (max |diff| {raw['max_abs_diff']})"


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(700)
@pytest.mark.skipif(not support().ok, reason=f"needs the emulated cluster: {support().reason}")
def test_link_cut_to_a_tenth_is_survived_and_replanned_on_every_rank_alike():
    raw = bandwidth_experiment(replan="auto", timeout_s=60)
    assert raw["rc"] == 0, raw["log_tail"]
    assert [e[0] for e in raw["events"]] == ["cut", "restore"]
    done = raw["done"]
    assert len(done) == 2 and done[0]["checksum"] == done[1]["checksum"]
    logs = [done[r].get("extra", {}).get("bandwidth_replans", []) for r in (0, 1)]
    assert [(x["step"], x["plan"]) for x in logs[0]] == [(x["step"], x["plan"]) for x in logs[1]]
    # the engine measured the slower link itself and switched plans during the cut
    cut_replans = [x for x in logs[0] if CUT_AT < x["step"] <= RESTORE_AT]
    assert cut_replans and min(x["measured_bps"] for x in cut_replans) < 20e6, logs[0]
    ph = raw["phases"]
    assert ph["cut_s"] > ph["before_s"], ph  # the cut was real: steps got slower
