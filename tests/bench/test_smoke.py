"""A 2-worker bench on loopback, end to end: launcher, harness, strategies, baselines, reports.

Local workers (torchrun --standalone on 127.0.0.1 with a free port), a tiny model and few
steps; the job's own wall-clock limit (--timeout) stops it long before pytest's.
"""
import json
import pytest

from caramel.cli import main

pytestmark = pytest.mark.timeout(200)


def test_two_worker_smoke_bench_on_loopback(tmp_path, capsys):
    out, md, trace = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "trace"
    # --ratio: a compute-only calibration job runs first and the rate is derived from it (on
    # loopback it is not applied, but it is derived and reported all the same)
    rc = main(["bench", "--model", "tiny_gpt", "--workers", "2", "--network", "loopback", "--ratio", "1",
               "--strategies", "ddp,caramel,caramel:planner=fifo,overlap=backward,ddp:comm_priority=auto",
               "--rounds", "2", "--steps", "3", "--warmup", "1", "--timeout", "100",
               "--json", str(out), "--markdown", str(md), "--trace", str(trace)])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, (printed + captured.err)[-3000:]
    data = json.loads(out.read_text())
    assert data["format"] == "caramel.bench/3"
    recs = {r["strategy"]: r for r in data["records"]}
    assert set(recs) == {"ddp", "caramel", "caramel:overlap=backward,planner=fifo", "ddp:comm_priority=auto"}
    for r in recs.values():
        assert r["skipped"] is None, r["skipped"]
        assert r["workers"] == 2 and r["model"] == "tiny_gpt" and r["network"] == "loopback (unshaped)"
        assert r["steps"] == 6  # 2 rounds x 3 measured steps
        assert 0 < r["step_time_median_s"] <= r["step_time_p90_s"]
        assert r["compute_s"] > 0 and r["comm_s"] > 0 and r["concurrent_s"] > 0
        ref = recs[r["reference"]]
        assert r["reference"] in ("ddp", "ddp:comm_priority=auto")
        assert ref["step_time_median_s"] == min(recs["ddp"]["step_time_median_s"],
                                                recs["ddp:comm_priority=auto"]["step_time_median_s"])
        assert r["speedup"] == pytest.approx(ref["step_time_median_s"] / r["step_time_median_s"])
        assert r["target_ratio"] == 1.0 and r["rate_source"] == "derived" and r["calibrated_compute_s"] > 0
        assert r["bandwidth"] and r["intended_regime"] == "balanced"
    assert recs[recs["ddp"]["reference"]]["speedup"] == 1.0
    # every strategy's simulator prediction from the profile and the achieved rate, beside its median
    for r in recs.values():
        assert r["predicted_step_s"] > 0 and r["prediction_exact"] is True, r
        # the concurrent baseline's contention reached the record (1: no evidence on loopback's spare cores)
        assert 1.0 <= r["compute_slowdown"] <= 4.0, r
        assert r["prediction_error"] == pytest.approx(r["predicted_step_s"] / r["step_time_median_s"] - 1)
    assert "The simulator against the measurement" in md.read_text() and "Recommendation" in md.read_text()
    # the file replays a record's prediction: its inputs keyed by the records' label, its cluster named
    from caramel.bench.provenance import code_version
    from caramel.bench.report import config_label, read_records
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    back = read_records(out)
    assert back.meta["code"] == code_version()  # the checkout that ran it, for later replays
    assert set(back.meta["prediction_inputs"]) == {config_label(r) for r in back.records}
    r = next(r for r in back.records if r.strategy == "ddp")
    inputs = back.meta["prediction_inputs"][config_label(r)]
    assert r.prediction_cluster == "base" and set(inputs["clusters_rate_only"]) == {"base"}
    (p,) = predict(ModelProfile.from_dict(inputs["profile"]), ClusterSpec.from_dict(inputs["clusters"]["base"]), ["ddp"])
    assert p.step_time_s == pytest.approx(r.predicted_step_s)
    # the ps model's inputs were probed on the job's links (`caramel.bench.traffic_probe`)
    probe = recs["ddp"]["link_fit"]["traffic_probe"]
    assert probe["bulk_s"] > 0 and probe["all_to_all_s"] > 0 and probe["broadcasts_s"] > 0, probe
    from caramel.bench.traffic_probe import CURVE_BUDGET_S, MIN_CURVE_REPS, PATTERN_REPS, VERSION, curve_plan

    # from version 2: 1 and 2 servers receiving at once (2 is the all-to-all), each repetition kept
    assert probe["version"] == VERSION and len(probe["pushes_at_once_s"]) == 2, probe
    assert probe["pushes_at_once_s"][1] == probe["all_to_all_s"] and len(probe["broadcasts_reps_s"]) == PATTERN_REPS, probe
    # the job's net rate is the achieved rate wherever the comm-only baseline took time (the
    # fitted `net_bandwidth_bps` may be absent), so the curve is always there: a point per count
    assert len(recs["ddp"]["link_fit"]["push_efficiency_by_count"]) == 2, recs["ddp"]["link_fit"]
    # from version 4: 1 and 2 ranks broadcasting at once, and their curve; from version 5 both counts
    # in one sweep (2 its own reading, not the broadcasts'), within the curves' budget, the time kept
    # (the repetitions fit the budget at the all-at-once rounds' time, so they depend on the host's load)
    import statistics
    round_s = max(statistics.median(probe["pushes_at_once_reps_s"][-1]), statistics.median(probe["broadcasts_reps_s"]))
    assert [probe["curve_counts"], probe["curve_reps"]] == list(curve_plan(2, round_s)), (round_s, probe)
    assert probe["curve_counts"] == [1] and MIN_CURVE_REPS <= probe["curve_reps"] <= PATTERN_REPS, probe
    assert [len(t) for t in probe["broadcasts_at_once_reps_s"]] == [probe["curve_reps"]] * 2, probe
    assert probe["broadcasts_reps_s"] is not probe["broadcasts_at_once_reps_s"][1], probe
    assert probe["probe_s"] > probe["curve_s"] > 0 and probe["curve_budget_s"] == CURVE_BUDGET_S, probe
    assert len(recs["ddp"]["link_fit"]["pull_efficiency_by_count"]) == 2, recs["ddp"]["link_fit"]
    assert [s["strategy"] for s in data["summary"]] == ["caramel", "caramel:overlap=backward,planner=fifo"]
    assert "caramel:overlap=backward,planner=fifo" in printed and "Summary" in printed and "Target" not in printed
    assert "caramel bench --model tiny_gpt --workers 2 --ratio 1" in md.read_text()
    assert "target comm/compute 1 (balanced)" in md.read_text()
    # the engine wrote one timeline per caramel strategy and rank, and the report summarizes it;
    # rank 0 of each left the profile and cluster its plan was made from beside its timeline
    names = sorted(p.name for p in trace.rglob("*.json"))
    assert len([n for n in names if n.endswith((".rank0.json", ".rank1.json"))]) == 4, names
    assert len([n for n in names if n.endswith((".rank0.profile.json", ".rank0.cluster.json"))]) == 4, names
    assert len(names) == 9 and "prediction_inputs.json" in names, names
    # the predictions' inputs, saved beside them, give the same predictions when replayed
    from caramel.bench.prediction import job_predictions
    from caramel.profile.model_profile import ModelProfile

    (saved,) = (json.loads(p.read_text()) for p in trace.rglob("prediction_inputs.json"))
    # older saved inputs pair with their records by the directory's name (experiments/predict_saved_inputs.py)
    from caramel.bench.cli import trace_config_name
    (run_dir,) = trace.iterdir()
    assert run_dir.name == "00-" + trace_config_name(recs["ddp"]["model"], 2, recs["ddp"]["bandwidth"])
    again = job_predictions(ModelProfile.from_dict(saved["profile"]), list(recs), saved["world"], saved["grad_bytes"],
                            saved["comm_s"], saved["comm_buckets"], saved["rank_compute_s"], saved["spans"],
                            saved["probed"])["predicted"]
    assert {n: again[n]["step_time_s"] for n in recs} == pytest.approx({n: r["predicted_step_s"] for n, r in recs.items()})
    # and what the bench predicted with beyond them: the ps traffic probe, the names as predicted, the configuration
    assert saved["traffic"] == probe and saved["screened"] == {n: n for n in recs}
    from caramel.bench.record import Record, config_label
    fields = set(Record.__dataclass_fields__)
    assert saved["config"] == config_label(Record(**{k: v for k, v in recs["ddp"].items() if k in fields}))
    assert recs["caramel"]["timeline"]["compute_s"] > 0 and recs["ddp"]["timeline"] is None
    fifo = recs["caramel:overlap=backward,planner=fifo"]["plan"]
    assert fifo["planner"] == "fifo" and fifo["items"] >= 1 and recs["ddp"]["plan"] is None
    assert "timeline (mean per step)" in md.read_text()
    # the engine's communication threads, and those of DDP's own group when asked: the priority they got
    for name in ("caramel", "ddp:comm_priority=auto"):
        prio = recs[name]["comm_priority"]
        assert prio["mode"] == "auto" and prio["applied"] in ("realtime", "normal"), prio
        assert (prio["applied"] == "realtime") == (prio["reason"] is None) == (prio["threads"] > 0), prio
    assert recs["ddp"]["comm_priority"] is None
    # the comm-only and concurrent baselines ran at the priority the engine's threads get by default
    base = recs["ddp"]["baseline_priority"]
    assert base["mode"] == "auto" and base["applied"] == recs["caramel"]["comm_priority"]["applied"], base
    assert all(r["baseline_priority"] == base for r in recs.values())
    assert ("baselines' communication threads at real-time priority" in md.read_text()) == (base["applied"] == "realtime")


@pytest.mark.parametrize("args, names", [
    (["--strategies", "ddp,fast"], "fast"), (["--model", "nope"], "nope"), (["--bandwidth", "fast"], "fast"),
    (["--workers", "0"], "workers"), (["--model", "missing.py:f"], "missing.py"), (["--quick", "--workers", "2"], "--quick"),
    (["--network", "cluster", "--model", "tiny_gpt"], "--network cluster"), (["--mtu", "jumbo"], "jumbo"),
    (["--ratio", "0"], "--ratio 0"), (["--ratio", "-1", "--model", "tiny_gpt"], "--ratio -1"),
    (["--ratio", "inf"], "--ratio inf"), (["--ratio", "1", "--bandwidth", "1gbit"], "--ratio 1 and --bandwidth"),
    (["--ratio", "1", "--workers", "1"], "--ratio needs --workers"), (["--quick", "--ratio", "1"], "--quick")])
def test_bad_input_is_one_line_and_exit_2(args, names, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caramel bench: error:"), err
    assert names in err[0], err


def test_a_ratio_that_is_not_a_number_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--ratio", "fast"])
    assert e.value.code == 2 and "--ratio: invalid float value: 'fast'" in capsys.readouterr().err
