"""The validation runner: calibration fit, the matrix, turning raw per-rank times into records,
the reshaping handshake, and a 2-configuration smoke run on loopback (real processes, real engine)."""
import statistics
import sys
import time

import pytest

from caramel.errors import CaramelError
from caramel.jsonio import format_tag
from experiments.validation.compare import ValidationConfig, ValidationRecord, ValidationReport, score
from experiments.validation.run import (DEFAULT_GROUPS, QUICK_GROUPS, QUICK_SETTINGS, Calibration, ModelGroup,
                                      ValidationSettings, _BandwidthServer, _s, fit_calibration, main, make_job,
                                      records_from_raw, run_validation)
from experiments.validation.tables import (ALTERNATIVES, alternative_records, compare_runs, consensus_as_prediction,
                                        consensus_floor, floor_table, interference_records, lone_latency_records,
                                        markdown_table)
from experiments.validation.worker import done_path, request_path


@pytest.mark.timeout(10)
def test_fit_calibration_recovers_alpha_and_goodput():
    n, rate, alpha, goodput = 4, 2e8, 150e-6, 0.9
    sizes = [1024, 65536, 1 << 20, 4 << 20]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * 8 * s / (goodput * rate) for s in sizes]
    a, g = fit_calibration(sizes, times, n, rate)
    # alpha from the smallest message, less its transfer at the tc rate (not the goodput): exact up to that
    small_err = 2 * (n - 1) / n * 8 * 1024 * (1 / (goodput * rate) - 1 / rate) / (2 * (n - 1))
    assert a == pytest.approx(alpha + small_err, rel=1e-9)
    assert g == pytest.approx(goodput, rel=2e-3)
    # large messages alone never move alpha: a line through them would have a negative intercept here
    times2 = [2e-3, 2.1e-3, 0.05, 0.19]
    a2, g2 = fit_calibration(sizes, times2, 2, 2e8)
    assert a2 == pytest.approx((2e-3 - 8 * 1024 / 2e8) / 2)
    with pytest.raises(CaramelError, match="two different sizes"):
        fit_calibration([1000, 1000], [1.0, 1.0], 2, 1e8)
    with pytest.raises(CaramelError, match="at least 262144 bytes"):
        fit_calibration([1000, 2000], [1.0, 2.0], 2, 1e8)
    with pytest.raises(CaramelError, match="do not grow"):
        fit_calibration([1000, 1 << 20], [2.0, 1.0], 2, 1e8)


@pytest.mark.timeout(10)
def test_default_matrix_covers_the_issue():
    configs = [c for g in DEFAULT_GROUPS for c in g.configs(1e-4)]
    assert len(configs) >= 30
    assert {c.planner for c in configs} >= {"fifo", "fusion", "caramel", "ddp"}
    assert {c.overlap for c in configs} == {"forward", "backward", "none"}
    assert len({g.model for g in DEFAULT_GROUPS}) >= 4
    assert {c.workers for c in configs} == {2, 4}
    assert min(c.bandwidth_bps for c in configs) <= 50e6 and max(c.bandwidth_bps for c in configs) >= 1e9
    assert len({c.options.get("bucket_cap_mb") for c in configs}) >= 3
    # strategies are unique within a setting, or ranking pairs would compare a strategy with itself
    by_setting = {}
    for c in configs:
        by_setting.setdefault(c.setting(), []).append(c.strategy())
    assert all(len(v) == len(set(v)) for v in by_setting.values())


@pytest.mark.timeout(10)
def test_settings_reject_bad_values():
    with pytest.raises(CaramelError, match="rounds"):
        ValidationSettings(rounds=0)
    with pytest.raises(CaramelError, match="warmup_steps"):
        ValidationSettings(warmup_steps=-1)


def _group():
    return ModelGroup("mlp", 8, 2, ["100mbit", "1gbit"], [_s("fifo", "backward"), _s("caramel", "forward")], {"width": 8})


