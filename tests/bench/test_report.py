"""The bench's arithmetic on recorded numbers: step series, baselines, E, reference, speedup, share, summary."""
import json
import math

import pytest

from caramel.bench import report
from caramel.bench import tables
from caramel.bench.report import (Record, efficiency, free_running_pace_s, job_step_times, regime_of, summarize,
                                  summarize_strategies, to_json)
from caramel.bench.tables import format_markdown, format_table
from caramel.stats import median
from caramel.errors import FormatError


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
    assert ddp.speedup == pytest.approx(1.0) and car.reference == "ddp"
    assert car.speedup == pytest.approx(0.181 / 0.120)
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
    assert car.skipped == "engine missing" and car.step_time_median_s is None and car.speedup is None
    assert "skipped caramel" in format_table(recs)


def _rec(strategy, t, ddp_t, compute=0.1, comm=0.1, bandwidth="1gbit", regime=None, concurrent=None, bound=None):
    return Record(model="m", workers=2, bandwidth=bandwidth, strategy=strategy, step_time_median_s=t,
                  step_time_p90_s=t, step_time_mean_s=t, compute_s=compute, comm_s=comm, exposed_comm_s=t - compute,
                  reference="ddp", reference_step_s=ddp_t, speedup=ddp_t / t, efficiency=efficiency(t, compute, comm),
                  comm_compute_ratio=comm / compute, regime=regime_of(comm, compute), intended_regime=regime or "custom",
                  batch_size=8, model_options={}, network="x", steps=10, grad_bytes=1, concurrent_s=concurrent,
                  lower_bound_s=bound,
                  share_captured=report.share_captured(ddp_t, t, report.estimated_ceiling_s(bound, concurrent, compute, comm)))


def test_json_and_markdown_outputs(tmp_path):
    recs = [_rec("ddp", 0.2, 0.2), _rec("caramel", 0.12, 0.2)]
    data = to_json(recs, {"command": "caramel bench"})
    assert data["format"] == "caramel.bench/3"
    for key in ("model", "workers", "bandwidth", "strategy", "step_time_median_s", "step_time_p90_s",
                "compute_s", "comm_s", "reference", "speedup", "share_captured", "target_ratio", "rate_source",
                "calibrated_compute_s", "ceiling_s", "efficiency"):
        assert key in data["records"][0]
    report.write_records(tmp_path / "r.json", recs)
    assert json.loads((tmp_path / "r.json").read_text())["records"][1]["speedup"] == pytest.approx(0.2 / 0.12)
    md = format_markdown(recs, "caramel bench --quick", {"host": "test"})
    assert "caramel bench --quick" in md and "| caramel |" in md
    assert "1.667x" in md and "## Summary" in md
    assert "Target" not in md and "MET" not in md  # facts only: the targets live in docs/benchmarks.md


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
    # the rounds a record keeps are the whole rounds its interval paired (a partial last one is dropped)
    raw["step_times_s"] = {k: [v[0] + [0.5]] for k, v in times.items()}
    assert [r.round_medians_s for r in summarize(raw) if r.strategy == "caramel"] == [[0.19, 0.18, 0.19]]
    assert f"worst {recs['caramel'].speedup:.3f}x ({lo:.3f}-{hi:.3f})" in md


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
    # share captured: (181 - 160) / (181 - 150)
    assert car.share_captured == pytest.approx(0.021 / 0.031) and recs["ddp"].share_captured == pytest.approx(0.0)
    (summary,) = summarize_strategies(list(recs.values()))
    assert summary.geomean_speedup == pytest.approx(0.181 / 0.160)  # balanced by measurement (pinned rate)
    assert summary.ceiling_geomean_speedup == pytest.approx(0.181 / 0.150)
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert "| 150.0 |" in md and f"estimated ceiling 150.0 ms (E 0.38), ddp / ceiling {0.181 / 0.150:.3f}x" in md
    assert f"(estimated ceiling {0.181 / 0.150:.3f}x)" in md
    assert [r["ceiling_s"] for r in to_json(list(recs.values()))["records"]] == pytest.approx([0.150, 0.150])
    # overlapping everything costs more than not overlapping (U): no overlap is the better estimate
    car.concurrent_s = 0.200
    assert report.ceiling_s(car) == pytest.approx(0.180)
    # the dependencies cost more than the contention: the bound decides
    car.concurrent_s, car.lower_bound_s = 0.120, 0.130
    assert report.ceiling_s(car) == pytest.approx(0.130)
    # a raw file without the concurrent baseline: no ceiling, no share, nothing invented
    del times["concurrent"]
    old = {r.strategy: r for r in summarize(_raw(times))}
    assert old["caramel"].concurrent_s is None and report.ceiling_speedup(old["caramel"]) is None
    assert old["caramel"].share_captured is None
    assert summarize_strategies(list(old.values()))[0].ceiling_geomean_speedup is None


