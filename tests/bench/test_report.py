"""The bench's arithmetic on recorded numbers: step series, baselines, E, speedup, targets."""
import json
import math

import pytest

from caramel.bench import report
from caramel.bench.report import (Record, check_targets, efficiency, format_markdown, format_table, geomean,
                                  free_running_pace_s, job_step_times, median, percentile, regime_of, summarize, to_json)


def test_percentile_matches_linear_interpolation():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert median(xs) == 3.0
    assert percentile(xs, 90) == pytest.approx(4.6)  # numpy.percentile(xs, 90)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.3]) == pytest.approx(1.3)


def test_job_step_time_is_how_far_the_slowest_ranks_clock_advanced():
    # clocks 1, 6, 8 and 3, 4, 6.5: the job is at 3, 6, 8
    assert job_step_times([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == pytest.approx([3.0, 3.0, 2.0])
    # synchronized ranks: the slowest rank per step, as before
    assert job_step_times([[1.0, 2.0], [1.5, 2.5]]) == pytest.approx([1.5, 2.5])
    # ranks in opposite phase (both at 85 ms per step): one delay is not counted twice; the
    # per-index maximum would say 110 ms
    a, b = [0.060, 0.110] * 4, [0.110, 0.060] * 4
    steps = job_step_times([a, b])
    assert sum(steps) == pytest.approx(sum(a)) and median(steps) == pytest.approx(0.085)
    assert median([max(x, y) for x, y in zip(a, b)]) == pytest.approx(0.110)
    # clocks start together at every round
    assert job_step_times([[1.0, 5.0, 2.0, 1.0], [3.0, 1.0, 1.0, 3.0]], steps_per_round=2) == pytest.approx([3.0, 3.0, 2.0, 2.0])
    with pytest.raises(AssertionError):
        job_step_times([[1.0], [1.0, 2.0]])


def test_free_running_pace_is_the_slowest_ranks_mean_per_round():
    # the slowest rank queues for a core at the start of each round, then runs alone on it: its
    # clock leads every step, and most of its steps are fast, so the per-step series' median is
    # its fast steps and far below the pace at which the round got done
    a = [0.06, 0.06, 0.06, 0.06, 0.06, 0.06, 0.06, 0.06]
    b = [0.30, 0.03, 0.03, 0.03, 0.30, 0.03, 0.03, 0.03]
    assert median(job_step_times([a, b], steps_per_round=4)) == pytest.approx(0.03)
    assert free_running_pace_s([a, b], steps_per_round=4) == pytest.approx([0.39 / 4, 0.39 / 4])
    assert free_running_pace_s([[1.0, 2.0, 3.0]]) == pytest.approx([2.0])
    assert free_running_pace_s([[1.0, 2.0, 4.0], [2.0, 2.0, 0.0]], steps_per_round=2) == pytest.approx([2.0, 4.0])


def test_summarize_takes_the_compute_baseline_at_its_pace():
    a = [0.06, 0.06, 0.06, 0.06]
    b = [0.30, 0.03, 0.03, 0.03]
    times = {"compute": [a, b], "comm": [[0.08] * 4, [0.08] * 4], "ddp": [[0.2] * 4, [0.2] * 4]}
    raw = dict(_raw(times, strategies=("ddp",)), settings={"steps_per_round": 4})
    rec = summarize(raw)[0]
    assert rec.compute_s == pytest.approx(0.39 / 4)
    assert rec.comm_compute_ratio == pytest.approx(0.08 / 0.0975)


def test_efficiency_definition():
    # compute 100 ms, comm 60 ms: U = 160, L = 100
    assert efficiency(0.160, 0.100, 0.060) == pytest.approx(0.0)   # no overlap
    assert efficiency(0.100, 0.100, 0.060) == pytest.approx(1.0)   # perfect overlap
    assert efficiency(0.130, 0.100, 0.060) == pytest.approx(0.5)
    assert efficiency(0.200, 0.100, 0.060) == pytest.approx(-2 / 3)  # worse than no overlap
    assert efficiency(0.100, 0.100, 0.0) is None  # nothing to overlap


def test_regime_from_measured_ratio():
    assert regime_of(0.05, 0.1) == "compute-bound"
    assert regime_of(0.08, 0.1) == "balanced"
    assert regime_of(0.15, 0.1) == "balanced"
    assert regime_of(0.2, 0.1) == "comm-bound"


def _raw(times, strategies=("ddp", "caramel"), skipped=None, workers=2):
    return {
        "format": "caramel.bench_raw/1",
        "config": {"model": "resnet18", "workers": workers, "bandwidth": "300mbit", "batch_size": 8,
                   "model_options": {"width": 16}, "regime": "balanced"},
        "strategies": [{"kind": s.split(":")[0], "options": {}, "name": s} for s in strategies],
        "skipped": skipped or {},
        "step_times_s": times,
        "lower_bound_s": 0.105,
        "stats": {"caramel": {"step": 40, "total_wait_s": 0.5}},
        "meta": {"network": "netns+tc 300mbit", "grad_bytes": 2_800_000},
    }


def test_summarize_recorded_numbers():
    # two ranks; the job's series is the advance of the slowest rank's clock
    times = {
        "compute": [[0.100, 0.102, 0.098], [0.099, 0.101, 0.100]],   # series 0.100 0.102 0.100 -> 0.100
        "comm": [[0.080, 0.081, 0.079], [0.080, 0.080, 0.080]],      # 0.080 0.081 0.080 -> 0.080
        "ddp": [[0.180, 0.179, 0.185], [0.181, 0.178, 0.180]],       # 0.181 0.179 0.185 -> 0.181
        "caramel": [[0.120, 0.118, 0.130], [0.119, 0.121, 0.119]],   # clocks .120 .240 .368 -> .120 .120 .128
    }
    recs = {r.strategy: r for r in summarize(_raw(times))}
    ddp, car = recs["ddp"], recs["caramel"]
    assert car.compute_s == pytest.approx(0.100) and car.comm_s == pytest.approx(0.080)
    assert ddp.step_time_median_s == pytest.approx(0.181)
    assert car.step_time_median_s == pytest.approx(0.120)
    assert car.step_time_p90_s == pytest.approx(0.120 + 0.8 * (0.128 - 0.120))
    assert car.step_time_mean_s == pytest.approx(0.368 / 3)
    assert ddp.speedup_vs_ddp == pytest.approx(1.0)
    assert car.speedup_vs_ddp == pytest.approx(0.181 / 0.120)
    assert car.exposed_comm_s == pytest.approx(0.020)
    assert ddp.exposed_comm_s == pytest.approx(0.081)
    assert car.efficiency == pytest.approx((0.180 - 0.120) / (0.180 - 0.100))
    assert ddp.efficiency == pytest.approx((0.180 - 0.181) / 0.080)
    assert car.comm_compute_ratio == pytest.approx(0.8) and car.regime == "balanced"
    assert car.lower_bound_s == 0.105 and car.steps == 3 and car.network == "netns+tc 300mbit"
    assert car.engine_wait_per_step_s == pytest.approx(0.5 / 40) and ddp.engine_wait_per_step_s is None


def test_overlap_trial_is_carried_into_the_record_and_the_evidence():
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "caramel": [[0.121]]}
    raw = _raw(times)
    trial = {"step_period_s": {"caramel/forward": 0.118, "caramel/backward": 0.125, "fifo/backward": 0.179},
             "chosen": "caramel/forward", "fastest": "caramel/forward"}
    raw["stats"]["caramel"]["overlap_trial"] = trial
    recs = {r.strategy: r for r in summarize(raw)}
    assert recs["caramel"].overlap_trial == trial and recs["ddp"].overlap_trial is None
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert ("overlap trial: caramel/forward 118.0 ms, caramel/backward 125.0 ms, fifo/backward 179.0 ms"
            " -> caramel/forward") in md
    # a choice other than the baseline was checked on fresh steps: the report says how it went
    trial["confirmation"] = {"candidate": "caramel/forward", "confirmed": False,
                             "step_period_s": {"caramel/forward": 0.1231, "caramel/backward": 0.1242}}
    trial["chosen"] = "caramel/backward"
    md = format_markdown(summarize(raw), "caramel bench", {})
    assert ("fifo/backward 179.0 ms -> caramel/backward (caramel/forward led, not confirmed on fresh steps: "
            "123.1 against 124.2 ms)") in md
    # the simulator's predictions for the planner's plans, which set the trial's baseline
    trial["predicted_step_time_s"] = {"caramel/forward": 0.1104, "caramel/backward": 0.1272}
    md = format_markdown(summarize(raw), "caramel bench", {})
    assert ("overlap trial: caramel/forward 118.0 ms (predicted 110.4 ms), caramel/backward 125.0 ms (predicted 127.2 ms), "
            "fifo/backward 179.0 ms -> caramel/backward") in md


def test_the_plan_the_engine_ran_is_carried_into_the_evidence():
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "caramel": [[0.121]]}
    raw = _raw(times)
    raw["stats"]["caramel"]["plan"] = {"planner": "caramel", "order": "hybrid:2", "bucket_bytes": [600_000, 1_220_000],
                                       "items": 3, "predicted_step_time_s": 0.0669, "bandwidth_bps": 4.84e8,
                                       "latency_s": 1.45e-3, "queued_latency_s": 2.5e-4}
    recs = {r.strategy: r for r in summarize(raw)}
    assert recs["caramel"].plan["order"] == "hybrid:2" and recs["ddp"].plan is None
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert ("plan: caramel hybrid:2; 2 buckets (0.60, 1.22 MB), 3 collectives; predicted 66.9 ms; "
            "for 484 Mbit/s, alpha 1.45 ms (0.25 ms queued)") in md
    # after a hand-over torch DDP runs its own buckets: the engine's plan is not the story
    raw["stats"]["caramel"]["delegated_to_ddp"] = True
    assert "plan: " not in format_markdown(summarize(raw), "caramel bench", {})


