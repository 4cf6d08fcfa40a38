"""The interference term: overlap of compute and collectives by hand, and the correction's cases."""
import dataclasses

import pytest

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.strategies.planners import make_plan
from caramel.sim.interference import Interference, corrected_step_time_s, overlap_per_step_s
from caramel.sim.simulate import simulate
from caramel.sim.synthetic import synthetic_profile
from caramel.trace.events import TraceEvent

pytestmark = pytest.mark.timeout(60)


def _ev(lane, kind, start, dur, rank=0):
    return TraceEvent(rank, lane, kind, kind, start, dur, 0)


def test_overlap_by_hand():
    events = [
        _ev("compute", "forward", 0, 10), _ev("wait", "wait", 2, 2),  # forward blocked 2..4
        _ev("comm", "comm", 3, 5),  # in flight 3..8
        _ev("compute", "backward", 10, 10), _ev("comm", "comm", 15, 10),  # 15..25, window ends at 20
        _ev("comm", "ready", 12, 0), _ev("comm", "comm", 0, 20, rank=1),  # instants and other ranks ignored
    ]
    # compute minus waits: [0,2] + [4,20]; comm: [3,8] + [15,20] -> overlap [4,8] + [15,20] = 9
    assert overlap_per_step_s(events, 0, (0.0, 20.0), 1) == pytest.approx(9.0)
    assert overlap_per_step_s(events, 0, (0.0, 20.0), 3) == pytest.approx(3.0)


def test_interference_factors_are_checked():
    with pytest.raises(CaramelError, match="compute_slowdown"):
        Interference(0.9, 1.0)
    with pytest.raises(CaramelError, match="comm_slowdown"):
        Interference(1.0, "x")


@pytest.mark.parametrize("bound", ["communication", "compute"])
def test_correction_uses_the_bound_side(bound):
    profile = synthetic_profile(12)
    cluster = ClusterSpec.uniform(2, 1e8, 1e-5)
    plan = make_plan("fifo", profile, cluster, bucket_cap_mb=0.1, first_bucket_mb=0.1)
    r = simulate(profile, cluster, plan, overlap="forward", iterations=5)
    assert r.critical_path["bound"] == "communication"
    # the same timeline, read as if compute bounded it: only the factor applied changes
    r = dataclasses.replace(r, critical_path=dict(r.critical_path, bound=bound))
    same, o = corrected_step_time_s(r, Interference())
    assert same == r.step_time_s and o > 0
    up, o2 = corrected_step_time_s(r, Interference(1.5, 1.25))
    assert o2 == o
    assert up == pytest.approx(r.step_time_s + (0.25 if bound == "communication" else 0.5) * o)
    # overlap never exceeds the compute of a step
    assert o <= r.compute_time_s + 1e-12
    with pytest.raises(CaramelError, match="trace=True"):
        corrected_step_time_s(simulate(profile, cluster, plan, trace=False), Interference())


def test_no_overlap_mode_has_almost_no_overlap():
    profile = synthetic_profile(12)
    cluster = ClusterSpec.uniform(2, 1e8, 1e-5)
    plan = make_plan("fifo", profile, cluster)
    r = simulate(profile, cluster, plan, overlap="none", iterations=5)
    corrected, o = corrected_step_time_s(r, Interference(2.0, 2.0))
    # "none" issues at the end of backward and waits at step(): only the applies can overlap (none here)
    assert o == pytest.approx(0.0, abs=1e-12) and corrected == pytest.approx(r.step_time_s)