def test_the_reference_is_the_stronger_ddp_variant_of_each_configuration():
    rt = "ddp:comm_priority=realtime"
    times = {"compute": [[0.100] * 6], "comm": [[0.080] * 6], "ddp": [[0.20] * 6], rt: [[0.18] * 6],
             "caramel": [[0.12] * 6]}
    raw = dict(_raw(times, strategies=("ddp", rt, "caramel")), settings={"steps_per_round": 2})
    raw["strategies"][1]["kind"] = "ddp"
    recs = {r.strategy: r for r in summarize(raw)}
    assert {r.reference for r in recs.values()} == {rt}
    assert recs["caramel"].speedup == pytest.approx(0.18 / 0.12) and recs[rt].speedup == pytest.approx(1.0)
    assert recs["ddp"].speedup == pytest.approx(0.18 / 0.20)  # the weaker variant is slower than the reference
    assert recs[rt].speedup_ci95 is None and recs["caramel"].speedup_ci95 == pytest.approx((1.5, 1.5))
    # the other way round in another configuration: plain DDP is the stronger there
    times[rt], times["ddp"] = [[0.20] * 6], [[0.18] * 6]
    assert {r.reference for r in summarize(raw)} == {"ddp"}
    # a tie goes to the first listed
    times[rt] = [[0.18] * 6]
    assert report.reference_of({"ddp": 0.18, rt: 0.18, "caramel": 0.1}, {"ddp": "ddp", rt: "ddp", "caramel": "caramel"}) == "ddp"
    # the realtime variant was skipped (no privilege): plain DDP is the reference
    del times[rt]
    recs = {r.strategy: r for r in summarize(dict(raw, skipped={rt: "no privilege"}))}
    assert recs["caramel"].reference == "ddp" and recs[rt].skipped == "no privilege"
    # no DDP at all: no reference, no speedup
    assert report.reference_of({"caramel": 0.1}, {"caramel": "caramel"}) is None


def test_share_captured():
    # reference 200 ms, ceiling 100 ms: 150 ms captured half of the possible gain
    assert report.share_captured(0.200, 0.150, 0.100) == pytest.approx(0.5)
    assert report.share_captured(0.200, 0.100, 0.100) == pytest.approx(1.0)
    assert report.share_captured(0.200, 0.210, 0.100) == pytest.approx(-0.1)  # slower than the reference
    assert report.share_captured(0.200, 0.150, 0.200) is None  # the reference is already at the ceiling
    assert report.share_captured(0.200, 0.150, None) is None