def test_a_delegated_run_says_so_and_shows_no_engine_timeline():
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "caramel": [[0.180]]}
    raw = _raw(times)
    raw["stats"]["caramel"].update(delegated_to_ddp=True, overlap_trial={
        "step_period_s": {"caramel/forward": 0.19, "caramel/backward": 0.2, "fifo/backward": 0.18}, "chosen": "fifo/backward"})
    raw["timeline"] = {"caramel": {"compute_s": 0.03, "comm_s": 0.0, "hidden_comm_s": 0.0, "exposed_comm_s": 0.0, "wait_s": 0.0}}
    recs = {r.strategy: r for r in summarize(raw)}
    assert recs["caramel"].delegated_to_ddp and not recs["ddp"].delegated_to_ddp
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert "-> fifo/backward (run by torch DDP from then on)" in md
    # the engine's timeline covers only what ran before the hand-over: not shown as the step's story
    assert "timeline (mean per step)" not in md


def test_exposed_communication_is_never_negative():
    times = {"compute": [[0.100]], "comm": [[0.05]], "ddp": [[0.095]]}
    (ddp, _car) = summarize(_raw(times, workers=1))
    assert ddp.exposed_comm_s == 0.0 and ddp.efficiency == pytest.approx((0.15 - 0.095) / 0.05)


