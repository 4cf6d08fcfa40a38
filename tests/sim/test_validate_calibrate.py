"""Predictions replay the profile, and beside it each configuration's muted step (the profile's shape
at the measured length), scored on the same measurements (one process, synthetic profile)."""
import pytest

from caramel.sim.synthetic import synthetic_profile
from caramel.sim.validate_calibrate import muted_step_s
from caramel.sim.validate_worker import make_plans, predict


def _job(bandwidth_bps: float) -> dict:
    cfgs = [{"name": "fifo/backward", "planner": "fifo", "overlap": "backward", "options": {}, "bandwidth_bps": bandwidth_bps},
            {"name": "caramel/forward", "planner": "caramel", "overlap": "forward", "options": {}, "bandwidth_bps": bandwidth_bps}]
    return {"configs": cfgs, "workers": 2, "calibration": {"goodput": 0.9, "latency_s": 1e-4}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bandwidth_bps", [1e11, 1e8])
def test_predictions_replay_the_muted_step(bandwidth_bps):
    profile = synthetic_profile(12, forward_time_s=0.02, backward_time_s=0.04, optimizer_time_s=0.004)
    job = _job(bandwidth_bps)
    plans = make_plans(job, profile)
    unmeasured = predict(job, profile, plans)
    muted = [2 * profile.step_time_s, 1.5 * profile.step_time_s]
    both = predict(job, profile, plans, muted_s=muted, plain_s=[profile.step_time_s, 0.5 * profile.step_time_s])
    for a, b, m in zip(unmeasured, both, muted):
        assert a["muted_compute_speed"] == 1.0
        assert a["predicted_muted_compute_step_time_s"] == a["predicted_interference_step_time_s"]
        # the headline prediction replays the profile as it is, measured step or not
        assert b["predicted_interference_step_time_s"] == a["predicted_interference_step_time_s"]
        assert b["predicted_compute_s"] == pytest.approx(profile.step_time_s)
        assert b["muted_compute_speed"] == pytest.approx(profile.step_time_s / m)
        assert b["predicted_muted_compute_step_time_s"] > b["predicted_interference_step_time_s"]
        assert a["predicted_plain_compute_step_time_s"] == a["predicted_interference_step_time_s"]
    # a plain step as long as the profile's changes nothing; a shorter one is faster
    assert both[0]["plain_compute_speed"] == 1.0
    assert both[0]["predicted_plain_compute_step_time_s"] == both[0]["predicted_interference_step_time_s"]
    assert both[1]["plain_compute_speed"] == pytest.approx(2.0)
    assert both[1]["predicted_plain_compute_step_time_s"] < both[1]["predicted_interference_step_time_s"]
    grown = [b["predicted_muted_compute_step_time_s"] - b["predicted_interference_step_time_s"] for b in both]
    if bandwidth_bps == 1e11:
        # compute-bound (next to no communication): the step grows with the compute
        assert grown[0] == pytest.approx(muted[0] - profile.step_time_s, rel=0.02)
        assert grown[1] == pytest.approx(muted[1] - profile.step_time_s, rel=0.05)
    else:
        # communication-bound: slower compute adds less than its own growth
        assert grown[0] < muted[0] - profile.step_time_s


@pytest.mark.timeout(10)
def test_muted_step_is_the_slowest_ranks():
    measured = {"plain_s": [0.030, 0.034], "muted_s": {"0": [0.040, 0.038], "3": [0.031, 0.045]}}
    assert muted_step_s(measured, 0) == 0.040
    assert muted_step_s(measured, 3) == 0.045
