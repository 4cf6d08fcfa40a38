"""Link rates derived from a point's target comm/compute (no workers started)."""
import pytest

from caramel.bench import rates
from caramel.bench.matrix import BenchConfig, BenchSettings
from caramel.bench.rates import Calibration, derive_rate_bps, derive_rates, rate_text, ring_allreduce_s
from caramel.errors import CaramelError

pytestmark = pytest.mark.timeout(30)


def test_a_known_compute_time_and_byte_count_give_the_expected_rate():
    # 2 workers, 2.8 MB, 30 ms of compute, ratio 1: 2(n-1)/n * S * 8 / B = 30 ms -> B = 746.67 Mbit/s
    b = derive_rate_bps(2_800_000, 2, 0.030, 1.0)
    assert b == pytest.approx(2_800_000 * 8 / 0.030)
    assert ring_allreduce_s(2_800_000, 2, b) == pytest.approx(0.030)
    # 4 workers move 2(n-1)/n = 1.5 times the bytes per link
    assert derive_rate_bps(2_800_000, 4, 0.030, 1.0) == pytest.approx(1.5 * b)
    # the latency term comes out of the time budget: 2 collectives x 2(n-1) x 0.5 ms = 2 ms of 30
    lat = derive_rate_bps(2_800_000, 2, 0.030, 1.0, latency_s=5e-4, collectives=2)
    assert lat == pytest.approx(2_800_000 * 8 / 0.028)
    assert ring_allreduce_s(2_800_000, 2, lat, latency_s=5e-4, collectives=2) == pytest.approx(0.030)


def test_ratio_two_gives_twice_the_comm_time_of_ratio_one():
    one = derive_rate_bps(16_900_000, 2, 0.053, 1.0)
    two = derive_rate_bps(16_900_000, 2, 0.053, 2.0)
    assert ring_allreduce_s(16_900_000, 2, two) == pytest.approx(2 * ring_allreduce_s(16_900_000, 2, one))
    assert ring_allreduce_s(16_900_000, 2, two) == pytest.approx(0.106)
    # a faster host (compute halves) doubles the rate and keeps the ratio
    assert derive_rate_bps(16_900_000, 2, 0.0265, 1.0) == pytest.approx(2 * one)


@pytest.mark.parametrize("args", [(0, 2, 0.03, 1.0), (1e6, 2, 0.0, 1.0), (1e6, 2, 0.03, 0.0), (1e6, 1, 0.03, 1.0)])
def test_no_rate_from_nonsense(args):
    with pytest.raises(CaramelError):
        derive_rate_bps(*args)
    with pytest.raises(CaramelError, match="latency alone"):
        derive_rate_bps(1e6, 2, 0.001, 0.5, latency_s=1e-3)


def test_rates_are_rounded_to_tc_text():
    assert rate_text(746_666_666.7) == "747mbit"
    assert rate_text(1_493_333_333) == "1.49gbit"


def _raw(pace_ms, grad_bytes=2_800_000, buckets=2):
    step = pace_ms / 1e3
    return {"settings": {"steps_per_round": 2}, "grad_bytes": grad_bytes, "comm_buckets": buckets,
            "step_times_s": {"compute": [[step] * 4, [step * 0.9] * 4]}}


def test_one_calibration_per_workload_and_every_point_derived_from_it():
    resnet = dict(model="resnet18", batch_size=8, model_options={"width": 16})
    points = [BenchConfig(**resnet, workers=2, comm_ratio=0.5), BenchConfig(**resnet, workers=2, comm_ratio=2.0),
              BenchConfig(**resnet, workers=4, comm_ratio=1.0), BenchConfig("mlp", workers=2, bandwidth="1gbit")]
    launched = []

    def launch(config):
        launched.append(config.workload_key)
        return _raw(30.0 if config.workers == 2 else 60.0)

    out, failures = derive_rates(points, launch, log=open("/dev/null", "w"))
    assert failures == [] and len(launched) == 2  # the two 2-worker points share one measurement
    assert [c.rate_source for c in out] == ["derived", "derived", "derived", "pinned"]
    assert out[0].calibrated_compute_s == pytest.approx(0.030)  # the slowest rank's pace
    lat = rates.LINK_LATENCY_S
    for c in out[:3]:
        comm = ring_allreduce_s(2_800_000, c.workers, c.bandwidth_bps, lat, 2)
        assert comm / c.calibrated_compute_s == pytest.approx(c.comm_ratio, rel=0.01), c
    assert out[3] is points[3]


def test_a_failed_calibration_leaves_its_points_out_and_says_so():
    points = [BenchConfig("resnet18", workers=2, comm_ratio=1.0), BenchConfig("gpt2", workers=2, comm_ratio=2.0)]
    out, failures = derive_rates(points, lambda c: None if c.model == "gpt2" else _raw(30.0), log=open("/dev/null", "w"))
    assert [c.model for c in out] == ["resnet18"]
    assert len(failures) == 1 and "gpt2() x2 @ comm/compute 2" in failures[0] and "calibration" in failures[0]


def test_calibration_settings_follow_the_bench():
    s = rates.calibration_settings(BenchSettings(rounds=10, steps_per_round=8, warmup_steps=3))
    assert s.steps_per_round == 8 and s.warmup_steps == 3 and s.rounds == rates.CALIBRATION_ROUNDS
    assert Calibration(0.03, 2_800_000, 2).rate(BenchConfig("m", workers=2, comm_ratio=1.0)) == rate_text(
        derive_rate_bps(2_800_000, 2, 0.03, 1.0, rates.LINK_LATENCY_S, 2))