def test_summary_counts_balanced_and_comm_bound_points_and_names_the_worst_row():
    recs = [_rec("ddp", 0.1, 0.1, bandwidth="a", regime="compute-bound"),
            _rec("caramel", 0.104, 0.100, comm=0.03, bandwidth="a", regime="compute-bound", concurrent=0.1, bound=0.1),
            _rec("ddp", 0.2, 0.2, bandwidth="b", regime="balanced"),
            _rec("caramel", 0.125, 0.200, bandwidth="b", regime="balanced", concurrent=0.1, bound=0.1),   # 1.6x, share 0.75
            _rec("caramel", 0.250, 0.300, comm=0.2, bandwidth="c", regime="comm-bound", concurrent=0.2, bound=0.2),  # 1.2x, 0.5
            _rec("caramel:planner=fifo", 0.2, 0.2, bandwidth="b", regime="balanced")]
    car, fifo = summarize_strategies(recs)
    assert car.strategy == "caramel" and car.rows == 3 and car.headline_rows == 2
    assert car.geomean_speedup == pytest.approx(math.sqrt(1.6 * 1.2))
    assert car.median_share_captured == pytest.approx((0.75 + 0.5) / 2) and car.share_rows == 2
    assert car.worst_speedup == pytest.approx(0.100 / 0.104) and car.worst_configuration == "m(b=8) x2 @ a"
    assert car.ceiling_geomean_speedup == pytest.approx(math.sqrt(2.0 * 1.5))
    assert fifo.geomean_speedup == pytest.approx(1.0) and fifo.median_share_captured is None
    text = tables.format_summary([car, fifo])
    assert f"geomean speedup {math.sqrt(1.92):.3f}x over 2 balanced and comm-bound point(s)" in text
    assert "median share of the possible gain captured 62% (2 point(s))" in text
    assert f"worst {0.1 / 0.104:.3f}x on m(b=8) x2 @ a" in text
    # the point's own regime counts, not the measured one: a compute-bound point that measured
    # balanced on a slow host stays out of the geomean
    recs[1].regime = "balanced"
    assert summarize_strategies(recs)[0].headline_rows == 2
    # a pinned rate has no point regime: the measured one counts
    recs[1].intended_regime = "custom"
    assert summarize_strategies(recs)[0].headline_rows == 3
    assert summarize_strategies([_rec("ddp", 0.1, 0.1)]) == []


def test_json_round_trip_and_the_version_it_reads(tmp_path):
    times = {"compute": [[0.100] * 6], "comm": [[0.080] * 6], "concurrent": [[0.120] * 6],
             "ddp": [[0.18, 0.18, 0.19, 0.19, 0.18, 0.18]], "caramel": [[0.13, 0.13, 0.12, 0.12, 0.13, 0.13]]}
    raw = dict(_raw(times), settings={"steps_per_round": 2})
    raw["config"].update(comm_ratio=1.0, calibrated_compute_s=0.098, bandwidth="612mbit")
    recs = summarize(raw)
    assert recs[1].target_ratio == 1.0 and recs[1].rate_source == "derived" and recs[1].calibrated_compute_s == 0.098
    path = tmp_path / "bench.json"
    report.write_records(path, recs, {"command": "caramel bench"})
    back = report.read_records(path)
    assert back.records == recs and back.meta == {"command": "caramel bench"}
    assert back.summary == summarize_strategies(recs) and back.summary[0].worst_ci95 == recs[1].speedup_ci95
    data = json.loads(path.read_text())
    assert data["records"][1]["share_captured"] == pytest.approx(recs[1].share_captured)
    assert data["summary"][0]["strategy"] == "caramel"
    # a file of the previous format, or of none, is refused naming the version this reader expects
    data["format"] = "caramel.bench/1"
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(FormatError, match="expected one of 'caramel.bench/2', 'caramel.bench/3'"):
        report.read_records(tmp_path / "old.json")
    with pytest.raises(FormatError, match="caramel.bench/3"):
        report.read_records(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": "caramel.bench/3", "records": [{"model": 1}]}')
    with pytest.raises(FormatError, match="not a complete caramel.bench/3"):
        report.read_records(tmp_path / "bad.json")


def test_markdown_lists_each_points_target_rate_and_measured_ratio():
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "caramel": [[0.121]]}
    raw = _raw(times)
    raw["config"].update(comm_ratio=1.0, calibrated_compute_s=0.098, bandwidth="612mbit", regime="balanced")
    md = format_markdown(summarize(raw), "caramel bench", {})
    assert ("- resnet18(b=8,width=16) x2 @ 612mbit: target comm/compute 1 (balanced): compute 98.0 ms at run start "
            "-> 612mbit; measured compute 100.0 ms, comm 80.0 ms, comm/compute 0.80 (balanced); reference ddp") in md
    assert "| 612mbit (derived) |" in md
    pinned = _raw(times)
    assert "rate pinned at 300mbit" in format_markdown(summarize(pinned), "caramel bench", {})


