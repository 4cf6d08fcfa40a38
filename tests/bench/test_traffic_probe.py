"""The traffic probe's measurements as the ps model's inputs (the probe itself runs in test_smoke)."""
from __future__ import annotations

import pytest

from caramel.bench.prediction import bench_cluster, job_predictions
from caramel.bench.traffic_probe import efficiency


def test_efficiency_is_the_ideal_time_of_the_pattern_over_the_measured_one():
    probed = {"all_to_all_s": 0.05, "broadcasts_s": 0.04, "all_to_all_bytes": 1_000_000}
    # 4 ranks: each link carries 3 shards of 1 MB, 24 Mbit, 30 ms at 800 Mbit/s
    assert efficiency(probed, "all_to_all", 4, 800e6) == pytest.approx(0.03 / 0.05)
    assert efficiency(probed, "broadcasts", 4, 800e6) == pytest.approx(0.03 / 0.04)
    assert efficiency(probed, "all_to_all", 4, 100e6) == 1.0  # faster than the rate: noise, never a speed-up
    assert efficiency(None, "all_to_all", 4, 800e6) is None
    assert efficiency(probed, "all_to_all", 4, None) is None


def test_the_probe_reaches_the_ps_models_cluster_spec_and_only_it():
    link = {"latency_s": 1e-4, "link_queue_s": 0.006, "push_efficiency": 0.7, "pull_efficiency": None}
    spec = bench_cluster(2, 1e9, link=link)
    assert spec.meta["link_queue_s"] == 0.006 and spec.meta["push_efficiency"] == 0.7
    assert "pull_efficiency" not in spec.meta and spec.latency_s == 1e-4
    assert "link_queue_s" not in bench_cluster(2, 1e9).meta


def test_job_predictions_take_the_traffic_probe_into_the_link_fit_but_not_the_rate_only_ones():
    traffic = {"queue_s": 0.005, "bulk_s": 0.1, "bulk_bytes": 4_000_000, "all_to_all_s": 0.02,
               "broadcasts_s": 0.02, "all_to_all_bytes": 1_000_000}
    out = job_predictions(None, [], 2, 2_000_000, 0.016, 1, [0.03, 0.03], [[], []], None, traffic)
    # a ring's 2 MB at 2 workers in 16 ms: 1 Gbit/s; a 1 MB shard one way takes 8 ms of the probe's 20
    assert out["link_fit"]["link_queue_s"] == 0.005
    assert out["link_fit"]["push_efficiency"] == pytest.approx(0.4)
    assert out["predicted"] == {} and out["predicted_rate_only"] == {}  # no profile: no prediction


def test_the_per_count_rates_are_the_ideal_over_each_measured_point_and_old_probes_have_none():
    from caramel.bench.traffic_probe import efficiency_by_count

    # 4 ranks, 1 MB shards: each receiving NIC carries 3 MB, 30 ms at 800 Mbit/s, whatever k
    probed = {"all_to_all_s": 0.05, "all_to_all_bytes": 1_000_000, "pushes_at_once_s": [0.03, 0.0375, 0.04, 0.05]}
    assert efficiency_by_count(probed, 4, 800e6) == pytest.approx([1.0, 0.8, 0.75, 0.6])
    assert efficiency_by_count({**probed, "pushes_at_once_s": [0.02, 0.05, 0.05, 0.05]}, 4, 800e6)[0] == 1.0
    assert efficiency_by_count({"all_to_all_s": 0.05, "all_to_all_bytes": 1_000_000}, 4, 800e6) is None
    assert efficiency_by_count(probed, 4, None) is None  # no rate to take shares of
    with pytest.raises(ValueError, match="3 points for 4 workers"):
        efficiency_by_count({**probed, "pushes_at_once_s": [0.03, 0.04, 0.05]}, 4, 800e6)


def test_a_version_2_probe_reaches_the_cluster_spec_as_a_curve_and_an_old_one_does_not():
    old = {"queue_s": 0.005, "bulk_s": 0.1, "bulk_bytes": 4_000_000, "all_to_all_s": 0.02,
           "broadcasts_s": 0.02, "all_to_all_bytes": 1_000_000}
    new = {**old, "version": 2, "pushes_at_once_s": [0.008, 0.02]}
    fits = [job_predictions(None, [], 2, 2_000_000, 0.016, 1, [0.03, 0.03], [[], []], None, t)["link_fit"]
            for t in (old, new)]
    assert fits[0]["push_efficiency_by_count"] is None
    assert fits[1]["push_efficiency_by_count"] == pytest.approx([1.0, 0.4])
    assert "push_efficiency_by_count" not in bench_cluster(2, 1e9, link=fits[0]).meta
    assert bench_cluster(2, 1e9, link=fits[1]).meta["push_efficiency_by_count"] == pytest.approx([1.0, 0.4])
    # the probe runs on gloo only, where this runtime posts a colocated server's receives early
    assert bench_cluster(2, 1e9, link=fits[1]).meta["push_receives_early"] is True