def _raw(group, fingerprints=("a", "b", "c", "d")):
    """Two bandwidths x two strategies; rank 1 slower in some steps; 2 rounds of 3 steps."""
    def rank_result(times_by_key, stats):
        return {"times": times_by_key, "stats": stats}

    r0 = {"0": [[1.0, 1.0, 1.0], [1.2, 1.2, 1.2]], "1": [[0.5, 0.6, 0.5], [0.5, 0.5, 0.5]], "compute": [[0.3] * 3] * 2}
    r1 = {"0": [[1.1, 0.9, 1.0], [1.2, 1.3, 1.2]], "1": [[0.5, 0.5, 0.7], [0.4, 0.5, 0.5]], "compute": [[0.4] * 3] * 2}
    r0b = {"2": [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]], "3": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]}
    stats = {"0": {"plan_fingerprint": "a"}, "1": {"plan_fingerprint": "b"}}
    stats_b = {"2": {"plan_fingerprint": "c"}, "3": {"plan_fingerprint": "d"}}
    preds = [{"predicted_step_time_s": p, "predicted_compute_s": 0.25, "plan_fingerprint": f}
             for p, f in zip([1.1, 0.55, 2.2, 0.9], fingerprints)]
    return {"format": format_tag("validation_raw"), "configs": [{}] * 4, "predictions": preds,
            "measure_started_at": 10.0, "meta": {"load_average": [1, 1, 1]},
            "measured": [[rank_result(r0, stats), rank_result(r1, stats)],
                         [rank_result(r0b, stats_b), rank_result(r0b, stats_b)]]}


@pytest.mark.timeout(10)
def test_records_from_raw_takes_the_slowest_ranks_clock_per_step():
    group = _group()
    cal = Calibration(2, 1e-4, 0.9, "given")
    records, info = records_from_raw(group, cal, _raw(group), predicted_at=5.0)
    assert [r.config.strategy() for r in records] == ["fifo/backward", "caramel/forward"] * 2
    # clocks 1.0 2.0 3.0 and 1.1 2.0 3.0: the job's steps 1.1 0.9 1.0; then 1.2 1.3 1.2
    assert records[0].measured_step_times_s == pytest.approx([1.1, 0.9, 1.0, 1.2, 1.3, 1.2])
    assert records[0].repeat_medians_s == pytest.approx([1.0, 1.2])
    assert records[0].measured_median_s == pytest.approx(1.15)
    assert records[0].error == pytest.approx(1.1 / 1.15 - 1)
    assert records[1].measured_step_times_s == pytest.approx([0.5, 0.6, 0.6, 0.5, 0.5, 0.5])
    assert records[1].error == pytest.approx(0.55 / 0.5 - 1)
    assert records[2].config.bandwidth_bps == 1e9 and records[2].error == pytest.approx(0.1)
    assert info["compute_only_measured_s"] == pytest.approx(0.4)
    assert info["predicted_at"] < info["measure_started_at"]
    s = score(records)
    assert s["configurations"] == 4 and s["ranking"]["agree"] == 2
    assert statistics.median(abs(r.error) for r in records) == pytest.approx(s["median_abs_error"])


def _report_with(**predictions: list[float]) -> tuple[ValidationReport, list, dict]:
    """A scored report of `_raw` whose predictions also carry `predicted_<key>` per configuration."""
    group = _group()
    raw = _raw(group)
    for key, values in predictions.items():
        for p, v in zip(raw["predictions"], values):
            p[f"predicted_{key}"] = v
    records, info = records_from_raw(group, Calibration(2, 1e-4, 0.9, "given"), raw, predicted_at=5.0)
    return ValidationReport(records, {"jobs": [info]}), records, info