def test_a_pipelines_cut_bubble_and_busy_times_are_carried_into_its_record():
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "pipeline:replicas=2+1": [[0.111]]}
    raw = _raw(times, strategies=("ddp", "pipeline:replicas=2+1"), workers=3)
    raw["stats"]["pipeline:replicas=2+1"] = {
        "boundaries": ["layer4"], "microbatches": 4, "predicted_slowest_stage_s": 0.0092,
        "predicted_busy_s_per_stage": [0.0367, 0.0224], "bubble_fraction": 0.41,
        "bubble_fraction_per_stage": [0.52, 0.38, 0.33], "busy_s_per_stage": [0.0416, 0.0543, 0.0393],
        "bubble_steps": 31}
    recs = {r.strategy: r for r in summarize(raw)}
    pipe = recs["pipeline:replicas=2+1"].pipeline
    assert pipe["boundaries"] == ["layer4"] and pipe["busy_s_per_stage"] == [0.0416, 0.0543, 0.0393]
    assert pipe["predicted_busy_s_per_stage"] == [0.0367, 0.0224] and pipe["bubble_fraction"] == 0.41
    assert pipe["bubble_fraction_ideal"] is None  # unequal replicas have no textbook fraction
    assert recs["ddp"].pipeline is None


def test_the_simulators_busy_time_is_reported_beside_the_timers():
    """The simulator's compute per position, in the runtime's timer's terms, beside the measured
    one: the prediction's plan carries it, not the partitioner's stage times."""
    from caramel.bench.tables import format_predictions

    name = "pipeline:replicas=2"
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], name: [[0.150]]}
    raw = _raw(times, strategies=("ddp", name), workers=4)
    raw["stats"][name] = {"boundaries": ["layer4"], "microbatches": 2, "predicted_busy_s_per_stage": [0.1648, 0.0966],
                          "busy_s_per_stage": [0.1277, 0.0563]}
    raw["predicted"] = {"ddp": {"step_time_s": 0.2, "exact": True},
                        name: {"step_time_s": 0.16, "exact": True,
                               "plan": {"boundaries": ["layer4"], "busy_s_per_lane": [0.1445, 0.0395],
                                        "timed_busy_s_per_lane": [0.1496, 0.0395]}}}
    text = format_predictions(summarize(raw))
    assert (f"  - {name}: busy ms per stage simulated [149.6, 39.5] (computing [144.5, 39.5]), "
            "measured [127.7, 56.3]") in text
    assert "164.8" not in text and "ddp: busy" not in text
    # no compute in the plan: no "computing" figure, rather than the timed one under its label
    del raw["predicted"][name]["plan"]["busy_s_per_lane"]
    assert f"  - {name}: busy ms per stage simulated [149.6, 39.5], measured [127.7, 56.3]" in \
        format_predictions(summarize(raw))
    # unequal counts: the runtime's figures are per rank, and so are the simulator's lanes
    raw["stats"][name].update(stages=2, busy_s_per_stage=[0.1277, 0.0563, 0.0601])
    raw["predicted"][name]["plan"]["timed_busy_s_per_lane"] = [0.1496, 0.0395, 0.0395]
    assert f"  - {name}: busy ms per rank simulated [149.6, 39.5, 39.5], measured [127.7, 56.3, 60.1]" in \
        format_predictions(summarize(raw))
    # the runtime ran another cut than the prediction's: its simulated busy time is not shown
    raw["pipeline_plan_mismatch"] = {name: "cut ['layer3'] ran, ['layer4'] predicted"}
    assert "busy ms per" not in format_predictions(summarize(raw))


