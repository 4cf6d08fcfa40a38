"""`caramel tune` end to end on a small synthetic model: a sweep, three methods, a plan file that loads."""
import json

import pytest

from caramel.cli import main
from caramel.plan.plan import Plan


def test_tune_writes_a_loadable_plan_and_every_trial(tmp_path, capsys):
    pytest.importorskip("optuna")
    out, plan = tmp_path / "tune.json", tmp_path / "best.plan.json"
    rc = main(["tune", "--synthetic", "chain12", "--workers", "4", "--bandwidth", "1gbit", "--budget", "3",
               "--seeds", "2", "--knob", "bucket_cap_mb=log:1|4|16", "--knob", "overlap=forward|backward",
               "--plan-out", str(plan), "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["format"] == "caramel.tune/1" and len(report["sweep"]) == 6
    assert {m: len(r) for m, r in report["runs"].items()} == {"model": 2, "random": 2, "tpe": 2}
    assert all(len(r["trials"]) == 3 for runs in report["runs"].values() for r in runs)
    best = min(t["measured_s"] for runs in report["runs"].values() for r in runs for t in r["trials"])
    assert best >= min(s["measured_s"] for s in report["sweep"]) - 1e-12
    assert Plan.load(plan).planner == "fifo"


def test_bad_knob_and_method_are_named(capsys):
    assert main(["tune", "--synthetic", "chain4", "--knob", "bucket_cap_mb"]) == 2
    assert "NAME=a|b|c" in capsys.readouterr().err
    assert main(["tune", "--synthetic", "chain4", "--methods", "grid"]) == 2
    assert "'grid' is not a method" in capsys.readouterr().err


def test_simulate_reports_the_data_bound_step(capsys):
    assert main(["simulate", "--synthetic", "chain8", "--workers", "4", "--planner", "fifo",
                 "--data-sample-bytes", "1mb", "--data-batch", "64", "--data-bandwidth", "1gbit"]) == 0
    text = capsys.readouterr().out
    assert "bottleneck: data" in text  # 4 x 64 MB over 1 gbit/s: about 2 s per step of loading


def test_simulate_counts_the_cache_tiers(capsys):
    base = ["simulate", "--synthetic", "chain8", "--workers", "2", "--planner", "fifo", "--data-sample-bytes", "16kb",
            "--data-batch", "8", "--data-hit-rate", "1", "--data-local-per-sample", "20us", "--data-loader-workers", "1"]
    assert main(base + ["--data-memory-hit-rate", "1"]) == 0
    memory = capsys.readouterr().out
    assert "0.16 ms of loading per step" in memory  # 8 decodes of 20 us, nothing from disk or the store
    assert main(base + ["--data-memory-hit-rate", "0.75", "--data-disk-per-read", "1ms"]) == 0
    assert "2.16 ms of loading per step" in capsys.readouterr().out  # 2 of the 8 samples' shards read from disk
    assert main(base + ["--data-memory-hit-rate", "0.5", "--data-hit-rate", "0.25"]) == 2
    assert "memory_hit_rate" in capsys.readouterr().err
    assert main(base + ["--data-memory-hit-rate", "1", "--data-contention", "0.5"]) == 2
    assert "contention must be >= 1" in capsys.readouterr().err


def test_simulate_takes_the_measured_contention_and_misses_last(capsys, tmp_path):
    import json

    base = ["simulate", "--synthetic", "chain8", "--workers", "2", "--planner", "fifo", "--data-sample-bytes", "16kb",
            "--data-batch", "8", "--data-hit-rate", "0.5", "--data-request-bytes", "256kb", "--data-latency", "0",
            "--data-bandwidth", "15mbit"]
    steps = {}
    for name, extra in {"plain": [], "contended": ["--data-contention", "2"], "last": ["--data-misses-last"]}.items():
        assert main(base + extra + ["--json", str(tmp_path / f"{name}.json")]) == 0
        rec = json.loads((tmp_path / f"{name}.json").read_text())["records"][0]
        steps[name] = (rec["step_time_s"], rec["step_time_with_data_s"], rec["data_time_s"])
    compute, plain, data = steps["plain"]
    assert data < compute < 2 * data and plain == compute  # 2 x 64 KB per step over 15 mbit/s hides behind the compute
    assert steps["contended"][1] == pytest.approx(2 * compute)  # the compute side, twice as long
    # half the steps carry all the misses (twice the link time, more than the compute) and half none
    assert steps["last"][1] == pytest.approx(2 * data / 2 + compute / 2) and steps["last"][1] > plain


def test_simulate_charges_the_read_under_load(capsys, tmp_path):
    import json

    # 2 ranks x 8 range reads of 16 kB, 2 ms latency, 2 loader workers each (4 requests in flight)
    base = ["simulate", "--synthetic", "chain8", "--workers", "2", "--planner", "fifo", "--data-sample-bytes", "16kb",
            "--data-batch", "8", "--data-latency", "2ms", "--data-loader-workers", "2"]

    def record(*extra):
        out = tmp_path / "sim.json"
        assert main(base + list(extra) + ["--json", str(out)]) == 0
        return json.loads(out.read_text())["records"][0]

    extra = {}
    for rate, link_s in (("100mbit", 2 * 8 * 16e3 * 8 / 100e6), ("1gbit", 2 * 8 * 16e3 * 8 / 1e9)):
        plain, zero, loaded = record("--data-bandwidth", rate), record("--data-bandwidth", rate, "--data-read-under-load",
                                                                        "0"), record("--data-bandwidth", rate,
                                                                                     "--data-read-under-load", "1.5ms")
        assert plain == zero and plain["data"]["worker_request_s"] == 0.0  # omitted: the model without the term
        assert plain["data_time_s"] >= link_s - 1e-12  # never faster than the link
        assert loaded["data"]["worker_request_s"] == pytest.approx(1.5e-3)
        assert loaded["data_time_s"] > plain["data_time_s"]
        extra[rate] = loaded["data_time_s"] - plain["data_time_s"]
    # each worker reads 8 samples one after another (the closed loop, docs/data.md): at 1 gbit/s the link
    # (2 ms) is idle most of the time and the term enters nearly whole, 8 reads x 1.5 ms over 2 workers;
    # at 100 mbit/s the 4 workers' sequences (8 reads x 3.5 ms / 2 = 14 ms) keep the 20.5 ms link full but
    # for its queue, and the link hides most of it
    assert extra["1gbit"] == pytest.approx(6e-3, rel=0.05)
    assert extra["100mbit"] < extra["1gbit"] / 2
    assert "+ 1.5 ms a read under load" in capsys.readouterr().out
    for bad, why in (("1.2", "has no unit"), ("-1ms", "--data-read-under-load"), ("nan", "--data-read-under-load"),
                     ("1e999ms", "--data-read-under-load"), ("fast", "--data-read-under-load")):
        assert main(base + [f"--data-read-under-load={bad}"]) == 2
        err = capsys.readouterr().err
        assert "--data-read-under-load" in err and why in err
