"""Synthetic profiles: shapes, orders, round trips; and the 1024-worker scale case runs."""
import pytest

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.strategies.planners import make_plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim import simulate
from caramel.sim.synthetic import resnet50_profile, synthetic_profile

pytestmark = pytest.mark.timeout(120)


def test_resnet50_has_the_real_parameter_count():
    prof = resnet50_profile()
    assert len(prof.params) == 161
    assert sum(p.numel for p in prof.params) == 25_557_032
    assert prof.params[-2].name == "fc.weight"
    # backward runs in reverse: fc first, conv1 last
    assert prof.params[-1].ready_order == 0 and prof.params[0].ready_order == 160
    assert prof.params[0].ready_time_s == pytest.approx(prof.backward_time_s)
    assert prof.params[0].first_use_time_s == 0.0


def test_chain_profile_times_and_round_trip(tmp_path):
    prof = synthetic_profile(sizes_bytes=[1000, 3000], times_s=[1, 3], forward_time_s=4.0, backward_time_s=8.0)
    assert [p.first_use_time_s for p in prof.params] == pytest.approx([0.0, 1.0])
    assert [p.ready_time_s for p in prof.params] == pytest.approx([8.0, 6.0])
    prof.save(tmp_path / "p.json")
    back = ModelProfile.load(tmp_path / "p.json")
    assert back.to_dict() == prof.to_dict()


def test_bad_synthetic_inputs():
    with pytest.raises(CaramelError, match="n_params"):
        synthetic_profile()
    with pytest.raises(CaramelError, match="sizes_bytes"):
        synthetic_profile(sizes_bytes=[10, -1])
    with pytest.raises(CaramelError, match="times_s"):
        synthetic_profile(sizes_bytes=[10, 10], times_s=[1.0])


def test_1024_worker_ring_simulates():
    # the speed target (< 5 s) is measured by `python -m experiments.sim_speed`, not asserted here
    prof = resnet50_profile()
    c = ClusterSpec.uniform(1024, 10e9)
    res = simulate(prof, c, make_plan("fifo", prof, c), iterations=2)
    bucket_bytes = [b.bytes for b in make_plan("fifo", prof, c).buckets]
    assert res.comm_time_s == pytest.approx(sum(c.allreduce_time_s(b) for b in bucket_bytes), rel=1e-9)
    assert res.step_time_s > res.compute_time_s
