"""Compute's slowdown beside the collectives, from the concurrent baseline, into the predictions."""
import pytest

from caramel.bench.contention import MAX_SLOWDOWN, job_slowdown, rank_slowdown
from caramel.bench.prediction import bench_cluster, predict_strategies
from caramel.errors import FormatError
from caramel.sim.synthetic import synthetic_profile
from caramel.topology.spec import ClusterSpec


def test_the_extra_compute_beside_the_transfers_is_charged_to_the_overlap_only():
    # 30 ms of compute alone; beside collectives in flight for 20 ms of it, it took 36 ms: those
    # 20 ms did 14 ms of its work, 20/14 times slower
    assert rank_slowdown(0.030, [(0.036, 0.020, 2)] * 3) == pytest.approx(20 / 14)
    # in flight through all of it (a communication-bound step): 45 ms over 30 ms
    assert rank_slowdown(0.030, [(0.045, 0.045, 1), (0.044, 0.044, 1), (0.046, 0.046, 1)]) == pytest.approx(1.5)
    # faster beside than alone (noise) is no slowdown; too little overlap to tell is no evidence
    assert rank_slowdown(0.030, [(0.029, 0.020, 1)]) == 1.0
    assert rank_slowdown(0.030, [(0.040, 0.002, 1)]) is None and rank_slowdown(0.030, []) is None


def test_the_pause_each_collective_costs_is_not_counted_again_as_slowdown():
    # two starts pausing it 1 ms each (the engine's collective_cpu_s): the other 18 ms of overlap
    # did 14 ms of work
    assert rank_slowdown(0.030, [(0.036, 0.020, 2)], collective_cpu_s=0.001) == pytest.approx(18 / 14)
    assert rank_slowdown(0.030, [(0.032, 0.020, 2)], collective_cpu_s=0.001) == pytest.approx(1.0)
    assert rank_slowdown(0.030, [(0.036, 0.003, 3)], collective_cpu_s=0.001) is None  # pauses only


def test_the_factor_is_the_engines_own_inverse_and_is_capped():
    from caramel.sim.event_loop import Busy

    for f, cpu_s in ((1.3, 0.0), (2.0, 0.0005)):
        busy = Busy(f, cpu_s)
        busy.add(0.0, 0.012)  # two collectives back to back from the compute's start
        busy.add(0.012, 0.020)
        beside = busy.advance(0.0, 0.030)
        assert rank_slowdown(0.030, [(beside, 0.020, 2)], cpu_s) == pytest.approx(f)
    # the factor grows without bound as the delay nears the overlap: a stall, capped, never "none"
    for beside in (0.0540, 0.0549, 0.05499, 0.0550, 0.09):
        f = rank_slowdown(0.030, [(beside, 0.025, 1)])
        assert 1.0 < f <= MAX_SLOWDOWN
    assert rank_slowdown(0.030, [(0.0550, 0.025, 1)]) == MAX_SLOWDOWN


def test_the_job_takes_its_slowest_rank_and_no_evidence_means_no_contention():
    spans = [[(0.036, 0.020, 1)], [(0.045, 0.045, 1)], [(0.050, 0.001, 1)]]
    assert job_slowdown([0.030, 0.030, 0.030], spans) == pytest.approx(1.5)
    assert job_slowdown([0.030], [[(0.050, 0.001, 1)]]) == 1.0


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
