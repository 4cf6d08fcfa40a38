"""Compute's slowdown beside the collectives, from the concurrent baseline, into the predictions."""
import pytest

from caramel.bench.contention import job_slowdown, rank_slowdown
from caramel.bench.prediction import bench_cluster, predict_strategies
from caramel.errors import FormatError
from caramel.sim.synthetic import synthetic_profile
from caramel.topology.spec import ClusterSpec


def test_the_extra_compute_beside_the_transfers_is_charged_to_the_overlap_only():
    # 30 ms of compute alone; beside collectives in flight for 20 ms of it, it took 36 ms: those
    # 20 ms did 14 ms of its work, 20/14 times slower
    assert rank_slowdown(0.030, [(0.036, 0.020)] * 3) == pytest.approx(20 / 14)
    # in flight through all of it (a communication-bound step): 45 ms over 30 ms
    assert rank_slowdown(0.030, [(0.045, 0.045), (0.044, 0.044), (0.046, 0.046)]) == pytest.approx(1.5)
    # faster beside than alone (noise) is no slowdown; too little overlap to tell is no evidence
    assert rank_slowdown(0.030, [(0.029, 0.020)]) == 1.0
    assert rank_slowdown(0.030, [(0.040, 0.002)]) is None and rank_slowdown(0.030, []) is None
    assert rank_slowdown(0.030, [(0.060, 0.025)]) is None  # 30 ms late in a 25 ms overlap: no slowdown explains it


def test_the_job_takes_its_slowest_rank_and_no_evidence_means_no_contention():
    spans = [[(0.036, 0.020)], [(0.045, 0.045)], [(0.050, 0.001)]]
    assert job_slowdown([0.030, 0.030, 0.030], spans) == pytest.approx(1.5)
    assert job_slowdown([0.030], [[(0.050, 0.001)]]) == 1.0


def test_the_slowdown_travels_in_the_cluster_spec_and_slows_the_event_engine_models():
    spec = bench_cluster(2, 2e8, None, None, 1.4)
    assert spec.compute_slowdown == 1.4
    assert ClusterSpec.from_dict(spec.to_dict()).compute_slowdown == 1.4
    assert ClusterSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "compute_slowdown"}).compute_slowdown == 1.0
    profile = synthetic_profile(sizes_bytes=[2 << 20] * 6)  # buckets that reduce while backward runs
    calm = predict_strategies(profile, ["ddp", "caramel"], 2, 2e9)  # compute-bound: the overlap is on the path
    slowed = predict_strategies(profile, ["ddp", "caramel"], 2, 2e9, None, None, 1.4)
    for name in ("ddp", "caramel"):
        assert slowed[name]["step_time_s"] > calm[name]["step_time_s"]


@pytest.mark.parametrize("bad", [0.5, float("nan"), True, "2"])
def test_a_slowdown_under_one_is_an_error_naming_the_field(bad):
    with pytest.raises(FormatError, match="compute_slowdown"):
        ClusterSpec.uniform(2, 1e9, compute_slowdown=bad)