def test_summarize_keeps_skipped_strategies_visible():
    times = {"compute": [[0.1]], "comm": [[0.05]], "ddp": [[0.15]]}
    recs = summarize(_raw(times, skipped={"caramel": "engine missing"}, workers=1))
    car = next(r for r in recs if r.strategy == "caramel")
    assert car.skipped == "engine missing" and car.step_time_median_s is None and car.speedup_vs_ddp is None
    assert "skipped caramel" in format_table(recs)


def _rec(strategy, t, ddp_t, compute=0.1, comm=0.1, bandwidth="1gbit"):
    return Record(model="m", workers=2, bandwidth=bandwidth, strategy=strategy, step_time_median_s=t,
                  step_time_p90_s=t, step_time_mean_s=t, compute_s=compute, comm_s=comm, exposed_comm_s=t - compute,
                  speedup_vs_ddp=ddp_t / t, efficiency=efficiency(t, compute, comm),
                  comm_compute_ratio=comm / compute, regime=regime_of(comm, compute), intended_regime="custom",
                  batch_size=8, model_options={}, network="x", steps=10, grad_bytes=1)


def test_targets_met():
    recs = [_rec("caramel", 0.100, 0.100, comm=0.03, bandwidth="a"),   # compute-bound, equal
            _rec("caramel", 0.105, 0.200, bandwidth="b"),              # balanced, 1.905x, E 0.95
            _rec("caramel", 0.210, 0.300, comm=0.2, bandwidth="c")]    # comm-bound, 1.43x, E 0.9
    res = check_targets(recs)
    assert [t.met for t in res] == [True, True, True]
    assert res[1].value == f"{math.sqrt(0.2 / 0.105 * 0.3 / 0.21):.3f}x"


