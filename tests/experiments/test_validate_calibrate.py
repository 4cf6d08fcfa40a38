"""Predictions replay the profile's shape at the plain step's length, and beside it the profile's
own length and each configuration's muted step, scored on the same measurements (one process,
synthetic profile)."""
import pytest

from caramel.sim.synthetic import synthetic_profile
from experiments.validation.calibrate import muted_step_s
from experiments.validation.worker import make_plans, predict


def _job(bandwidth_bps: float) -> dict:
    cfgs = [{"name": "fifo/backward", "planner": "fifo", "overlap": "backward", "options": {}, "bandwidth_bps": bandwidth_bps},
            {"name": "caramel/forward", "planner": "caramel", "overlap": "forward", "options": {}, "bandwidth_bps": bandwidth_bps}]
    return {"configs": cfgs, "workers": 2, "calibration": {"goodput": 0.9, "latency_s": 1e-4}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bandwidth_bps", [1e11, 1e8])
def test_predictions_replay_the_plain_step_and_score_the_others(bandwidth_bps):
    profile = synthetic_profile(12, forward_time_s=0.02, backward_time_s=0.04, optimizer_time_s=0.004)
    p = profile.step_time_s
    job = _job(bandwidth_bps)
    plans = make_plans(job, profile)
    unmeasured = predict(job, profile, plans)
    plain, muted = [2 * p, p], [2.5 * p, 1.5 * p]
    measured = predict(job, profile, plans, muted_s=muted, plain_s=plain)
    for a, b, pl, m in zip(unmeasured, measured, plain, muted):
        # without measurements every prediction is the profile's
        assert a["compute_speed"] == 1.0 and a["muted_compute_speed"] == 1.0
        assert (a["predicted_profile_compute_step_time_s"] == a["predicted_muted_compute_step_time_s"]
                == a["predicted_interference_step_time_s"])
        # the headline runs at the plain step's length; the profile's own is kept beside it
        assert b["predicted_compute_s"] == pytest.approx(pl)
        assert b["compute_speed"] == pytest.approx(p / pl)
        assert b["predicted_profile_compute_step_time_s"] == pytest.approx(a["predicted_interference_step_time_s"])
        assert b["muted_compute_speed"] == pytest.approx(p / m)
        assert b["plan_fingerprint"] == a["plan_fingerprint"]
    # a plain step as long as the profile changes nothing
    assert measured[1]["predicted_interference_step_time_s"] == pytest.approx(unmeasured[1]["predicted_interference_step_time_s"])
    grown = measured[0]["predicted_interference_step_time_s"] - unmeasured[0]["predicted_interference_step_time_s"]
    assert measured[0]["predicted_muted_compute_step_time_s"] > measured[0]["predicted_interference_step_time_s"]
    if bandwidth_bps == 1e11:
        # compute-bound (next to no communication): the step grows with the compute
        assert grown == pytest.approx(p, rel=0.02)
    else:
        # communication-bound: slower compute adds less than its own growth
        assert 0 < grown < p


@pytest.mark.timeout(10)
def test_muted_step_is_the_slowest_ranks():
    measured = {"plain_s": [0.030, 0.034], "muted_s": {"0": [0.040, 0.038], "3": [0.031, 0.045]}}
    assert muted_step_s(measured, 0) == 0.040
    assert muted_step_s(measured, 3) == 0.045
