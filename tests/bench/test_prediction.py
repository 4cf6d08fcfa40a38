"""The bench's prediction check: accuracy per kind and the recommendation against the measurement."""
import pytest

from caramel.bench.prediction import (accuracy_by_kind, bench_cluster, check_recommendation, prediction_error,
                                      predict_strategies, worker_speeds)
from caramel.sim.synthetic import synthetic_profile


def test_the_recommendation_is_the_fastest_predicted_exact_strategy_against_the_measured_fastest():
    rows = [("ddp", 0.100, 0.090, True), ("caramel", 0.080, 0.085, True), ("ps", 0.120, 0.070, True),
            ("gossip", 0.050, 0.040, False), ("pipeline", None, 0.010, True)]
    check = check_recommendation("c", rows)
    assert (check.recommended, check.fastest) == ("ps", "caramel")  # gossip is not exact, pipeline not measured
    assert check.slowdown == pytest.approx(0.5) and not check.hit
    near = check_recommendation("c", [("ddp", 0.100, 0.09, True), ("caramel", 0.097, 0.10, True)])
    assert near.recommended == "ddp" and near.hit  # 3% slower than the fastest: within 5%
    assert check_recommendation("c", [("ddp", 0.1, 0.1, True), ("gossip", 0.05, 0.04, False)]) is None


def test_accuracy_per_kind():
    acc = accuracy_by_kind([("ps", 0.05), ("ps", -0.20), ("ps", 0.08), ("ddp", -0.01)])
    assert acc["ps"] == {"rows": 3, "median_abs_error": pytest.approx(0.08), "max_abs_error": pytest.approx(0.20),
                         "within_target": pytest.approx(2 / 3)}
    assert acc["ddp"]["rows"] == 1
    assert prediction_error(0.11, 0.10) == pytest.approx(0.1) and prediction_error(None, 0.1) is None


def test_each_rank_runs_at_the_pace_of_its_own_plain_step_and_predictions_never_raise():
    # a rank whose plain step took twice the profile's (e.g. the emulated slow worker) is half as fast
    assert worker_speeds(0.05, [0.05, 0.1, 0.04]) == pytest.approx([1.0, 0.5, 1.25])
    cluster = bench_cluster(3, 2e8, [1.0, 0.5, 1.0])
    assert [w.speed for w in cluster.workers] == [1.0, 0.5, 1.0] and cluster.bandwidth_bps == 2e8
    profile = synthetic_profile(6)
    slow = predict_strategies(profile, ["ddp"], 3, 2e8, [profile.step_time_s * f for f in (1, 2, 1)])
    assert slow["ddp"]["step_time_s"] > predict_strategies(profile, ["ddp"], 3, 2e8)["ddp"]["step_time_s"]
    preds = predict_strategies(synthetic_profile(6), ["ddp", "ps:servers=9"], 3, 2e8, None)
    assert preds["ddp"]["step_time_s"] > 0 and preds["ps:servers=9"]["step_time_s"] is None
    assert predict_strategies(None, ["ddp"], 3, 2e8) == {} and predict_strategies(synthetic_profile(2), ["ddp"], 1, None) == {}


def test_the_probed_fixed_costs_enter_the_cluster_and_raise_the_predictions():
    from caramel.bench.prediction import link_costs
    alpha, rate, n = 1e-3, 1e8, 2
    sizes = [4096, 65536, 1048576, 4194304]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * 8 * s / rate for s in sizes]
    link = link_costs({"world_size": n, "backend": "nccl", "sizes_bytes": sizes, "times_s": times,
                       "median_times_s": times, "mean_times_s": times})
    assert link["latency_s"] == pytest.approx(alpha) and link["fit_bandwidth_bps"] == pytest.approx(rate)
    assert link["queued_latency_s"] is None and link["collective_cpu_s"] == 0.0  # no gloo queued probe here
    assert bench_cluster(n, 2e8, None, link).latency_s == pytest.approx(alpha)
    assert link_costs(None) is None and link_costs({"world_size": n, "sizes_bytes": [4096], "times_s": [1e-3],
                                                    "median_times_s": [1e-3], "mean_times_s": [1e-3]}) is None
    profile = synthetic_profile(6)
    bare = predict_strategies(profile, ["ddp", "ps"], n, 2e8)
    probed = predict_strategies(profile, ["ddp", "ps"], n, 2e8, None, link)
    for name in ("ddp", "ps"):  # a millisecond per collective against the spec's 50 us
        assert probed[name]["step_time_s"] > bare[name]["step_time_s"]


def test_the_rate_is_netted_of_the_fixed_costs_the_predictions_charge_again():
    from caramel.bench.lower_bound import effective_bandwidth_bps
    from caramel.bench.prediction import net_bandwidth_bps
    link = {"latency_s": 1e-3, "queued_latency_s": 0.5e-3}
    # 2 workers, 2 buckets back to back: 2(n-1) x (1 ms + 0.5 ms) of the 100 ms are fixed costs
    assert net_bandwidth_bps(10**6, 2, 0.1, 2, link) == pytest.approx(effective_bandwidth_bps(10**6, 2, 0.097))
    assert net_bandwidth_bps(10**6, 2, 0.1, 2, None) == effective_bandwidth_bps(10**6, 2, 0.1)
    # fixed costs of half the time or more: the fit does not describe these transfers
    assert net_bandwidth_bps(10**6, 2, 0.004, 2, link) == effective_bandwidth_bps(10**6, 2, 0.004)