def test_targets_not_met_are_reported():
    recs = [_rec("caramel", 0.104, 0.100, comm=0.03, bandwidth="a"),   # 4% slower
            _rec("caramel", 0.180, 0.200, bandwidth="b")]              # 1.11x, E 0.2
    slower, speed, eff = check_targets(recs)
    assert slower.met is False and "+4.0%" in slower.value
    assert speed.met is False and eff.met is False
    assert check_targets([_rec("ddp", 0.1, 0.1)])[0].met is None  # nothing to evaluate


def test_json_and_markdown_outputs(tmp_path):
    recs = [_rec("ddp", 0.2, 0.2), _rec("caramel", 0.12, 0.2)]
    data = to_json(recs, {"command": "caramel bench"})
    assert data["format"] == "caramel.bench/1"
    for key in ("model", "workers", "bandwidth", "strategy", "step_time_median_s", "step_time_p90_s",
                "compute_s", "comm_s", "speedup_vs_ddp", "efficiency"):
        assert key in data["records"][0]
    report.write_records(tmp_path / "r.json", recs)
    assert json.loads((tmp_path / "r.json").read_text())["records"][1]["speedup_vs_ddp"] == pytest.approx(0.2 / 0.12)
    md = format_markdown(recs, "caramel bench --quick", {"host": "test"})
    assert "caramel bench --quick" in md and "| caramel |" in md
    assert "1.667x" in md and "Targets" in md


def test_speedup_interval_from_paired_rounds():
    from caramel.bench.report import speedup_interval

    # every round exactly 2x: no spread, the interval is the point
    ddp, car = [0.2, 0.2] * 4, [0.1, 0.1] * 4
    assert speedup_interval(ddp, car, 2) == pytest.approx((2.0, 2.0))
    # a machine-wide drift between rounds hits both alike and does not widen it
    drift = [1.0, 1.0, 1.5, 1.5, 0.8, 0.8, 1.2, 1.2]
    lo, hi = speedup_interval([0.2 * d for d in drift], [0.1 * d for d in drift], 2)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    # rounds that disagree: the interval holds the point and narrows with more rounds alike
    ddp6, car6 = [0.2] * 6, [0.09, 0.11, 0.1, 0.09, 0.11, 0.1]
    lo3, hi3 = speedup_interval(ddp6[:3], car6[:3], 1)
    lo6, hi6 = speedup_interval(ddp6, car6, 1)
    point = 0.2 / 0.1
    assert lo3 < point < hi3 and lo6 < point < hi6 and hi6 - lo6 < hi3 - lo3
    # fewer than 3 rounds: no interval
    assert speedup_interval([0.2] * 4, [0.1] * 4, 2) is None


