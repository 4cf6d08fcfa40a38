"""`caramel tune --measure real` end to end on loopback: two caramel option sets measured as real
steps in one bench job on 2 workers, and every method charged the steps of what it asked for.

A tiny MLP and few steps; the job's own wall-clock limit (--timeout) stops it before pytest's.
"""
import json

import pytest

from caramel.cli import main

pytestmark = pytest.mark.timeout(200)
ROUNDS, STEPS, WARMUP = 2, 2, 1


def test_candidates_are_measured_in_one_bench_job_and_charged_in_steps(tmp_path, capsys):
    out, plan = tmp_path / "tune.json", tmp_path / "best.plan.json"
    rc = main(["tune", "--measure", "real", "--model", "mlp", "--model-option", "width=64", "--model-option", "depth=3",
               "--batch-size", "8", "--workers", "2", "--network", "loopback",
               "--knob", "bucket_cap_mb=0.005|1", "--knob", "overlap=backward",
               "--methods", "model,random", "--budget", "1", "--seeds", "2",  # TPE's charging: test_ledger
               "--rounds", str(ROUNDS), "--steps", str(STEPS), "--warmup", str(WARMUP),
               "--timeout", "150", "--json", str(out), "--plan-out", str(plan)])
    captured = capsys.readouterr()
    assert rc == 0, (captured.out + captured.err)[-3000:]
    report = json.loads(out.read_text())
    assert report["format"] == "caramel.tune/1" and report["measure"] == "real"
    assert report["command"].startswith("caramel tune --measure real --network loopback --workers 2 --model mlp")
    assert "--knob 'bucket_cap_mb=0.005|1'" in report["command"]
    records = {r["strategy"]: r for r in report["bench"]["records"]}
    # the reference and both candidates ran in the same job, as caramel strategies with the planner's options
    assert set(records) == {"ddp", "caramel:bucket_cap_mb=0.005,overlap=backward,planner=fifo",
                            "caramel:bucket_cap_mb=1,overlap=backward,planner=fifo"}
    assert report["bench"]["network"] == "loopback" and report["bench"]["config"]["workers"] == 2
    sweep = {s["strategy"]: s for s in report["sweep"]}
    for name, s in sweep.items():
        rec = records[name]
        assert s["measured_s"] == rec["step_time_median_s"] > 0 and rec["steps"] == ROUNDS * STEPS
        # the engine's own count: warm-up, settling, and per round an entry step plus the measured ones
        assert s["steps"] >= WARMUP + ROUNDS * (STEPS + 1), s
        assert s["predicted_s"] > 0
    assert report["sweep_steps"] == sum(s["steps"] for s in sweep.values())
    by_config = {(s["config"]["bucket_cap_mb"], s["config"]["overlap"]): s for s in report["sweep"]}
    for method, runs in report["runs"].items():
        assert len(runs) == 2 and all(len(r["trials"]) == 1 for r in runs)
        for run, outcome in zip(runs, report["outcomes"][method]):
            trial = run["trials"][0]
            measured = by_config[(trial["config"]["bucket_cap_mb"], trial["config"]["overlap"])]
            assert trial["measured_s"] == measured["measured_s"] == outcome["best_s"]
            charged = measured["steps"] + (report["profile_steps"] if method == "model" else 0)
            assert outcome["steps_used"] == charged and outcome["measurements"] == 1
    best = min(s["measured_s"] for s in report["sweep"])
    assert "sweep best" in captured.out and f"{best * 1e3:.2f} ms" in captured.out
    assert plan.exists() and "--strategy caramel:" in captured.out


@pytest.mark.parametrize("args, names", [
    (["--knob", "nope=1|2"], "nope"), (["--synthetic", "chain4"], "--profile and --synthetic"),
    (["--ratio", "1", "--bandwidth", "1gbit"], "--ratio 1 and --bandwidth"),
    (["--model", "no_such_model"], "no_such_model"), (["--model-option", "width"], "--model-option"),
    (["--latency", "1ms"], "--latency describe(s) a simulated cluster")])
def test_bad_real_input_is_named_before_any_worker_starts(args, names, capsys):
    assert main(["tune", "--measure", "real", "--network", "loopback", *args]) == 2
    err = capsys.readouterr().err
    assert names in err, err


def test_simulated_needs_a_profile(capsys):
    assert main(["tune"]) == 2
    assert "--profile P.json or --synthetic NAME" in capsys.readouterr().err
    assert main(["tune", "--synthetic", "chain4", "--ratio", "1"]) == 2
    assert "--ratio: for --measure real only" in capsys.readouterr().err