@pytest.mark.timeout(10)
def test_interference_records_and_table():
    report, records, _ = _report_with(interference_step_time_s=[1.15, 0.6, 2.2, 1.0])
    both = interference_records(report)
    assert [r.predicted_step_time_s for r in both] == [1.15, 0.6, 2.2, 1.0]
    assert [r.measured_step_times_s for r in both] == [r.measured_step_times_s for r in records]
    assert both[0].error == pytest.approx(0.0) and both[3].error == pytest.approx(0.0)
    table = markdown_table(report)
    assert "| mlp(width=8,b=8) | 2 | 100mbit | fifo/backward | 1100.0 | 1150.0 | 1150.0 | -4.3% | +0.0% |" in table
    assert "simulator + interference term: median |error| " in table
    assert "lone latency" not in table  # a report from before the queued model has no such line


@pytest.mark.timeout(10)
@pytest.mark.parametrize("key", ["lone_latency_step_time_s", "profile_compute_step_time_s", "muted_compute_step_time_s",
                                 "plain_compute_step_time_s"])
def test_alternative_predictions_are_scored_on_the_same_measurements(key):
    report, records, info = _report_with(interference_step_time_s=[1.15, 0.6, 2.2, 1.0], **{key: [1.2, 0.66, 2.2, 1.1]})
    alt = alternative_records(report, f"predicted_{key}")
    assert [r.predicted_step_time_s for r in alt] == [1.2, 0.66, 2.2, 1.1]
    assert [r.measured_step_times_s for r in alt] == [r.measured_step_times_s for r in records]
    if key == "lone_latency_step_time_s":
        assert [r.predicted_step_time_s for r in lone_latency_records(report)] == [1.2, 0.66, 2.2, 1.1]
    label = ALTERNATIVES[f"predicted_{key}"]
    assert f"simulator + interference term, {label}: median |error| " in markdown_table(report)
    # a calibration without that part predicts the same: no second, identical line
    for d in info["details"]:
        d[f"predicted_{key}"] = d["predicted_interference_step_time_s"]
    assert alternative_records(report, f"predicted_{key}") is None and label not in markdown_table(report)


@pytest.mark.timeout(10)
def test_records_from_raw_refuses_a_plan_that_was_not_simulated():
    group = _group()
    with pytest.raises(CaramelError, match="not the simulated"):
        records_from_raw(group, Calibration(2, 1e-4, 0.9, "given"), _raw(group, ("a", "x", "c", "d")), 5.0)


@pytest.mark.timeout(10)
def test_make_job_carries_the_calibration_not_a_refit():
    job = make_job(_group(), QUICK_SETTINGS, Calibration(2, 2e-4, 0.8, "given", queued_latency_s=5e-5), "/tmp/x")
    assert job["format"] == format_tag("validation_job")
    assert job["calibration"] == {"latency_s": 2e-4, "goodput": 0.8, "compute_slowdown": 1.0, "comm_slowdown": 1.0,
                                  "queued_latency_s": 5e-5}
    assert [c["bandwidth_bps"] for c in job["configs"]] == [1e8, 1e8, 1e9, 1e9]
    assert [c["name"] for c in job["configs"]][:2] == ["fifo/backward", "caramel/forward"]


@pytest.mark.timeout(10)
def test_bandwidth_handshake(tmp_path):
    seen = []
    with _BandwidthServer(str(tmp_path), seen.append):
        for k, bps in enumerate([5e7, 1e9]):
            request_path(tmp_path, k).write_text(f"{bps:g}\n")
            deadline = time.monotonic() + 5
            while not done_path(tmp_path, k).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert done_path(tmp_path, k).exists()
    assert seen == [5e7, 1e9]


@pytest.mark.timeout(10)
def test_cli_rejects_half_a_calibration(tmp_path):
    assert main(["--quick", "--network", "loopback", "--latency", "1e-4", "--json", str(tmp_path / "v.json")]) == 2
    assert not (tmp_path / "v.json").exists()
    assert main(["--quick", "--network", "loopback"]) == 2  # a run needs --json


