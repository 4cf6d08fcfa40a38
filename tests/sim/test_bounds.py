"""The lower bound: hand-computed values, and never above any simulated plan."""
import pytest

from caramel.topology.spec import ClusterSpec
from caramel.strategies.planners import make_plan
from caramel.sim import lower_bound, simulate
from caramel.sim.synthetic import resnet50_profile, synthetic_profile

from .helpers import slow_link_cluster, two_bucket_plan, two_layer_profile

pytestmark = pytest.mark.timeout(120)


def test_forward_bound_by_hand():
    # F=1, B=2, O=0.2 (C=3.2); each gradient takes 1.0 s of bandwidth; releases 2.0 (layer1), 3.0 (layer0);
    # uses 0.5 (layer1), 0.0 (layer0). Worst interval: release 3.0, use 0.0: 3.0 + 1.0 - 0.0 = 4.0
    prof = two_layer_profile()
    lb = lower_bound(prof, slow_link_cluster(latency_s=0.0), "forward")
    assert (lb.step_time_s, lb.compute_s, lb.comm_s, lb.window_s) == pytest.approx((4.0, 3.2, 2.0, 4.0))


def test_backward_bound_by_hand_is_reached_without_latency():
    prof = two_layer_profile()
    c = slow_link_cluster(latency_s=0.0)
    lb = lower_bound(prof, c, "backward")
    assert lb.step_time_s == pytest.approx(4.2)  # F + (3.0 + 1.0 - 1.0) ... = 1 + 3.0 + 0.2
    res = simulate(prof, c, two_bucket_plan(prof), overlap="backward")
    assert res.step_time_s == pytest.approx(lb.step_time_s)


def test_no_overlap_bound_is_compute_plus_comm():
    prof = two_layer_profile()
    lb = lower_bound(prof, slow_link_cluster(latency_s=0.0), "none")
    assert lb.step_time_s == pytest.approx(3.2 + 2.0)


def test_one_worker_bound_is_compute():
    prof = resnet50_profile()
    for overlap in ("forward", "backward", "none"):
        assert lower_bound(prof, ClusterSpec.uniform(1, 1e9), overlap).step_time_s == pytest.approx(prof.step_time_s)


@pytest.mark.parametrize("overlap", ["forward", "backward", "none"])
@pytest.mark.parametrize("workers,bandwidth_bps", [(2, 1e8), (8, 1e9), (32, 10e9)])
def test_bound_is_below_every_plan(overlap, workers, bandwidth_bps):
    for prof in (synthetic_profile(40), resnet50_profile()):
        c = ClusterSpec.uniform(workers, bandwidth_bps, 20e-6)
        lb = lower_bound(prof, c, overlap).step_time_s
        for name in ("fifo", "fusion", "caramel"):
            step = simulate(prof, c, make_plan(name, prof, c, overlap=overlap), overlap=overlap, trace=False).step_time_s
            assert lb <= step * (1 + 1e-9), (name, lb, step)


def test_slowest_worker_sets_the_compute_term():
    prof = two_layer_profile()
    c = slow_link_cluster(speeds=(1.0, 0.5), latency_s=0.0)
    assert lower_bound(prof, c, "none").compute_s == pytest.approx(6.4)