def test_dropout_changes_are_carried_into_the_record_and_a_file_without_them_reads(tmp_path):
    times = {"compute": [[0.100]], "comm": [[0.080]], "ddp": [[0.181]], "caramel": [[0.121]]}
    raw = _raw(times)
    change = {"step": 20, "fractions": [0.0, 0.5], "previous": [0.0, 0.0], "compute_s": [0.04, 0.07],
              "spread_s": [0.004, 0.005]}
    raw["stats"]["caramel"].update(dropout_fractions=[0.0, 0.5], dropout_changes=[change])
    recs = {r.strategy: r for r in summarize(raw)}
    assert recs["caramel"].dropout_changes == [change] and recs["caramel"].dropout_fractions == [0.0, 0.5]
    assert recs["ddp"].dropout_changes is None
    path = tmp_path / "bench.json"
    report.write_records(path, list(recs.values()), {})
    assert report.read_records(path).records == list(recs.values())
    data = json.loads(path.read_text())  # a file written before the field reads as "not recorded"
    for r in data["records"]:
        del r["dropout_changes"]
    path.write_text(json.dumps(data))
    assert [r.dropout_changes for r in report.read_records(path).records] == [None, None]


def test_a_row_whose_block_times_its_drain_takes_the_block_mean():
    """asp's block is compute-paced steps and a drain on its last one (`caramel.bench.blocks`), so
    its median is the compute step by construction: T is the block mean; a bsp row keeps its median."""
    asp_round = [0.05, 0.05, 0.05, 0.25]  # mean 0.10, median 0.05
    times = {"compute": [[0.05] * 12], "comm": [[0.08] * 12], "ddp": [[0.15] * 12],
             "ps": [[0.12, 0.12, 0.14, 0.12] * 3],
             "ps:consistency=asp": [asp_round + asp_round[:3] + [0.29] + asp_round]}
    raw = dict(_raw(times, strategies=("ddp", "ps", "ps:consistency=asp")), settings={"steps_per_round": 4})
    raw["blocks"] = {"ddp": {"entry_steps": 1, "drain_timed": False}, "ps": {"entry_steps": 1, "drain_timed": False},
                     "ps:consistency=asp": {"entry_steps": 0, "drain_timed": True}}
    recs = {r.strategy: r for r in summarize(raw)}
    asp, bsp = recs["ps:consistency=asp"], recs["ps"]
    mean_s = (0.40 + 0.44 + 0.40) / 12
    assert asp.step_basis == "mean" and asp.step_s == pytest.approx(mean_s)
    assert asp.step_time_median_s == pytest.approx(0.05)  # still recorded, as what it is
    assert asp.speedup == pytest.approx(0.15 / mean_s) and asp.round_medians_s == pytest.approx([0.10, 0.11, 0.10])
    lo, hi = asp.speedup_ci95
    assert lo < asp.speedup < hi and hi < 0.15 / 0.09
    assert asp.efficiency == pytest.approx(efficiency(mean_s, 0.05, 0.08))
    assert bsp.step_basis == "median" and bsp.step_s == bsp.step_time_median_s == pytest.approx(0.12)
    assert bsp.speedup == pytest.approx(0.15 / 0.12) and bsp.round_medians_s == pytest.approx([0.12] * 3)
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert f"| {1e3 * mean_s:.1f} (block mean) |" in md and "| 120.0 |" in md
    back = report.from_json(json.loads(json.dumps(to_json(list(recs.values())))))
    assert [r.step_basis for r in back.records] == ["median", "median", "mean"]