@pytest.mark.timeout(10)
def test_cli_latency_takes_its_unit(tmp_path, capsys, monkeypatch):
    """--latency is read as the CLI's latencies are (caramel.units.parse_duration_arg_s): a bare
    1e-4 is refused, not taken as seconds; 100us is the calibration's alpha in seconds."""
    import experiments.validation.run as run
    out = str(tmp_path / "v.json")
    for latency, goodput, needle in (("1e-4", "0.9", "--latency '1e-4' has no unit"),
                                     ("-1ms", "0.9", "--latency '-1ms' is negative"),
                                     ("100us", "0", "--goodput must be a positive factor, got 0")):
        assert main(["--quick", "--network", "loopback", f"--latency={latency}", "--goodput", goodput,
                     "--json", out]) == 2
        assert needle in capsys.readouterr().err
    seen = {}

    def fake_run(groups, settings, network, cals, checkpoint):
        seen.update(cals)
        raise CaramelError("stopped before running")

    monkeypatch.setattr(run, "run_validation", fake_run)
    assert main(["--quick", "--network", "loopback", "--latency", "100us", "--goodput", "0.9", "--json", out]) == 2
    assert seen and all(c.latency_s == pytest.approx(1e-4) and c.goodput == 0.9 for c in seen.values())


@pytest.mark.timeout(10)
def test_compare_runs_and_saved_tables(tmp_path, capsys):
    group = _group()
    cal = Calibration(2, 1e-4, 0.9, "given")
    a, info_a = records_from_raw(group, cal, _raw(group), 5.0)
    raw_b = _raw(group)
    raw_b["measured"][1] = [{"times": {"2": [[3.0] * 3] * 2, "3": [[1.0] * 3] * 2}, "stats": {}}] * 2
    b, info_b = records_from_raw(group, cal, raw_b, 5.0)
    cmp = compare_runs(ValidationReport(a, {"jobs": [info_a]}), ValidationReport(b, {"jobs": [info_b]}))
    assert cmp["configurations"] == 4
    assert [round(x["measured_diff"], 9) for x in cmp["rows"]] == [0.0, 0.0, 0.4, 0.0]  # |2-3| / 2.5
    assert cmp["median_measured_diff"] == 0.0 and cmp["median_predicted_diff"] == 0.0
    # run a's measured medians as run b's predictions: one configuration off by |2 - 3| / 3
    assert cmp["a_measured_predicts_b"]["median_abs_error"] == 0.0
    assert cmp["a_measured_predicts_b"]["p90_abs_error"] == pytest.approx(0.7 * (1 / 3))
    assert cmp["b_measured_predicts_a"]["p90_abs_error"] == pytest.approx(0.7 * (1 / 2))  # |3 - 2| / 2
    ValidationReport(a, {"jobs": [info_a]}).save(tmp_path / "a.json")
    ValidationReport(b, {"jobs": [info_b]}).save(tmp_path / "b.json")
    assert main(["--table", str(tmp_path / "a.json"), "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "| fifo/backward | 1100.0 |" in out and "| 40.0% |" in out
    assert "run 1's measured medians as the predictions of run 2: median |error| 0.0%, p90 23.3%" in out


def _run_of(measured: dict[str, float], latency_s: float = 1e-4) -> ValidationReport:
    """A saved run: one setting, one record per strategy, every step at its measured time, the
    simulator's prediction 1.0 s for fifo, 1.5 s for fusion and 2.0 s for caramel."""
    records = [ValidationRecord(ValidationConfig("mlp", 2, 1e8, latency_s, planner, "backward"),
                                {"fifo": 1.0, "fusion": 1.5, "caramel": 2.0}[planner], [t] * 4, [t, t])
               for planner, t in measured.items()]
    return ValidationReport(records, {"jobs": [{"details": [{} for _ in records]}]})


@pytest.mark.timeout(10)
def test_consensus_floor_scores_each_run_against_the_others_median(tmp_path, capsys):
    runs = {f"run-{k}": _run_of({"fifo": f, "caramel": 2.0}, latency_s=1e-4 * (k + 1))  # each run calibrates afresh
            for k, f in enumerate([1.0, 1.1, 1.0, 1.2, 1.0])}
    floor = consensus_floor(runs)
    # run-0: the others measured fifo at 1.1, 1.0, 1.2, 1.0 -> 1.05, 5% above its 1.0; caramel exact
    con = floor["run-0"]["consensus"]
    assert con["configurations"] == 2 and con["median_abs_error"] == pytest.approx(0.025)
    assert con["p90_abs_error"] == pytest.approx(0.9 * 0.05)
    # run-3 measured fifo at 1.2 against the others' 1.0: 1/6 off, a miss of the p90 target
    assert floor["run-3"]["consensus"]["p90_abs_error"] == pytest.approx(0.9 * (1.2 - 1.0) / 1.2)
    assert not floor["run-3"]["consensus"]["targets_met"]["p90_abs_error"]
    # the simulator's side is the headline score of the same measurements
    assert floor["run-3"]["simulator"] == score(interference_records(runs["run-3"]))
    # a configuration fewer than 3 other runs measured is left out
    extra = _run_of({"fifo": 1.0, "caramel": 2.0, "fusion": 1.5})
    assert consensus_as_prediction(extra, list(runs.values()))["configurations"] == 2
    with pytest.raises(CaramelError, match="at least 3 other runs"):
        consensus_as_prediction(_run_of({"fusion": 1.5}), list(runs.values()))
    with pytest.raises(CaramelError, match="at least 4 runs"):
        consensus_floor(dict(list(runs.items())[:3]))
    table = floor_table(floor)
    assert "| run-3 |" in table and "by the other runs' consensus" in table
    for name, rep in runs.items():
        rep.save(tmp_path / f"{name}.json")
    assert main(["--floor", *(str(tmp_path / f"{n}.json") for n in runs)]) == 0
    assert "| run-0 | 0.0% / 0.0% / 100% (all three met) | 2.5% / 4.5% / 100% (all three met) | 2 |" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_loopback_smoke_two_configurations():
    """Two real configurations, 2 workers on loopback: predicted before measured, the engine ran the simulated plan."""
    cal = {2: Calibration(2, 1e-4, 0.9, "given")}
    report = run_validation(QUICK_GROUPS, QUICK_SETTINGS, network="loopback", calibrations=cal, log=sys.stderr)
    assert len(report.records) == 2
    assert [r.config.strategy() for r in report.records] == ["fifo/backward", "caramel/forward"]
    steps = QUICK_SETTINGS.rounds * QUICK_SETTINGS.steps_per_round
    for r in report.records:
        assert r.predicted_step_time_s > 0
        assert len(r.measured_step_times_s) == steps and min(r.measured_step_times_s) > 0
        assert len(r.repeat_medians_s) == QUICK_SETTINGS.rounds
    (job,) = report.meta["jobs"]
    assert job["predicted_at"] < job["measure_started_at"]
    assert all(d["plan_matches"] and d["engine_plan_fingerprint"] == d["plan_fingerprint"] for d in job["details"])
    assert "2 configurations" in report.markdown()


@pytest.mark.timeout(10)
def test_slowdown_factor_counts_each_repetitions_slowest_rank_then_the_median():
    from experiments.validation.calibrate import slowdown_factor

    # ranks slow in turn (rep 0: rank 0, rep 1: rank 1, ...): every repetition's slowest rank
    # counts, where each rank's own median would see one slow repetition in three
    assert slowdown_factor([[2.0, 1.0, 1.0], [1.0, 2.2, 1.8]]) == pytest.approx(2.0)
    # one outlier repetition does not move it (a mean of the two highest would be 3.3)
    assert slowdown_factor([[5.5, 1.2, 1.1, 1.3, 1.25]]) == pytest.approx(1.25)
    # never below 1: compute measured faster beside the transfers is noise
    assert slowdown_factor([[0.7, 0.9, 0.95], [0.8, 0.85, 0.99]]) == 1.0