def test_records_and_reports_carry_the_interval():
    times = {"compute": [[0.100] * 6], "comm": [[0.080] * 6], "ddp": [[0.18, 0.18, 0.19, 0.19, 0.18, 0.18]],
             "caramel": [[0.19, 0.19, 0.18, 0.18, 0.19, 0.19]]}
    raw = _raw(times)
    raw["settings"] = {"steps_per_round": 2}
    recs = {r.strategy: r for r in summarize(raw)}
    lo, hi = recs["caramel"].speedup_ci95
    assert lo < 1.0 < hi and recs["ddp"].speedup_ci95 is None
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert f"| {lo:.2f}-{hi:.2f} |" in md
    assert "95% interval of its speedup" in md


def test_concurrent_baseline_gives_the_ceiling_on_this_host():
    # compute 100 ms, comm 80 ms: a perfect overlap would take 100 ms (L); run side by side on
    # this host they took 150 ms, so no schedule can beat DDP's 181 ms by more than 181 / 150
    times = {"compute": [[0.100]], "comm": [[0.080]], "concurrent": [[0.150, 0.149, 0.151]],
             "ddp": [[0.181]], "caramel": [[0.160]]}
    recs = {r.strategy: r for r in summarize(_raw(times))}
    car = recs["caramel"]
    assert car.concurrent_s == pytest.approx(0.150) and recs["ddp"].concurrent_s == pytest.approx(0.150)
    # the bound (105 ms) is below both, and overlapping (150) beats not overlapping (U = 180)
    assert report.ceiling_s(car) == pytest.approx(0.150)
    assert report.ceiling_speedup(car) == pytest.approx(0.181 / 0.150)
    assert report.ceiling_speedup(recs["ddp"]) == pytest.approx(0.181 / 0.150)
    speed = check_targets(list(recs.values()))[1]
    assert speed.value == f"{0.181 / 0.160:.3f}x" and f"is {0.181 / 0.150:.3f}x over the same" in speed.detail
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert "| 150.0 |" in md and f"estimated ceiling 150.0 ms (E 0.38), DDP / ceiling {0.181 / 0.150:.3f}x" in md
    assert [r["ceiling_s"] for r in to_json(list(recs.values()))["records"]] == pytest.approx([0.150, 0.150])
    # E of the concurrent baseline itself: (180 - 150) / (180 - 100)
    eff = check_targets(list(recs.values()))[2]
    assert f"reaches median E {(0.180 - 0.150) / (0.180 - 0.100):.2f}" in eff.detail
    # the ceiling (here the concurrent baseline) reaches E 0.375 < 0.9: the report says that no
    # schedule is expected to meet the target here, and gives the ceiling's E per configuration
    assert f"the estimated ceiling (the bound's dependencies as well) median E {0.375:.2f}: below 0.9" in eff.detail
    # a host that leaves room: the ceiling is the bound (105 ms), E (180 - 105) / 80 >= 0.9
    for r in recs.values():
        r.concurrent_s = 0.102
    roomy = check_targets(list(recs.values()))[2]
    assert f"median E {(0.180 - 0.105) / 0.080:.2f}" in roomy.detail and "below" not in roomy.detail
    for r in recs.values():
        r.concurrent_s = 0.150
    # overlapping everything costs more than not overlapping (U): no overlap is the better estimate
    car.concurrent_s = 0.200
    assert report.ceiling_s(car) == pytest.approx(0.180)
    # the dependencies cost more than the contention: the bound decides
    car.concurrent_s, car.lower_bound_s = 0.120, 0.130
    assert report.ceiling_s(car) == pytest.approx(0.130)
    # a raw file from before the baseline existed: no ceiling, nothing invented
    del times["concurrent"]
    old = {r.strategy: r for r in summarize(_raw(times))}
    assert old["caramel"].concurrent_s is None and report.ceiling_speedup(old["caramel"]) is None
    assert "ceiling" not in check_targets(list(old.values()))[1].detail
    assert "concurrent" not in check_targets(list(old.values()))[2].detail