def test_the_per_count_send_rates_may_beat_the_roots_copies_only_as_far_as_the_links_allow():
    from caramel.bench.traffic_probe import pull_efficiency_by_count

    # 4 ranks, 1 MB shards: the root's 3 copies take 30 ms at 800 Mbit/s; one broadcast alone
    # relaying through its receivers in 20 ms is 1.5x that; 4 at once in 40 ms, 0.75
    probed = {"all_to_all_bytes": 1_000_000, "broadcasts_at_once_s": [0.02, 0.025, 0.03, 0.04]}
    assert pull_efficiency_by_count(probed, 4, 800e6) == pytest.approx([1.5, 1.2, 1.0, 0.75])
    # the caps: a rank that broadcasts none receives k copies, (4 - 1) / k; all 4 at once: 1
    fast = {**probed, "broadcasts_at_once_s": [0.005, 0.005, 0.005, 0.005]}
    assert pull_efficiency_by_count(fast, 4, 800e6) == pytest.approx([3.0, 1.5, 1.0, 1.0])
    two = pull_efficiency_by_count({"all_to_all_bytes": 1_000_000, "broadcasts_at_once_s": [0.005, 0.005]}, 2, 800e6)
    assert two == [1.0, 1.0] and all(isinstance(e, float) for e in two)  # a float even where the cap binds
    assert pull_efficiency_by_count({"all_to_all_bytes": 1_000_000, "broadcasts_s": 0.04}, 4, 800e6) is None
    assert pull_efficiency_by_count(probed, 4, None) is None
    with pytest.raises(ValueError, match="3 points for 4 workers"):
        pull_efficiency_by_count({**probed, "broadcasts_at_once_s": [0.02, 0.03, 0.04]}, 4, 800e6)
    old = {"queue_s": 0.005, "bulk_s": 0.1, "bulk_bytes": 4_000_000, "all_to_all_s": 0.02,
           "broadcasts_s": 0.02, "all_to_all_bytes": 1_000_000}
    fits = [job_predictions(None, [], 2, 2_000_000, 0.016, 1, [0.03, 0.03], [[], []], None, t)["link_fit"]
            for t in (old, {**old, "version": 4, "broadcasts_at_once_s": [0.008, 0.02]})]
    assert fits[0]["pull_efficiency_by_count"] is None
    assert fits[1]["pull_efficiency_by_count"] == pytest.approx([1.0, 0.4])
    assert "pull_efficiency_by_count" not in bench_cluster(2, 1e9, link=fits[0]).meta
    assert bench_cluster(2, 1e9, link=fits[1]).meta["pull_efficiency_by_count"] == pytest.approx([1.0, 0.4])


def test_the_curves_time_every_count_within_the_budget_else_fewer_reps_then_a_geometric_set():
    from caramel.bench.traffic_probe import MIN_CURVE_REPS, curve_plan

    # 4 workers, 70 ms rounds: 7 calls' 16 rounds are 7.8 s, inside 20 s: every count, 15 reps
    assert curve_plan(4, 0.07, 20.0, 15) == ([1, 2, 3], 15)
    # 1 s rounds: 20 / 7 rounds fit 2 each, less a warm-up: fewer than the fewest; 4 workers' counts are already
    # 1, 2, 3, so the fewest repetitions
    assert curve_plan(4, 1.0, 20.0, 15) == ([1, 2, 3], MIN_CURVE_REPS)
    assert curve_plan(4, 0.5, 20.0, 15) == ([1, 2, 3], 4)  # 20 / (7 x 0.5) = 5 rounds, one a warm-up
    # 16 workers, 1.25 s rounds: every count at 15 reps would be 31 x 16 x 1.25 s; the counts 1, 2, 4, 8, 15
    counts, reps = curve_plan(16, 1.25, 20.0, 15)
    assert counts == [1, 2, 4, 8, 15] and reps == MIN_CURVE_REPS
    assert (2 * len(counts) + 1) * (reps + 1) * 1.25 < 60  # against about 11 minutes untrimmed
    assert curve_plan(2, 10.0, 20.0, 15) == ([1], MIN_CURVE_REPS) and curve_plan(3, 0.01, 20.0, 2) == ([1, 2], 2)


def test_a_curve_between_its_timed_counts_is_linear_in_k():
    from caramel.bench.traffic_probe import fill_curve

    assert fill_curve([1, 2, 4, 5], [1.0, 2.0, 6.0, 7.0], 5) == pytest.approx([1.0, 2.0, 4.0, 6.0, 7.0])
    assert fill_curve([1, 2, 3], [0.1, 0.2, 0.3], 3) == [0.1, 0.2, 0.3]
    for counts in ([2, 3], [1, 2], []):
        with pytest.raises(ValueError, match="must run from 1 to 3"):
            fill_curve(counts, [0.1] * len(counts), 3)


def test_the_broadcast_sweep_times_every_count_in_each_repetition_in_a_rotating_order(monkeypatch):
    # a fake process group: each round's senders are its count; the sweep must interleave the counts
    # (rep r times every k) so that every point is read in the same stretch of the job
    import torch
    import torch.distributed as dist

    from caramel.bench import traffic_probe

    rounds: list[set[int]] = [set()]

    class Done:
        def wait(self):
            return None

    def broadcast(buf, src, group, async_op):
        rounds[-1].add(src)
        return Done()

    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "barrier", lambda: rounds.append(set()))
    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: None)
    times = traffic_probe._broadcast_sweep(torch.zeros(4), 3, 2, [None] * 3, [1, 2, 3])
    assert [len(t) for t in times] == [2, 2, 2]
    counts = [len(r) for r in rounds[1:]]
    assert counts == [1, 2, 3, 2, 3, 1, 3, 1, 2]  # the warm-up, then each repetition every count, rotated
